"""The fs tier's loads on the native engine (a fast path, :mod:`.fast`): a load planned and
booked on the loop thread with no coroutine of its own: its entry pinned, one descriptor; the
header and checksum checked when it ends. A load of many chunks is one group job, planned and
booked in bulk where the view is aligned.

A load pins its chunks when the engine plans it, so that no store evicts them before they are
read, and the engine plans jobs ahead of the workers: up to ``max_inflight + max(max_inflight,
8)`` jobs of up to :data:`.native.GROUP_CHUNKS` chunks, 1024 chunks at the default depth. A
store into a full tier evicts a chunk that is not pinned, and fails with ``CapacityError``
when none is. So the load jobs planned and not yet ended pin at most half the tier's capacity
(a :class:`~asynctier.engines.room.RoomQueue` shared with the stores): a job past that waits,
parked, and a store called meanwhile waits behind it, so that it cannot evict the chunks of a
load called before it.
"""

from __future__ import annotations

import errno
from functools import partial
from time import perf_counter
from typing import TYPE_CHECKING, Any

from asynctier.core.jobs import Job, Outcomes
from asynctier.core.ops import PRIO_LOAD
from asynctier.engines import native as nativeio
from asynctier.engines.fastpath import Continuation
from asynctier.engines.fastpath import Step as EngineStep
from asynctier.engines.room import RoomQueue
from asynctier.posix_io import O_DIRECT

from .fast import KeyPlan, Path, StorePath
from .later import group_end
from .layout import HEADER_BLOCK
from .protocol import Step, not_found
from .withdrawal import not_begun, undo_load

if TYPE_CHECKING:
    from asynctier.engines.native_engine import NativeEngine

    from .native import NativeIO
    from .tier import FsTier

__all__ = ["LoadPath", "fast_paths"]


