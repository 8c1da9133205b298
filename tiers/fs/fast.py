"""The fs tier's fast paths on the native engine: a store or a load planned and booked on the
loop thread with no coroutine of its own (:mod:`asynctier.engines.native_engine`).

The plain cases only: a store with no victim to evict, or with one whose file it recycles
(a full tier's steady state: a spare job, then the write, in one slot), a load with the
index complete. The
plans and outcomes are the protocol's (:mod:`.protocol`), the same as :class:`.native.NativeIO`
runs one coroutine at a time; anything else is handed to it as a continuation.
"""

from __future__ import annotations

import errno
import os
import weakref
from functools import partial
from time import perf_counter
from typing import TYPE_CHECKING, Any

from asynctier.core.jobs import Job
from asynctier.core.ops import PRIO_LOAD
from asynctier.engines import native as nativeio
from asynctier.engines.native_engine import Continuation
from asynctier.errors import TierClosedError
from asynctier.lru import RemovalPending
from asynctier.posix_io import O_DIRECT

from .layout import HEADER_BLOCK
from .protocol import Outcome, SpareJob, Step, StoreJob, not_found, remove_quietly

if TYPE_CHECKING:
    from .native import NativeIO

__all__ = ["LoadPath", "StorePath"]


def _outcome(result: int, stage: int, info: int, csum: int) -> Outcome:
    if stage:
        return Outcome(Step(stage), -result)
    return Outcome(result=result, name_taken=bool(info), csum=csum)


_RECYCLE, _WRITE = 1, 2  # the job a store's slot runs


class _Path:
    """What both paths keep: the tier's I/O, each slot's plan, the successes to count."""

    op = ""  #: the operation counted (``"offload"``, ``"load"``)

    def __init__(self, io: NativeIO) -> None:
        # the engine's workers hold the engine, and so this: not the tier (a tier dropped
        # without aclose() must be collected, its finalizer stops them)
        self._io = weakref.ref(io)
        self._plans: list[tuple[Any, ...] | None] = []
        self._booked: list[float] = []  # latencies of the jobs ended, counted at the next flush

    def _live(self) -> NativeIO:
        io = self._io()
        if io is None:  # a call in progress holds its tier: only a bug gets here
            raise TierClosedError("the fs tier was dropped")
        return io

    def flush(self) -> None:
        """Count the jobs ended since the last flush (one lock, not one per chunk)."""
        booked = self._booked
        io = self._io()
        if booked and io is not None:
            self._booked = []
            io._tier._stats.record_each(self.op, io._tier.offloading_spec.chunk_bytes, booked)


class StorePath(_Path):
    """Stores: reserve room; the write, or, into a full tier, the write into the one victim's
    file (one recycling job); commit when it ends. Any other case continues as
    :meth:`.native.NativeIO.store`."""

    op = "offload"

    def __init__(self, io: NativeIO) -> None:
        super().__init__(io)
        self._recycles = 0  # stores into a victim's file (each an eviction), counted at the next flush

    def flush(self) -> None:
        super().flush()
        io = self._io()
        if self._recycles and io is not None:
            n, self._recycles = self._recycles, 0
            io._tier._stats.incr("evictions", n)
            io._tier._stats.incr("recycled", n)

    def plan(self, job: Job, slot: int) -> nativeio.JobFields | Continuation | None:
        # Tier._reserve_store and ChunkProtocol.write_flags written out: this runs per chunk
        key, cid, t0 = job.args
        io = self._live()
        tier = io._tier
        try:
            victims = tier.index.reserve(key, tier._chunk_size)
        except RemovalPending:  # an old copy of the key is being deleted: wait for it there
            return partial(io.store_job, key, cid, t0)
        except BaseException as e:
            tier._stats.record_failure(e)
            raise
        if victims is None:  # stored already
            tier._end_store(key, t0, None, skipped=True)
            return None
        if victims and not (len(victims) == 1 and tier.recycle_on and not tier.network_fs):
            return partial(tier._async_store_reserved, key, t0, victims, partial(io.store, key, cid))
        proto = tier.protocol
        plan: StoreJob | None = None
        try:
            data = tier._chunk(cid)
            addr = io._view_addr + cid * data.nbytes
            flags = io.direct_flags if proto.use_direct and io.aligned else proto.write_flags(data, addr)
            if victims:
                # Tier._may_recycle's test of a new copy of the victim is not needed here: its
                # key waits for _removed (RemovalPending); the workers check the namespace's lock
                tier._note_gone(victims[0])
                plan, sj = proto.recycle(key, victims[0], data, flags)
                fields = io.recycle_fields(slot, plan, sj, addr, data.nbytes)
                step: tuple[Any, ...] = (_RECYCLE, data, victims, plan, sj)
            else:
                plan = proto.store(key, data, None, None, flags)
                fields = io.store_fields(slot, plan, addr, data.nbytes)
                step = (_WRITE, data, victims, plan, None)
        except BaseException as e:
            proto.release(plan)  # a file made ahead goes back with its descriptor
            tier._removed(victims)
            tier._end_store(key, t0, e)
            raise
        plans = self._plans
        if len(plans) <= slot:
            plans.extend([None] * (slot + 1 - len(plans)))
        plans[slot] = step
        return fields

    def finish(
        self, job: Job, slot: int, result: int, csum: int, stage: int, info: int
    ) -> nativeio.JobFields | Continuation | None:
        key, cid, t0 = job.args
        step, data, victims, plan, sj = self._plans[slot]  # type: ignore[misc]
        self._plans[slot] = None
        io = self._live()
        tier = io._tier
        if step == _RECYCLE:
            return self._recycled(io, key, cid, t0, data, victims, plan, sj, result, stage, info)
        if plan.fd >= 0:  # ChunkProtocol.release: the file made ahead or taken over is closed
            os.close(plan.fd)
            plan.fd = -1
        if not stage and not info:  # (a write planned here evicts nothing: victims go to _RECYCLE)
            tier.index.commit(key)  # Tier._end_store, its count at the next flush
            self._booked.append(perf_counter() - t0)
            return None
        # a failed step, or a name found taken: the threads engine checks and mends it
        return partial(self._again, io, key, t0, plan, _outcome(result, stage, info, csum), data, victims)

    def _recycled(
        self, io: NativeIO, key: bytes, cid: int, t0: float, data: memoryview, victims: list[bytes], plan: StoreJob,
        sj: SpareJob, result: int, stage: int, info: int,
    ) -> Continuation | None:  # fmt: skip
        """Book a recycling job; what did not simply succeed continues on a coroutine."""
        tier = io._tier
        if not stage:
            self._recycles += 1  # Tier._evicted and ChunkProtocol.stored, counted at the next flush
            tier._removed(victims)
            tier.index.commit(key)
            self._booked.append(perf_counter() - t0)
            return None
        out = Outcome(Step(stage), -result)
        if not info and stage != Step.DIRSYNC:  # the victim's file did not move: as after a spare job
            return partial(tier._async_store_reserved, key, t0, victims, partial(io.store, key, cid, taken=(sj, out)))
        tier._evicted(victims[0], None)  # its file left the victim's name
        if stage == Step.DIRSYNC:  # published, with unknown durability: as a write's
            return partial(self._again, io, key, t0, plan, out, data, victims)
        tier._stats.incr("recycle_refused" if stage == Step.SHARED else "recycle_retries")
        return partial(self._afresh, io, key, cid, t0, victims, sj)

    @staticmethod
    async def _afresh(io: NativeIO, key: bytes, cid: int, t0: float, victims: list[bytes], sj: SpareJob) -> None:
        """The victim's file was taken but not filled (another tier holds the namespace, or a
        step failed): it goes, and the chunk is written into a new file."""
        tier = io._tier

        async def write(_: list[bytes]) -> None:
            await io.engine.blocking(remove_quietly, sj.new_dfd, sj.temp)
            await io.store(key, cid, [])

        await tier._async_store_reserved(key, t0, victims, write)

    @staticmethod
    async def _again(
        io: NativeIO, key: bytes, t0: float, plan: StoreJob, out: Outcome, data: memoryview, victims: list[bytes]
    ) -> None:
        tier = io._tier
        try:
            await io._fall_back(io._store_again, plan, out, data)
        except BaseException as e:
            tier._end_store(key, t0, e)
            raise
        finally:
            tier._removed(victims)
        tier._end_store(key, t0, None)


