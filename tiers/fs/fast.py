"""The fs tier's fast paths on the native engine: a store (here) or a load (:mod:`.loads`)
planned and booked on the loop thread with no coroutine of its own
(:mod:`asynctier.engines.native_engine`); what both keep (:class:`Path`).

The plain cases only: a store with no victim to evict, or with one whose file it recycles
(a full tier's steady state: a spare job, then the write, in one slot), a load with the
index complete. The
plans and outcomes are the protocol's (:mod:`.protocol`), the same as :class:`.native.NativeIO`
runs one coroutine at a time; anything else is handed to it as a continuation.

A group job (of a load of several chunks, or of such a store on a local file system, see
:meth:`.tier.FsTier.group_size`) puts up to :data:`.native.GROUP_CHUNKS` files in one
:data:`~asynctier.engines.native.GROUP` descriptor, so that the engine plans, submits and
books one job for them (the pool spreads the files over its workers); its chunks'
continuations run one after another.
Where the view is aligned, its plain chunks are planned and booked in bulk (the index under
one lock, descriptors and checks by :mod:`.bulk`); the others, and every chunk of an
unaligned view, chunk by chunk as a lone job is.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from functools import partial
from time import perf_counter
from typing import TYPE_CHECKING, Any

from asynctier.core.jobs import SKIPPED, Job, Outcomes, Skipped
from asynctier.core.ops import PRIO_STORE
from asynctier.engines import native as nativeio
from asynctier.engines.fastpath import Continuation
from asynctier.engines.fastpath import Step as EngineStep
from asynctier.engines.room import RoomQueue
from asynctier.errors import TierClosedError
from asynctier.lru import RemovalPending

from .later import AfterRemoval, group_end, one_later
from .protocol import Outcome, SpareJob, Step, StoreJob, remove_quietly
from .withdrawal import NotBegun, Undo, not_begun, undo_store

if TYPE_CHECKING:
    from .native import NativeIO
    from .tier import FsTier

__all__ = ["KeyPlan", "Path", "StorePath"]


def _outcome(result: int, stage: int, info: int, csum: int) -> Outcome:
    if stage:
        return Outcome(Step(stage), -result)
    return Outcome(result=result, name_taken=bool(info), csum=csum)


_RECYCLE, _WRITE = 1, 2  # the job a store's slot runs

#: One chunk's plan: its descriptor and what its booking needs; or a continuation; or None
#: (over, its outcome booked); or SKIPPED (a store of a key stored already, booked).
KeyPlan = tuple[nativeio.JobFields, tuple[Any, ...]] | Continuation | Skipped | None
#: A group job's chunks: their outcomes so far, the planned ones (index, what their booking
#: needs), the continuations left (index, continuation).
_GroupState = tuple[Outcomes, list[tuple[int, tuple[Any, ...]]], list[tuple[int, Continuation]]]


class Path:
    """What both paths keep: the tier's I/O, each slot's plan, the successes to count."""

    op = ""  #: the operation counted (``"offload"``, ``"load"``)
    prio = PRIO_STORE  #: the priority of its group jobs
    _undo_plan: Callable[[Undo, Job, Any], None]  #: what a withdrawn job gives back (:mod:`.withdrawal`)

    def __init__(self, io: NativeIO, ahead: RoomQueue) -> None:
        # the engine's workers hold the engine, and so this: not the tier (a tier dropped
        # without aclose() must be collected, its finalizer stops them)
        self._io = weakref.ref(io)
        self._ahead = ahead  # the chunks loads pin ahead of the I/O, the jobs parked behind them (.loads)
        self._plans: list[tuple[Any, ...] | None] = []
        self._booked: list[float] = []  # latencies of the jobs ended, counted at the next flush
        # victims of stores taken back from groups begun (their calls cancelled), in the order
        # their ends were booked: indexed again at the next flush, in one call
        self._restore: list[bytes] = []

    def _live(self) -> tuple[NativeIO, FsTier]:
        """The tier's I/O and the tier, once per job (or group job), handed down from there."""
        io = self._io()
        tier = None if io is None else io._tier_ref()
        if io is None or tier is None:  # a call in progress holds its tier: only a bug gets here
            raise TierClosedError("the fs tier was dropped")
        return io, tier

    def _keep(self, slot: int, plan: Any) -> None:
        plans = self._plans
        if len(plans) <= slot:
            plans.extend([None] * (slot + 1 - len(plans)))
        plans[slot] = plan

    # -- one chunk's plan and booking (the kinds of path say what) --------------------------
    def _plan_key(self, io: NativeIO, tier: FsTier, key: bytes, cid: int, t0: float, block: int) -> KeyPlan:
        raise NotImplementedError

    def _finish_key(
        self, io: NativeIO, tier: FsTier, key: bytes, cid: int, t0: float, step: tuple[Any, ...], result: int,
        csum: int, stage: int, info: int,
    ) -> Continuation | None:  # fmt: skip
        raise NotImplementedError

    def _end_key(
        self, io: NativeIO, tier: FsTier, out: Outcomes, later: list[tuple[int, Continuation]], i: int, key: bytes,
        cid: int, t0: float, step: tuple[Any, ...], end: tuple[int, int, int, int],
    ) -> None:  # fmt: skip
        """A group's chunk at position ``i`` ended as ``end`` (result, csum, stage, info) says:
        :meth:`_finish_key` books it; its failure is that chunk's outcome, what is left of it
        goes to ``later``."""
        try:
            r = self._finish_key(io, tier, key, cid, t0, step, *end)
        except BaseException as e:
            out[i] = e
            return
        if r is not None:
            later.append((i, r))

    # -- one chunk per job -------------------------------------------------------------------
    def plan(self, job: Job, slot: int) -> EngineStep:  # (never PARKED: the paths below park)
        if job.grouped:
            return self._plan_group(job, slot)
        key, cid, t0 = job.args
        r = self._plan_key(*self._live(), key, cid, t0, slot)
        if r is SKIPPED:
            job.result = SKIPPED
            return None
        if type(r) is not tuple:
            return partial(one_later, job, r) if isinstance(r, NotBegun) else r  # type: ignore[return-value]
        self._keep(slot, r[1])
        return r[0]

    def finish(
        self, job: Job, slot: int, result: int, csum: int, stage: int, info: int
    ) -> nativeio.JobFields | Continuation | None:
        if job.grouped:
            return self._finish_group(job, slot, (result, csum, stage, info))
        key, cid, t0 = job.args
        step = self._plans[slot]
        self._plans[slot] = None
        assert step is not None
        return self._finish_key(*self._live(), key, cid, t0, step, result, csum, stage, info)

    # -- group jobs ----------------------------------------------------------------------------
    def _plan_group(self, job: Job, slot: int) -> nativeio.JobFields | Continuation | None:
        """Each chunk planned as if alone; those planned go to the workers as one job."""
        keys, cids, t0 = job.args
        io, tier = self._live()
        out: Outcomes = [None] * len(keys)
        subs: list[nativeio.JobFields] = []
        planned: list[tuple[int, tuple[Any, ...]]] = []
        later: list[tuple[int, Continuation]] = []
        for i, (key, cid) in enumerate(zip(keys, cids)):
            try:
                r = self._plan_key(io, tier, key, cid, t0, io.block(slot, len(subs)))
            except BaseException as e:  # that chunk's failure (booked by _plan_key)
                out[i] = e
                continue
            if type(r) is tuple:
                subs.append(r[0])
                planned.append((i, r[1]))
            elif r is SKIPPED:
                out[i] = SKIPPED
            elif r is not None:
                later.append((i, r))  # type: ignore[arg-type]
        if not subs:
            return group_end(job, out, later)
        self._keep(slot, (out, planned, later))
        return io._pool.one_or_group(slot, self.prio, subs)

    def _finish_group(self, job: Job, slot: int, own: tuple[int, int, int, int]) -> Continuation | None:
        keys, cids, t0 = job.args
        state: _GroupState = self._plans[slot]  # type: ignore[assignment]
        self._plans[slot] = None
        out, planned, later = state
        io, tier = self._live()
        ends = io._pool.group_outcomes(slot, len(planned), own)
        for (i, step), end in zip(planned, ends):
            self._end_key(io, tier, out, later, i, keys[i], cids[i], t0, step, end)
        return group_end(job, out, later)

    # -- a job taken back from the workers (its call cancelled): no file was touched ------------
    def withdrawable(self, job: Job, slot: int) -> bool:
        return True

    def withdraw(self, job: Job, slot: int) -> Continuation | None:
        plan, self._plans[slot] = self._plans[slot], None
        u = Undo(*self._live())
        self._undo_plan(u, job, plan)
        return u.close()

    def _undo_begun(self, io: NativeIO, tier: FsTier) -> Undo:
        """For a chunk of a group begun that the workers took back (see :mod:`.withdrawal`)."""
        return Undo(io, tier, self._restore)

    def flush(self) -> None:
        """Count the jobs ended since the last flush (one lock, not one per chunk)."""
        booked = self._booked
        io = self._io() if booked or self._restore else None
        if io is not None and booked:
            self._booked = []
            io._stats.record_each(self.op, io._n, booked)  # (_n: the chunk size)
        if io is not None and self._restore:  # (see _undo_begun)
            tier, (restore, self._restore) = io.live_tier(), (self._restore, [])
            tier.index.restore(restore, tier._chunk_size)


