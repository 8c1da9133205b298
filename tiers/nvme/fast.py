"""The nvme tier's loads on the native engine: one C worker job per chunk, planned and booked
on the loop thread (:mod:`asynctier.engines.native_engine`).

Why: on the threads engine each slot read, its xxh3 and its bookkeeping run on a Python
thread holding the GIL, which an inference server's own threads then wait for
(docs/benchmarks-vllm-reads.md). Here a worker reads the slot's header block and payload
with one ``preadv`` at the slot's offset and hashes the payload; the loop thread pins the
slot before and compares the header after, both O(1).

Only the plain case runs here: every primary chunk can be read straight into (the tier's
``_zc_all``), the read is whole and the header and checksum are the ones indexed. A load that
finds the index lock busy (a checkpoint's snapshot) waits for its release parked
(:mod:`.lockwait`). Anything else (a bounce copy, an error, a bad copy) is run again by the
threads path's own body on a slow-path thread, which reports it precisely and drops a bad copy.
"""

from __future__ import annotations

import ctypes
import weakref
from functools import partial
from time import perf_counter
from types import ModuleType
from typing import TYPE_CHECKING, Any

from asynctier import ChunkNotFoundError, TierClosedError
from asynctier.core.jobs import Job, Outcomes
from asynctier.core.ops import PRIO_LOAD
from asynctier.engines import native as nativeio
from asynctier.engines.fastpath import Continuation, Step
from asynctier.engines.native_engine import NativeEngine
from asynctier.engines.speedups import speedups
from asynctier.errors import Withdrawn
from asynctier.integrity import header_matches as _py_header_matches
from asynctier.posix_io import aligned_buffer, buffer_address

from . import bulk as _py_bulk
from .groups import RUNS_A_TURN
from .lockwait import LockWaiters

if TYPE_CHECKING:
    from .catalog import Catalog
    from .tier import NvmeTier

__all__ = ["IoArea", "LoadPath"]

# a read's header check, per chunk on the loop's thread, and a group's runs packed and checked
# in one call each: the C twins where built
_fast = speedups()
header_matches = _py_header_matches if _fast is None else _fast.header_matches
_ops: ModuleType = _py_bulk if _fast is None else _fast


class _Group:
    """A group job's state: the slots pinned (position -> slot, seq, checksum), its outcomes,
    its runs of adjacent slots, the next to read and how many are in flight, the positions to
    read again."""

    __slots__ = ("bad", "batch", "found", "next", "outcomes", "runs")

    def __init__(self, found: dict[int, tuple[int, int, int]], outcomes: Outcomes, runs: list[list[Any]]) -> None:
        self.found = found
        self.outcomes = outcomes
        self.runs = runs
        self.next = 0
        self.batch = 1
        self.bad: list[int] = []


def _withdrawn_runs(
    pool: nativeio.NativePool, slot: int, runs: list[_py_bulk.Run], own: tuple[int, int, int, int]
) -> int:
    """Chunks of the runs that ended in ``slot`` that the workers took back (its call cancelled)."""
    if own[2]:
        return 0
    res, offset = pool.sub_outcomes(slot)
    at, size = nativeio.RESULT_LAYOUT.unpack_from, nativeio.RESULT_LAYOUT.size
    return sum(len(r) for j, r in enumerate(runs) if at(res, offset + j * size)[2] == nativeio.ST_WITHDRAWN)


class IoArea:
    """One engine slot's memory for READV and WRITEV jobs of up to ``slots`` slots: aligned
    header blocks, the iovecs the workers read into (write from), the payloads' checksums."""

    def __init__(self, slots: int, header: int) -> None:
        self.slots = slots
        self.hb = aligned_buffer(slots * header)
        self.hb_addr = buffer_address(self.hb)
        self.iov = (ctypes.c_uint64 * (4 * slots))()  # (base, length) of header block, then payload
        self.iov_addr = ctypes.addressof(self.iov)
        self.sums = (ctypes.c_uint64 * slots)()
        self.sums_addr = ctypes.addressof(self.sums)