class LoadPath(_Path):
    """Loads: pin the entry, one descriptor; the header and checksum checked when it ends."""

    op = "load"

    def plan(self, job: Job, slot: int) -> nativeio.JobFields | Continuation | None:
        key, cid, t0 = job.args
        io = self._live()
        tier = io._tier
        if tier.index_incomplete:  # a miss is looked up on disk: on a thread
            return partial(io.load_job, key, cid, t0)
        entry = tier._pin_for_load(key)
        try:
            out = tier._chunk(cid)
            n = out.nbytes
            addr = io._view_addr + cid * n
            proto = tier.protocol
            if io.aligned:  # ChunkProtocol.load written out
                dfd, name = proto.name(key)
                flags = proto.read_flags | (O_DIRECT if proto.use_direct else 0)
            else:
                plan = proto.load(key, out, addr)  # counts the chunks that cannot have O_DIRECT
                dfd, name, flags = plan.dfd, plan.name, plan.flags
            io._hb_used[slot] = HEADER_BLOCK  # NativeIO.hb_read_into
            # nativeio.fields written out (names are short: a key's token)
            fields = (nativeio.READ, PRIO_LOAD, dfd, flags, -1, -1, 0, int(tier.verify), 0, 0,
                      io._hb_addr + slot * HEADER_BLOCK, HEADER_BLOCK, addr, n, 0, name.encode(), b"", b"")  # fmt: skip
        except BaseException as e:
            tier._end_load(key, t0, e, entry)
            raise
        plans = self._plans
        if len(plans) <= slot:
            plans.extend([None] * (slot + 1 - len(plans)))
        plans[slot] = (entry, out)
        return fields

    def finish(self, job: Job, slot: int, result: int, csum: int, stage: int, info: int) -> Continuation | None:
        key, _, t0 = job.args
        entry, out = self._plans[slot]  # type: ignore[misc]
        self._plans[slot] = None
        io = self._live()
        tier = io._tier
        try:
            if stage == Step.OPEN and result == -errno.ENOENT:
                raise not_found(key)
            if stage:  # the threads engine mends what can be (O_DIRECT, O_NOATIME refused)
                read = partial(io._fall_back, tier.threads.load, key, out)
                return partial(
                    tier._async_load, key, t0, read, partial(io.engine.blocking, tier.delete_chunk, key), entry
                )
            # the header is still in this slot's block: the slot is held until checked
            tier.check_read(key, io.slot_hb[slot], out, result, csum if tier.verify else None)
        except BaseException as e:
            if tier._end_load(key, t0, e, entry):
                return partial(self._drop_bad, io, key, e)
            raise
        tier.index.unpin(key, entry=entry)  # Tier._end_load, its count at the next flush
        self._booked.append(perf_counter() - t0)
        return None

    @staticmethod
    async def _drop_bad(io: NativeIO, key: bytes, exc: BaseException) -> None:
        tier = io._tier
        await tier._drop_bad_copy_async(key, partial(io.engine.blocking, tier.delete_chunk, key))
        raise exc
