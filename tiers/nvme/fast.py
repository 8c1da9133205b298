"""The nvme tier's loads on the native engine: one C worker job per chunk, planned and booked
on the loop thread (:mod:`asynctier.engines.native_engine`).

Why: on the threads engine each slot read, its xxh3 and its bookkeeping run on a Python
thread holding the GIL, which an inference server's own threads then wait for
(docs/benchmarks-vllm-reads.md). Here a worker reads the slot's header block and payload
with one ``preadv`` at the slot's offset and hashes the payload; the loop thread pins the
slot before and compares the header after, both O(1).

Only the plain case runs here: every primary chunk can be read straight into (the tier's
``_zc_all``), the index lock is free, the read is whole and the header and checksum are the
ones indexed. Anything else (a bounce copy, a busy index, an error, a bad copy) is run again
by the threads path's own body on a slow-path thread, which reports it precisely and drops a
bad copy.
"""

from __future__ import annotations

import weakref
from functools import partial
from time import perf_counter
from typing import TYPE_CHECKING

from asynctier import ChunkNotFoundError, TierClosedError
from asynctier.core.jobs import Job
from asynctier.core.ops import PRIO_LOAD
from asynctier.engines import native as nativeio
from asynctier.engines.native_engine import Continuation, NativeEngine
from asynctier.integrity import pack_header
from asynctier.posix_io import aligned_buffer, buffer_address

from .slots import SlotIndex

if TYPE_CHECKING:
    from .tier import NvmeTier

__all__ = ["LoadPath"]


class LoadPath:
    """Loads of an nvme tier on its native engine (a :class:`~asynctier.engines.native_engine.FastPath`)."""

    def __init__(self, tier: NvmeTier, engine: NativeEngine) -> None:
        # the engine's workers hold the engine, and so this: not the tier (a tier dropped
        # without aclose() must be collected, its finalizer stops them)
        self._tier = weakref.ref(tier)
        self._engine = engine
        self._plans: list[tuple[int, int, int] | None] = [None] * engine.slots  # slot, seq, checksum
        self._booked: list[float] = []  # latencies of the loads ended, counted at the next flush
        self._unpins: list[int] = []  # slots to unpin once the index lock is free
        self._hb: memoryview | None = None  # one aligned header block per engine slot
        self._hb_addr = 0
        self._view_addr = 0

    def _live(self) -> NvmeTier:
        tier = self._tier()
        if tier is None:  # a call in progress holds its tier: only a bug gets here
            raise TierClosedError("the nvme tier was dropped")
        return tier

    def _on_thread(self, tier: NvmeTier, key: bytes, cid: int, t0: float) -> Continuation:
        return partial(self._engine.blocking, tier._load_job, key, cid, t0)

    def plan(self, job: Job, slot: int) -> nativeio.JobFields | Continuation | None:
        key, cid, t0 = job.args
        tier = self._live()
        cat, slabs = tier._catalog, tier._slabs
        if cat is None or not tier._zc_all:  # closed (the thread path says so), or bounce copies
            return self._on_thread(tier, key, cid, t0)
        lock = cat.index.lock
        # the lock is held across a checkpoint's snapshot and journal rotation: never waited
        # for on the loop thread
        if not lock.acquire(blocking=False):
            tier._stats.incr("native_index_busy")
            return self._on_thread(tier, key, cid, t0)
        try:
            self._unpin_locked(cat.index)
            where = cat.pin_locked(key)
        except ChunkNotFoundError as e:
            tier._end_load(key, t0, e)
            raise
        finally:
            lock.release()
        H = slabs.hdr_area
        if self._hb is None:
            self._hb = aligned_buffer(H * len(self._plans))
            self._hb_addr = buffer_address(self._hb)
            self._view_addr = buffer_address(tier._view)
        fd, off = slabs.locate(where[0])
        n = tier.offloading_spec.chunk_bytes
        self._plans[slot] = where
        # nativeio.fields written out (per chunk): a read of the slot's header block and payload at off
        return (nativeio.READ, PRIO_LOAD, -1, 0, fd, -1, 0, int(tier.verify), 0, 0, self._hb_addr + slot * H, H,
                self._view_addr + cid * n, n, off, b"", b"", b"")  # fmt: skip

    def finish(self, job: Job, slot: int, result: int, csum: int, stage: int, info: int) -> Continuation | None:
        key, cid, t0 = job.args
        where = self._plans[slot]
        assert where is not None
        self._plans[slot] = None
        tier = self._live()
        nslot, seq, want = where
        H, n = tier._slabs.hdr_area, tier.offloading_spec.chunk_bytes
        assert self._hb is not None
        head = pack_header(key, n, want, tier.offloading_spec.layout_digest, seq)  # header_matches written out
        at = slot * H
        ok = (
            not stage
            and result == H + n
            and (not tier.verify or csum == want)
            and self._hb[at : at + len(head)] == head
        )
        self._unpins.append(nslot)  # at the next flush: one lock for the batch of ends
        if not ok:  # read again on a thread, which tells what is wrong and drops a bad copy
            tier._stats.incr("native_retries")
            return self._on_thread(tier, key, cid, t0)
        self._booked.append(perf_counter() - t0)
        return None

    def _unpin_locked(self, index: SlotIndex) -> None:
        unpins = self._unpins
        if unpins:
            self._unpins = []
            for s in unpins:
                index.unpin(s)

    def flush(self) -> None:
        """Count the loads ended since the last flush and unpin their slots (on a slow-path
        thread if the index lock is busy)."""
        tier = self._tier()
        if tier is None:
            return
        booked = self._booked
        if booked:
            self._booked = []
            tier._stats.record_each("load", tier.offloading_spec.chunk_bytes, booked)
        cat, unpins = tier._catalog, self._unpins
        if unpins and cat is not None:
            if cat.index.lock.acquire(blocking=False):
                try:
                    self._unpin_locked(cat.index)
                finally:
                    cat.index.lock.release()
            elif self._engine.executor is not None:
                self._unpins = []
                self._engine.executor.submit(cat.unpin, unpins)
