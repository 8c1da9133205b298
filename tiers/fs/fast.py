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
from typing import TYPE_CHECKING, Any

from asynctier.core.jobs import Job
from asynctier.core.ops import PRIO_LOAD, PRIO_STORE
from asynctier.engines import native as nativeio
from asynctier.engines.native_engine import Continuation
from asynctier.errors import TierClosedError
from asynctier.lru import RemovalPending
from asynctier.posix_io import O_DIRECT

from .layout import HEADER_BLOCK
from .protocol import Outcome, SpareJob, Step, StoreJob, not_found

if TYPE_CHECKING:
    from .native import NativeIO

__all__ = ["LoadPath", "StorePath"]


def _dropped() -> TierClosedError:
    # a call in progress holds its tier: only a bug gets here
    return TierClosedError("the fs tier was dropped")


def _outcome(result: int, stage: int, info: int, csum: int) -> Outcome:
    if stage:
        return Outcome(Step(stage), -result)
    return Outcome(result=result, name_taken=bool(info), csum=csum)


_SPARE, _WRITE = 1, 2  # the step a store's slot runs


class StorePath:
    """Stores: reserve room; into a full tier, take the one victim's file over (a spare job)
    when it may be recycled; the write; commit when it ends. Any other case continues as
    :meth:`.native.NativeIO.store`."""

    def __init__(self, io: NativeIO) -> None:
        # the engine's workers hold the engine, and so this: not the tier (a tier dropped
        # without aclose() must be collected, its finalizer stops them)
        self._io = weakref.ref(io)
        self._plans: list[tuple[Any, ...] | None] = []

    def plan(self, job: Job, slot: int) -> nativeio.JobFields | Continuation | None:
        # Tier._reserve_store and ChunkProtocol.write_flags written out: this runs per chunk
        key, cid, t0 = job.args
        io = self._io()
        if io is None:
            raise _dropped()
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
            if victims:  # NativeIO._take_spare's job
                victim = victims[0]
                tier._note_gone(victim)
                sj = proto.spare(victim, flags, proto.name(key)[0])
                fields: nativeio.JobFields = (nativeio.SPARE, PRIO_STORE, sj.dfd, sj.flags, -1, sj.new_dfd, 0, 0, 0,
                                              0, 0, 0, 0, 0, sj.name.encode(), sj.temp.encode())  # fmt: skip
                step: tuple[Any, ...] = (_SPARE, data, addr, flags, victims, sj)
            else:
                plan = proto.store(key, data, None, None, flags)
                fields = io.store_fields(slot, plan, addr, data.nbytes)
                step = (_WRITE, data, addr, flags, victims, plan)
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
        step, data, addr, flags, victims, plan = self._plans[slot]  # type: ignore[misc]
        self._plans[slot] = None
        io = self._io()
        if io is None:
            raise _dropped()
        tier = io._tier
        if step == _SPARE:
            return self._spare_ended(io, slot, key, cid, t0, data, addr, flags, victims, plan,
                                     _outcome(result, stage, info, csum))  # fmt: skip
        if plan.fd >= 0:  # ChunkProtocol.release: the file made ahead or taken over is closed
            os.close(plan.fd)
            plan.fd = -1
        if not stage and not info:
            if victims:
                tier._stats.incr("recycled")  # ChunkProtocol.stored
                tier._removed(victims)
            tier._end_store(key, t0, None)
            return None
        # a failed step, or a name found taken: the threads engine checks and mends it
        return partial(self._again, io, key, t0, plan, _outcome(result, stage, info, csum), data, victims)

    def _spare_ended(
        self, io: NativeIO, slot: int, key: bytes, cid: int, t0: float, data: memoryview, addr: int, flags: int,
        victims: list[bytes], sj: SpareJob, out: Outcome,
    ) -> nativeio.JobFields | Continuation:  # fmt: skip
        """The victim's file is taken: write into it when it may be recycled (NativeIO._spare_taken
        decides anything else)."""
        tier = io._tier
        proto = tier.protocol
        victim = victims[0]
        try:  # Tier._may_recycle's test, without its count (the continuation counts a refusal)
            plain = out.ok and not tier.index.has_entry(victim) and tier._alone()
        except Exception:
            plain = False
        if not plain:
            return partial(tier._async_store_reserved, key, t0, victims, partial(io.store, key, cid, taken=(sj, out)))
        spare, exc, _ = proto.spare_taken(sj, out)
        tier._evicted(victim, exc)
        plan: StoreJob | None = None
        try:
            plan = proto.store(key, data, None, spare, flags)
            fields = io.store_fields(slot, plan, addr, data.nbytes)
        except BaseException as e:
            proto.abandon(plan, spare)
            tier._removed(victims)
            tier._end_store(key, t0, e)
            raise
        self._plans[slot] = (_WRITE, data, addr, flags, victims, plan)
        return fields

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


class LoadPath:
    """Loads: pin the entry, one descriptor; the header and checksum checked when it ends."""

    def __init__(self, io: NativeIO) -> None:
        self._io = weakref.ref(io)  # as StorePath's
        self._plans: list[tuple[Any, memoryview] | None] = []

    def plan(self, job: Job, slot: int) -> nativeio.JobFields | Continuation | None:
        key, cid, t0 = job.args
        io = self._io()
        if io is None:
            raise _dropped()
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
                      io._hb_addr + slot * HEADER_BLOCK, HEADER_BLOCK, addr, n, name.encode(), b"")  # fmt: skip
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
        io = self._io()
        if io is None:
            raise _dropped()
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
        tier._end_load(key, t0, None, entry)
        return None

    @staticmethod
    async def _drop_bad(io: NativeIO, key: bytes, exc: BaseException) -> None:
        tier = io._tier
        await tier._drop_bad_copy_async(key, partial(io.engine.blocking, tier.delete_chunk, key))
        raise exc