class LoadPath:
    """Loads of an nvme tier on its native engine (a :class:`~asynctier.engines.fastpath.FastPath`)."""

    def __init__(self, tier: NvmeTier, engine: NativeEngine) -> None:
        # the engine's workers hold the engine, and so this: not the tier (a tier dropped
        # without aclose() must be collected, its finalizer stops them)
        self._tier = weakref.ref(tier)
        self._engine = engine
        self._plans: list[tuple[int, int, int] | None] = [None] * engine.slots  # slot, seq, checksum
        self._booked: list[float] = []  # latencies of the loads ended, counted at the next flush
        self._unpins: list[int] = []  # slots to unpin once the index lock is free
        self._lock_waiters = LockWaiters(engine, self._lock_freed)
        self._hb: memoryview | None = None  # one aligned header block per engine slot
        self._hb_addr = 0
        self._view_addr = 0
        self._groups: dict[int, _Group] = {}  # by engine slot: the group job running in it
        self._areas: dict[int, IoArea] = {}  # by engine slot: its header blocks, iovecs, checksums

    def _live(self) -> NvmeTier:
        tier = self._tier()
        if tier is None:  # a call in progress holds its tier: only a bug gets here
            raise TierClosedError("the nvme tier was dropped")
        return tier

    def _lock_freed(self, slot: int, job: Job, _: object) -> Step:
        """A job parked for the index lock, again: planned (:class:`.lockwait.LockWaiters`
        withdraws it if its call was cancelled)."""
        return self.plan(job, slot)

    def _on_thread(self, tier: NvmeTier, key: bytes, cid: int, t0: float) -> Continuation:
        return partial(self._engine.blocking, tier._load_job, key, cid, t0)

    def plan(self, job: Job, slot: int) -> Step:
        if job.grouped:
            return self._plan_group(job, slot)
        key, cid, t0 = job.args
        tier = self._live()
        cat, slabs = tier._catalog, tier._slabs
        if cat is None or not tier._zc_all:  # closed (the thread path says so), or bounce copies
            return self._on_thread(tier, key, cid, t0)
        lock = cat.index.lock
        # the lock is held across a checkpoint's snapshot (and its journal records taken): never waited
        # for on the loop thread
        if not lock.acquire(blocking=False):
            tier._stats.incr("native_index_busy")
            return self._lock_waiters.park(lock, slot, job)
        try:
            self._unpin_locked(cat)
            where = cat.pin_locked(key)
        except ChunkNotFoundError as e:
            tier._end_load(key, t0, e)
            raise
        finally:
            lock.release_quiet()
        H = slabs.hdr_area
        try:
            if self._hb is None:
                self._bind(tier)
            fd, off = slabs.locate(where[0])
        except BaseException:  # never leave a slot pinned
            self._unpins.append(where[0])
            raise
        n = tier.offloading_spec.chunk_bytes
        self._plans[slot] = where
        # nativeio.fields written out (per chunk): a read of the slot's header block and payload at off
        return (nativeio.READ, PRIO_LOAD, -1, 0, fd, -1, 0, int(tier.verify), 0, 0, self._hb_addr + slot * H, H,
                self._view_addr + cid * n, n, off, b"", b"", b"")  # fmt: skip

    def finish(
        self, job: Job, slot: int, result: int, csum: int, stage: int, info: int
    ) -> nativeio.JobFields | Continuation | None:
        if job.grouped:
            return self._finish_run(job, slot, (result, csum, stage, info))
        key, cid, t0 = job.args
        where = self._plans[slot]
        assert where is not None
        self._plans[slot] = None
        tier = self._live()
        nslot, seq, want = where
        H, n = tier._slabs.hdr_area, tier.offloading_spec.chunk_bytes
        assert self._hb is not None
        ok = (
            not stage
            and result == H + n
            and (not tier.verify or csum == want)
            and header_matches(self._hb[slot * H :], key, n, want, tier.offloading_spec.layout_digest, seq)
        )
        self._unpins.append(nslot)  # at the next flush: one lock for the batch of ends
        if not ok and job.batch.cancelled:  # not read again: its call is cancelled
            raise Withdrawn()
        if not ok:  # read again on a thread, which tells what is wrong and drops a bad copy
            tier._stats.incr("native_retries")
            return self._on_thread(tier, key, cid, t0)
        self._booked.append(perf_counter() - t0)
        return None

    # -- group jobs: runs of adjacent slots, one READV each, in one GROUP job (RUNS_A_TURN a turn) --
    def _plan_group(self, job: Job, slot: int) -> Step:
        keys, cids, t0 = job.args
        tier = self._live()
        cat = tier._catalog
        if cat is None or not tier._zc_all:
            return partial(self._engine.blocking, tier._load_group, keys, cids, t0)
        lock = cat.index.lock
        if not lock.acquire(blocking=False):  # as for one chunk: never waited for here
            tier._stats.incr("native_index_busy", len(keys))
            return self._lock_waiters.park(lock, slot, job)
        try:
            self._unpin_locked(cat)
            found, missing = cat.pin_many_locked(keys)
        finally:
            lock.release_quiet()
        outcomes: Outcomes = [None] * len(keys)
        for p, e in missing.items():
            outcomes[p] = e
            tier._end_load(keys[p], t0, e)
        if not found:
            job.result = outcomes
            return None
        try:
            runs = tier._slabs.runs(found, tier._run_limit)
            self._groups[slot] = _Group(found, outcomes, runs)
            return self._run_fields(tier, slot, job, self._groups[slot])
        except BaseException:  # never leave a slot pinned
            self._groups.pop(slot, None)
            self._unpins += [where[0] for where in found.values()]
            raise

    def _run_fields(self, tier: NvmeTier, slot: int, job: Job, g: _Group) -> nativeio.JobFields:
        """The descriptor of ``g``'s next runs: one GROUP job of up to ``RUNS_A_TURN`` READV jobs,
        one a run (slots that lie apart cost one round trip through the loop, not one a run),
        their iovecs and checksums in ``slot``'s arrays, each run at its own place
        (:func:`.bulk.pack_slot_reads`)."""
        slabs = tier._slabs
        runs = g.runs[g.next : g.next + RUNS_A_TURN]
        g.batch = len(runs)
        need = sum(map(len, runs))
        if self._hb is None:
            self._bind(tier)
        area = self._areas.get(slot)
        if area is None or area.slots < need:
            area = self._areas[slot] = IoArea(need, slabs.hdr_area)
        pool = self._engine.pool
        assert pool is not None  # planning runs on a started engine
        table, offset = pool.sub_jobs(slot)
        _ops.pack_slot_reads(table, offset, PRIO_LOAD, runs, job.args[1], slabs.fds, area.hb_addr, slabs.hdr_area,
                             area.iov, area.iov_addr, area.sums_addr, self._view_addr,
                             tier.offloading_spec.chunk_bytes, int(tier.verify))  # fmt: skip
        return pool.packed_group(slot, PRIO_LOAD, len(runs))

    def _finish_run(
        self, job: Job, slot: int, own: tuple[int, int, int, int]
    ) -> nativeio.JobFields | Continuation | None:
        """Check each slot of the runs that ended (:func:`.bulk.runs_loaded`); the group's
        next runs, or its end."""
        keys, cids, t0 = job.args
        tier = self._live()
        g = self._groups[slot]
        k, pool = g.batch, self._engine.pool
        assert pool is not None
        runs = g.runs[g.next : g.next + k]
        if own[2]:  # the group was refused whole (never ran): each of its chunks is read again
            for run in runs:
                g.bad += [p for p, _, _, _ in run]
                self._unpins += [nslot for _, nslot, _, _ in run]
            good = 0
        else:
            res, offset = pool.sub_outcomes(slot)
            area, spec = self._areas[slot], tier.offloading_spec
            bad: list[int] = []
            unpins: list[int] = []
            try:
                good = _ops.runs_loaded(res, offset, runs, keys, g.found, area.hb, tier._slabs.hdr_area, area.sums,
                                        spec.chunk_bytes, spec.layout_digest, tier.verify, bad, unpins)  # fmt: skip
            except BaseException:
                self._drop(slot, g)  # the group fails whole (its chunks with this error)
                raise
            g.bad += bad
            self._unpins += unpins
        self._booked += [perf_counter() - t0] * good
        g.next += k
        if job.batch.cancelled:  # no next runs, no reads again: the chunks not read are withdrawn
            self._engine.withdrawn += sum(map(len, g.runs[g.next :])) + _withdrawn_runs(pool, slot, runs, own)
            for p in g.bad + [p for run in g.runs[g.next :] for p, _, _, _ in run]:
                g.outcomes[p] = Withdrawn()
            self._drop(slot, g)
            job.result = g.outcomes
            return None
        if g.next < len(g.runs):
            try:
                return self._run_fields(tier, slot, job, g)
            except BaseException:
                self._drop(slot, g)
                raise
        del self._groups[slot]
        if not g.bad:
            job.result = g.outcomes
            return None
        tier._stats.incr("native_retries", len(g.bad))
        return partial(self._again, tier, keys, cids, t0, g)

    # -- a step taken back from the workers (its call cancelled): nothing was read --------------
    def withdrawable(self, job: Job, slot: int) -> bool:
        return True

    def withdraw(self, job: Job, slot: int) -> None:
        if not job.grouped:
            where, self._plans[slot] = self._plans[slot], None
            if where is not None:
                self._unpins.append(where[0])
                self._engine.withdrawn += 1
        elif slot in self._groups:
            g = self._groups[slot]
            self._engine.withdrawn += sum(map(len, g.runs[g.next :]))
            self._drop(slot, g)

    def _drop(self, slot: int, g: _Group) -> None:
        """A group that ends failed midway (an exception on the loop thread, memory only): its
        slots not yet checked are unpinned at the next flush, as the checked ones are; never
        left pinned."""
        del self._groups[slot]
        self._unpins += [nslot for run in g.runs[g.next :] for _, nslot, _, _ in run]

    async def _again(self, tier: NvmeTier, keys: list[bytes], cids: list[int], t0: float, g: _Group) -> Outcomes:
        """The slots that did not simply check out, read again by the threads path's group body
        (it reports each precisely and drops a bad copy); the group's outcomes."""
        bad = g.bad
        try:
            again = await self._engine.blocking(tier._load_group, [keys[p] for p in bad], [cids[p] for p in bad], t0)
        except Exception as e:  # those only: the others are loaded
            again = [e] * len(bad)
        for p, outcome in zip(bad, again):
            g.outcomes[p] = outcome
        return g.outcomes

    def _bind(self, tier: NvmeTier) -> None:
        self._hb = aligned_buffer(tier._slabs.hdr_area * len(self._plans))
        self._hb_addr = buffer_address(self._hb)
        self._view_addr = buffer_address(tier._view)

    def _unpin_locked(self, cat: Catalog) -> None:
        unpins = self._unpins
        if unpins:
            self._unpins = []
            cat.unpin_locked(unpins)

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
                    self._unpin_locked(cat)
                finally:
                    cat.index.lock.release_quiet()
            elif self._engine.executor is not None:
                try:
                    self._engine.executor.submit(cat.unpin, unpins)
                except RuntimeError:  # shut down: they stay for the next flush or plan to unpin
                    return
                self._unpins = []