class LoadPath(Path):
    """Loads: pin the entry, one descriptor; the header and checksum checked when it ends."""

    op = "load"
    prio = PRIO_LOAD
    _undo_plan = staticmethod(undo_load)

    def __init__(self, io: NativeIO, ahead: RoomQueue) -> None:
        super().__init__(io, ahead)
        tier = self._live()[1]  # (its capacity is set when it is made)
        cap = tier.capacity_bytes
        ahead.most = None if cap is None else max(1, cap // tier._chunk_size // 2)

    def plan(self, job: Job, slot: int) -> EngineStep:
        ahead, n = self._ahead, len(job.keys)
        # (RoomQueue.room written out: this runs per job)
        if ahead.waiting or (ahead.used and ahead.most is not None and ahead.used + n > ahead.most):
            self._live()[1]._stats.incr("loads_held_back", n)
            return ahead.park(slot, job, self._plan_counted, n)
        r = Path.plan(self, job, slot)
        if type(r) is tuple:  # to the workers, its chunks pinned until it ends
            ahead.used += n
        return r

    def _plan_counted(self, job: Job, slot: int) -> EngineStep:
        """:meth:`plan` of a job that waited (:meth:`~asynctier.engines.room.RoomQueue.admit`)."""
        r = Path.plan(self, job, slot)
        if type(r) is tuple:
            self._ahead.used += len(job.keys)
        return r

    def finish(
        self, job: Job, slot: int, result: int, csum: int, stage: int, info: int
    ) -> nativeio.JobFields | Continuation | None:
        self._ahead.used -= len(job.keys)
        if job.grouped:  # (Path.finish written out: this runs per job)
            return self._finish_group(job, slot, (result, csum, stage, info))
        return Path.finish(self, job, slot, result, csum, stage, info)

    def withdraw(self, job: Job, slot: int) -> Continuation | None:
        self._ahead.used -= len(job.keys)
        r = super().withdraw(job, slot)
        io = self._io()
        if self._ahead.waiting and io is not None:  # (the engine's flush admits them too, if it runs)
            io.engine.call_soon(partial(self._admit_now, io.engine))
        return r

    def _admit_now(self, engine: NativeEngine) -> None:
        self._ahead.admit(engine)
        engine.pump()

    def flush(self) -> None:
        super().flush()
        if self._ahead.waiting:  # room the ends made: the jobs parked for it are planned
            io = self._io()
            if io is not None:
                self._ahead.admit(io.engine)

    def _plan_key(self, io: NativeIO, tier: FsTier, key: bytes, cid: int, t0: float, block: int) -> KeyPlan:
        if tier.index_incomplete:  # a miss is looked up on disk: on a thread
            return not_begun(io, io.load_job, key, cid, t0)
        entry = tier._pin_for_load(key)
        try:
            out = tier._chunk(cid)
            n = out.nbytes
            addr = io._view_addr + cid * n
            proto = tier.protocol
            if io.aligned:  # ChunkProtocol.load written out, the name by NativeIO's namer
                shard, name = io.name_of(key)
                dfd = proto.shard_fds[shard]
                flags = proto.read_flags | (O_DIRECT if proto.use_direct else 0)
            else:
                plan = proto.load(key, out, addr)  # counts the chunks that cannot have O_DIRECT
                dfd, name, flags = plan.dfd, plan.name.encode(), plan.flags
            io._hb_used[block] = HEADER_BLOCK  # NativeIO.hb_read_into
            # nativeio.fields written out (names are short: a key's token)
            hb = io._hb_addr + block * HEADER_BLOCK
            fields = (nativeio.READ, PRIO_LOAD, dfd, flags, -1, -1, 0, int(tier.verify), 0, 0, hb, HEADER_BLOCK, addr,
                      n, 0, name, b"", b"")  # fmt: skip
        except BaseException as e:
            tier._end_load(key, t0, e, entry)
            raise
        return fields, (entry, out, block)

    def _plan_group(self, job: Job, slot: int) -> nativeio.JobFields | Continuation | None:
        """With the index complete, a group's chunks planned in bulk (as :meth:`_plan_key`
        plans each): their entries pinned under one lock, their descriptors packed by
        :meth:`.native.NativeIO.pack_reads`."""
        io, tier = self._live()
        if tier.index_incomplete or not io.aligned:
            return super()._plan_group(job, slot)
        keys, cids, t0 = job.args
        out: Outcomes = [None] * len(keys)
        entries = tier.index.pin_entries(keys)
        if None in entries:  # misses fail as planned; the others go on
            hits = [i for i, e in enumerate(entries) if e is not None]
            for i, e in enumerate(entries):
                if e is None:
                    out[i] = exc = not_found(keys[i])
                    tier._stats.record_failure(exc)
            if not hits:
                return group_end(job, out, [])
            keys, cids, entries = [keys[i] for i in hits], [cids[i] for i in hits], [entries[i] for i in hits]
        else:
            hits = list(range(len(keys)))
        proto = tier.protocol
        try:
            fields = io.pack_reads(slot, keys, cids, proto.read_flags | (O_DIRECT if proto.use_direct else 0),
                                   int(tier.verify))  # fmt: skip
        except BaseException as e:  # nothing went to the workers: each chunk fails with it
            for i, key, entry in zip(hits, keys, entries):
                tier._end_load(key, t0, e, entry)
                out[i] = e
            return group_end(job, out, [])
        self._keep(slot, (out, hits, keys, entries))
        return fields

    def _finish_group(self, job: Job, slot: int, own: tuple[int, int, int, int]) -> Continuation | None:
        """Each chunk read whole with the header expected, booked together (one lock, one clock
        read); the others one by one by :meth:`_finish_key`."""
        state = self._plans[slot]
        if state is None or len(state) == 3:  # planned chunk by chunk (Path._plan_group)
            return super()._finish_group(job, slot, own)
        self._plans[slot] = None
        out, hits, keys, entries = state
        io, tier = self._live()
        # refused as a whole; or (verify=False) each header parsed field by field
        bad = list(range(len(keys))) if own[2] or not tier.verify else io.reads_failed(slot, keys)
        later: list[tuple[int, Continuation]] = []
        if bad:
            ends = io._pool.group_outcomes(slot, len(keys), own if own[2] else None)
            _, cids, t0 = job.args
            for j in bad:
                i = hits[j]
                step = (entries[j], tier._chunk(cids[i]), io.block(slot, j))
                self._end_key(io, tier, out, later, i, keys[j], cids[i], t0, step, ends[j])
            done = set(bad)
            keys = [k for j, k in enumerate(keys) if j not in done]
            entries = [e for j, e in enumerate(entries) if j not in done]
        if keys:  # Tier.check_read's and _end_load's bookkeeping, for all at once
            tier.note_loaded(keys)
            tier.index.unpin_entries(keys, entries)
            self._booked.extend([perf_counter() - job.args[2]] * len(keys))
        return group_end(job, out, later)

    def _finish_key(
        self, io: NativeIO, tier: FsTier, key: bytes, cid: int, t0: float, step: tuple[Any, ...], result: int,
        csum: int, stage: int, info: int,
    ) -> Continuation | None:  # fmt: skip
        entry, out, block = step
        if stage == Step.WITHDRAWN:  # of a group begun, its call cancelled: not read
            return self._undo_begun(io, tier).load(key, entry).end()
        try:
            if stage == Step.OPEN and result == -errno.ENOENT:
                raise not_found(key)
            if stage:  # the threads engine mends what can be (O_DIRECT, O_NOATIME refused)
                read = partial(io._fall_back, tier.threads.load, key, out)
                return partial(
                    tier._async_load, key, t0, read, partial(io.engine.blocking, tier.delete_chunk, key), entry
                )
            # the header is still in this slot's block: the slot is held until checked
            tier.check_read(key, io.slot_hb[block], out, result, csum if tier.verify else None)
        except BaseException as e:
            if tier._end_load(key, t0, e, entry):
                return partial(self._drop_bad, io, key, e)
            raise
        tier.index.unpin(key, entry=entry)  # Tier._end_load, its count at the next flush
        self._booked.append(perf_counter() - t0)
        return None

    @staticmethod
    async def _drop_bad(io: NativeIO, key: bytes, exc: BaseException) -> None:
        tier = io.live_tier()
        await tier._drop_bad_copy_async(key, partial(io.engine.blocking, tier.delete_chunk, key))
        raise exc


def fast_paths(io: NativeIO) -> tuple[StorePath, LoadPath]:
    """The tier's store and load paths on ``io``, sharing one
    :class:`~asynctier.engines.room.RoomQueue`: a store waits behind the loads it holds back."""
    ahead = RoomQueue()
    return StorePath(io, ahead), LoadPath(io, ahead)