class StorePath(Path):
    """Stores: reserve room; the write, or, into a full tier, the write into the one victim's
    file (one recycling job); commit when it ends. Any other case continues as
    :meth:`.native.NativeIO.store`."""

    op = "offload"
    _undo_plan = staticmethod(undo_store)

    def __init__(self, io: NativeIO, ahead: RoomQueue) -> None:
        super().__init__(io, ahead)
        self._recycles = 0  # stores into a victim's file (each an eviction), counted at the next flush

    def plan(self, job: Job, slot: int) -> EngineStep:
        if self._ahead.waiting:  # loads parked before it are planned first (.loads)
            return self._ahead.park(slot, job, super().plan, 0)
        return super().plan(job, slot)

    def flush(self) -> None:
        super().flush()
        io = self._io() if self._recycles else None
        if io is not None:
            n, self._recycles = self._recycles, 0
            io._stats.incr("evictions", n)
            io._stats.incr("recycled", n)

    def _plan_key(self, io: NativeIO, tier: FsTier, key: bytes, cid: int, t0: float, block: int) -> KeyPlan:
        # Tier._reserve_store and ChunkProtocol.write_flags written out: this runs per chunk
        try:
            victims = tier.index.reserve(key, tier._chunk_size)
        except Exception as e:
            victims = e  # type: ignore[assignment]
        return self._plan_reserved(io, tier, key, cid, t0, block, victims)

    def _plan_reserved(
        self, io: NativeIO, tier: FsTier, key: bytes, cid: int, t0: float, block: int,
        victims: list[bytes] | Exception | None,
    ) -> KeyPlan:  # fmt: skip
        """:meth:`_plan_key` once the index said what reserving room for ``key`` gives: the
        victims to evict, None (stored already) or the exception it raised."""
        if isinstance(victims, RemovalPending):  # an old copy of the key is being deleted: wait for it there
            return not_begun(io, io.store_job, key, cid, t0, kind=AfterRemoval)
        if isinstance(victims, Exception):
            tier._stats.record_failure(victims)
            raise victims
        if victims is None:  # stored already
            if tier.shared:  # unless another process removed it: looked for on disk, off the loop
                return not_begun(io, io.store_job, key, cid, t0)
            tier._end_store(key, t0, None, skipped=True)
            return SKIPPED
        if victims and not (len(victims) == 1 and tier.recycle_on and not tier.network_fs):
            return not_begun(io, tier._async_store_reserved, key, t0, victims, partial(io.store, key, cid))
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
                fields, temp = io.recycle_plan(block, key, victims[0], flags, addr, data.nbytes)
                step: tuple[Any, ...] = (_RECYCLE, data, victims, flags, temp)
            else:
                plan = proto.store(key, data, None, None, flags)
                fields = io.store_fields(block, plan, addr, data.nbytes)
                step = (_WRITE, data, victims, plan, None)
        except BaseException as e:
            proto.release(plan)  # a file made ahead goes back with its descriptor
            tier._removed(victims)
            tier._end_store(key, t0, e)
            raise
        return fields, step

    def _plan_group(self, job: Job, slot: int) -> nativeio.JobFields | Continuation | None:
        """A group of stores planned in bulk: room reserved for all under one lock; the chunks
        that take their one victim's file packed by :meth:`.native.NativeIO.pack_recycles`,
        those that make a new file by :meth:`~.native.NativeIO.pack_writes`; the others (a key
        stored already, victims to delete first, ...) planned one by one by :meth:`_plan_reserved`."""
        io, tier = self._live()
        proto = tier.protocol
        if not io.aligned or tier.network_fs:
            return super()._plan_group(job, slot)
        keys, cids, t0 = job.args
        reserved = tier.index.reserve_many(keys, tier._chunk_size)
        out: Outcomes = [None] * len(keys)
        subs: list[nativeio.JobFields] = []
        planned: list[tuple[int, tuple[Any, ...]]] = []
        later: list[tuple[int, Continuation]] = []
        # rec: the chunks that take their victim's file; new: those that make a new (unnamed,
        # then linked) file; others: planned one by one
        rec, new, others, rkeys, rvictims, rcids, nkeys, ncids = io.split_plain(
            keys, cids, reserved, proto.use_tmpfile, tier.recycle_on
        )
        for i in others:
            try:
                p = self._plan_reserved(io, tier, keys[i], cids[i], t0, io.block(slot, len(subs)), reserved[i])
            except BaseException as e:  # that chunk's failure (booked by _plan_reserved)
                out[i] = e
                continue
            if type(p) is tuple:
                subs.append(p[0])
                planned.append((i, p[1]))
            elif p is SKIPPED:
                out[i] = SKIPPED
            elif p is not None:
                later.append((i, p))  # type: ignore[arg-type]
        flags = io.direct_flags if proto.use_direct else os.O_WRONLY  # (the view is aligned)
        temps: list[str] = []
        fds: list[int] = []
        if rec:
            if tier.recovery.scanning:  # Tier._note_gone, as recycle_plan's caller does it
                for v in rvictims:
                    tier._note_gone(v)
            try:
                temps = io.pack_recycles(slot, len(subs), rkeys, rvictims, rcids, flags)
            except BaseException as e:  # none of them went to the workers: each fails with it
                for i, key, victim in zip(rec, rkeys, rvictims):
                    tier._removed([victim])
                    tier._end_store(key, t0, e)
                    out[i] = e
                rec, rkeys, rvictims = [], [], []
        if new:
            try:
                fds = io.pack_writes(slot, len(subs) + len(rec), nkeys, ncids, flags)
            except BaseException as e:
                for i, key in zip(new, nkeys):
                    tier._end_store(key, t0, e)
                    out[i] = e
                new, nkeys = [], []
        if not rec and not new:
            if not subs:
                return group_end(job, out, later)
            self._keep(slot, (out, planned, later))
            return io._pool.one_or_group(slot, self.prio, subs)
        if subs:
            table, offset = io._pool.sub_jobs(slot)
            for j, f in enumerate(subs):  # first, as NativePool.group packs them
                nativeio.JOB_LAYOUT.pack_into(table, offset + j * nativeio.JOB_LAYOUT.size, -1, 0, *f)
        self._keep(slot, (out, planned, later, rec, rkeys, rvictims, temps, flags, new, nkeys, fds))
        return io._pool.packed_group(slot, self.prio, len(subs) + len(rec) + len(new))

    def _finish_group(self, job: Job, slot: int, own: tuple[int, int, int, int]) -> Continuation | None:
        """The chunks that simply succeeded booked together (one lock, one clock read); the
        others one by one (:meth:`_finish_key`, :meth:`_recycled`)."""
        state = self._plans[slot]
        if state is None or len(state) == 3:  # planned chunk by chunk (Path._plan_group)
            return super()._finish_group(job, slot, own)
        self._plans[slot] = None
        out, planned, later, rec, rkeys, rvictims, temps, flags, new, nkeys, fds = state
        io, tier = self._live()
        first, total = len(planned), len(planned) + len(rec) + len(new)
        if not (own[2] or planned or io.jobs_failed(slot, total)):
            # the usual case: each chunk was packed in bulk and simply succeeded
            self._recycles += len(rkeys)
            tier.index.commit_many(rkeys + nkeys, rvictims)
            self._booked.extend([perf_counter() - job.args[2]] * total)
            return group_end(job, out, later)
        keys, cids, t0 = job.args
        bad = list(range(total)) if own[2] else io.jobs_failed(slot, total)  # (own[2]: refused as a whole)
        ends = io._pool.group_outcomes(slot, total, own if own[2] else None) if planned or bad else []
        for (i, step), end in zip(planned, ends):
            self._end_key(io, tier, out, later, i, keys[i], cids[i], t0, step, end)
        written = first + len(rec)
        if own[2]:  # never ran: the files made ahead are still ours (else their workers closed them)
            for fd in fds:
                if fd >= 0:
                    os.close(fd)
        failed = [j for j in bad if j >= first]
        for j in failed:
            result, csum, stage, info = ends[j]
            i = rec[j - first] if j < written else new[j - written]
            try:
                if j < written:
                    r = self._recycled(io, tier, keys[i], cids[i], t0, tier._chunk(cids[i]), [rvictims[j - first]],
                                       flags, temps[j - first], result, stage, info)  # fmt: skip
                else:  # as _finish_key's failure, with the plan's objects made now
                    plan = tier.protocol.store(keys[i], tier._chunk(cids[i]), None, None, flags, pooled=False)
                    r = self._finish_key(io, tier, keys[i], cids[i], t0, (_WRITE, tier._chunk(cids[i]), [], plan, None),
                                         result, csum, stage, info)  # fmt: skip
            except BaseException as e:
                out[i] = e
                continue
            if r is not None:
                later.append((i, r))
        if failed:
            gone = set(failed)
            rkeys = [k for j, k in enumerate(rkeys, first) if j not in gone]
            rvictims = [v for j, v in enumerate(rvictims, first) if j not in gone]
            nkeys = [k for j, k in enumerate(nkeys, written) if j not in gone]
        if rkeys or nkeys:  # _recycled's and _finish_key's bookkeeping, for all at once
            self._recycles += len(rkeys)
            tier.index.commit_many(rkeys + nkeys, rvictims)
            self._booked.extend([perf_counter() - t0] * (len(rkeys) + len(nkeys)))
        return group_end(job, out, later)

    def _finish_key(
        self, io: NativeIO, tier: FsTier, key: bytes, cid: int, t0: float, step_: tuple[Any, ...], result: int,
        csum: int, stage: int, info: int,
    ) -> Continuation | None:  # fmt: skip
        step, data, victims, plan, sj = step_
        if stage == Step.WITHDRAWN:  # of a group begun, its call cancelled: nothing done
            return self._undo_begun(io, tier).step(key, step_).end()
        if step == _RECYCLE:  # (its plan: flags and temporary name, see recycle_plan)
            return self._recycled(io, tier, key, cid, t0, data, victims, plan, sj, result, stage, info)
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
        self, io: NativeIO, tier: FsTier, key: bytes, cid: int, t0: float, data: memoryview, victims: list[bytes],
        flags: int, temp: str, result: int, stage: int, info: int,
    ) -> Continuation | None:  # fmt: skip
        """Book a recycling job; what did not simply succeed continues on a coroutine."""
        if stage == Step.WITHDRAWN:  # (a bulk group's: see _finish_key)
            return self._undo_begun(io, tier).store(key, victims).end()
        if not stage:
            self._recycles += 1  # Tier._evicted and ChunkProtocol.stored, counted at the next flush
            tier.index.commit(key, victims)  # and Tier._removed(victims), under one lock
            self._booked.append(perf_counter() - t0)
            return None
        # the plan's objects, as the job ran (NativeIO.recycle_plan made none)
        plan, sj = tier.protocol.recycle(key, victims[0], data, flags, temp)
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
        tier = io.live_tier()

        async def write(_: list[bytes]) -> None:
            await io.engine.blocking(remove_quietly, sj.new_dfd, sj.temp)
            await io.store(key, cid, [])

        await tier._async_store_reserved(key, t0, victims, write)

    @staticmethod
    async def _again(
        io: NativeIO, key: bytes, t0: float, plan: StoreJob, out: Outcome, data: memoryview, victims: list[bytes]
    ) -> None:
        tier = io.live_tier()
        try:
            await io._fall_back(io._store_again, plan, out, data)
        except BaseException as e:
            tier._end_store(key, t0, e)
            raise
        finally:
            tier._removed(victims)
        tier._end_store(key, t0, None)
