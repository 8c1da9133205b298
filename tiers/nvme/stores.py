"""The nvme tier's stores on the native engine: one C worker job per run of adjacent slots,
planned and booked on the loop thread, the journal committed by a worker job too.

Why: on the threads engine each store's hashing, header and bookkeeping run on a Python thread
holding the GIL, and the event loop's thread waits for it (docs/benchmarks.md: 5-7 ms p99 lag
at 64 KiB). Here the loop thread allocates slots under the index lock (only ever *tried*: a
checkpoint holds it across its snapshot), writes each header without its checksums, and a
worker hashes each payload, fills in the header's checksums and writes the run with one
``pwritev``. The order rules stay the threads path's (docs/tiers/nvme.md): a reused slot is
written only once its ``EVICT`` record is in the journal, and a store is acknowledged only
once its ``PUBLISH`` record is. A job waiting for either is *parked* (it keeps its engine slot)
while one commit writes the journal for every job waiting (group commit); it then goes on.

A job that finds the index lock busy (a checkpoint's snapshot) waits for its release parked
(:mod:`.lockwait`). Anything else but the plain case (a bounce copy, a failed write, a failed
journal write before the data) is finished by the threads path's own steps on a slow-path
thread.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import weakref
from collections.abc import Iterable
from functools import partial
from time import perf_counter
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple

from asynctier import TierClosedError
from asynctier.core.backend import run_on_thread_to_end
from asynctier.core.jobs import SKIPPED, Job, Outcomes, Skipped
from asynctier.core.ops import PRIO_LOAD
from asynctier.engines import native as nativeio
from asynctier.engines.descriptors import RESULT_LAYOUT
from asynctier.engines.fastpath import PARKED, Continuation, Parked, Step
from asynctier.engines.native_engine import NativeEngine
from asynctier.engines.room import RoomQueue
from asynctier.engines.speedups import speedups
from asynctier.errors import Withdrawn
from asynctier.posix_io import buffer_address

from . import bulk as _py_bulk
from .catalog import Slots
from .fast import IoArea
from .groups import RUNS_A_TURN
from .lockwait import LockWaiters

if TYPE_CHECKING:
    from .journal import Claim, Journal
    from .tier import NvmeTier

__all__ = ["StorePath"]

# a store job's runs packed and read back in one call each: the C twins where built
_fast = speedups()
_ops: ModuleType = _py_bulk if _fast is None else _fast

Run = _py_bulk.Run


class _Store:
    """One store job between its steps: its chunks, the slots allocated (position -> slot,
    seq), the runs to write, the next and how many are in flight, what each run wrote or why
    it did not, the keys found stored already, and the journal ticket it waits for."""

    __slots__ = ("acking", "bad", "batch", "cids", "csums", "evict", "keys", "next", "out", "runs",
                 "skip_ticket", "skipped", "slots", "t0", "ticket", "written")  # fmt: skip

    def __init__(self, keys: list[bytes], cids: list[int], t0: float) -> None:
        self.keys = keys
        self.cids = cids
        self.t0 = t0
        self.out: Outcomes = [None] * len(keys)
        self.slots: Slots = {}
        self.evict = 0  # the EVICT records to be in the journal before any slot is written
        self.skipped: list[int] = []
        self.skip_ticket = 0
        self.runs: list[Run] = []
        self.next = 0
        self.batch = 1  # the runs of the job in flight (a GROUP of them when more than one)
        self.csums: dict[int, int] = {}
        self.written: list[int] = []
        self.bad: list[tuple[list[int], BaseException]] = []
        self.ticket = 0  # parked until this record is in the journal
        self.acking = False  # parked for the PUBLISH records (else for the EVICT ones)


class _Carrier(NamedTuple):
    """A commit running as a worker job in a parked job's slot; its claim holds the records
    the worker writes from (``claim.data``, read in place)."""

    slot: int
    journal: Journal
    claim: Claim


class StorePath:
    """Stores of an nvme tier on its native engine (a :class:`~asynctier.engines.fastpath.FastPath`)."""

    def __init__(self, tier: NvmeTier, engine: NativeEngine) -> None:
        self._tier = weakref.ref(tier)  # as LoadPath's: the engine must not keep the tier alive
        self._engine = engine
        self._jobs: dict[int, _Store] = {}  # by engine slot
        self._areas: dict[int, IoArea] = {}  # by engine slot: header blocks, iovecs, checksums
        self._view_addr = 0
        self._parked: list[tuple[int, int, Job, _Store]] = []  # (ticket, engine slot, job, state)
        self._committing = False  # a commit runs for parked jobs (a worker job, or a thread)
        self._kick_due = False  # jobs were parked since the last commit began
        self._kick_soon = False  # a commit is scheduled for the next turn of the loop
        self._carrier: _Carrier | None = None  # the parked job whose slot runs the commit
        # the data descriptors a durable commit syncs first, filled in per commit: made once,
        # since one commit runs at a time (ctypes builds an array type per length not in use)
        self._commit_fds = (ctypes.c_int32 * nativeio.COMMIT_FDS_MAX)()
        # slots allocated by this path's jobs and not yet published (or handed to a thread),
        # and the jobs parked until fewer are (see plan); at most half the slab's, once read
        self._writing = RoomQueue()
        self._most_read = False
        # latencies of the stores acknowledged (written; found stored), booked after each batch
        self._booked: list[float] = []
        self._skipped: list[float] = []
        self._lock_waiters = LockWaiters(engine, self._lock_freed)
        self._publishing = 0  # of them, jobs written and waiting for the lock to publish

    def _live(self) -> NvmeTier:
        tier = self._tier()
        if tier is None:  # a call in progress holds its tier: only a bug gets here
            raise TierClosedError("the nvme tier was dropped")
        return tier

    # -- planning --------------------------------------------------------------------------------
    def plan(self, job: Job, slot: int) -> Step:
        # The engine starts more jobs than its I/O bound (a queue ahead of the workers), and a
        # store allocates its slots when planned: at most half the slab is being written at
        # once, as group_size keeps it on threads, so that eviction always finds a victim.
        self._read_most()
        if self._writing.waiting or not self._writing.room(len(job.keys)):
            return self._writing.park(slot, job, self._plan, len(job.keys))
        r = self._plan(job, slot)
        self._kick_soon_if_due()
        return r

    def _kick_soon_if_due(self) -> None:
        if self._kick_due and not self._kick_soon:
            # parked for the journal while the engine plans (no flush follows): commit after
            # this turn of the loop, with the other jobs parked meanwhile
            self._kick_soon = True
            self._engine.call_soon(self._kick_later)

    def _lock_freed(self, slot: int, job: Job, st: _Store | None) -> Step:
        """A job parked for the index lock, again: planned, or published (``st``)."""
        if st is None:  # (withdrawn by LockWaiters instead if its call was cancelled)
            return self.plan(job, slot)
        self._publishing -= 1
        r = self._publish(self._live(), slot, job, st)
        self._kick_soon_if_due()
        return r

    def _read_most(self) -> None:
        """Half the slab's slots, the most being written at once (set once open: read once)."""
        if not self._most_read:
            tier = self._tier()
            if tier is not None:
                self._writing.most = max(1, tier.nslots // 2)
                self._most_read = bool(tier.nslots)

    def _admit(self) -> None:
        """Plan the jobs parked for room while there is some, end those of cancelled calls (on
        the loop thread, outside the engine's own steps; the caller then has the engine pump)."""
        self._read_most()
        self._writing.admit(self._engine)

    def _admit_now(self) -> None:
        self._admit()
        if self._kick_due:
            self._kick()
        self._engine.pump()

    def _plan(self, job: Job, slot: int) -> Step:
        tier = self._live()
        if job.grouped:
            keys, cids, t0 = job.args
        else:
            key, cid, t0 = job.args
            keys, cids = [key], [cid]
        cat = tier._catalog
        if cat is None or not tier._zc_all:  # closed (the thread path says so), or bounce copies
            return self._on_thread(tier, job)
        lock = cat.index.lock
        if not lock.acquire(blocking=False):  # never waited for on the loop thread
            tier._stats.incr("native_index_busy", len(keys))
            return self._lock_waiters.park(lock, slot, job)
        st = _Store(keys, cids, t0)
        try:
            st.slots, failed, st.evict, st.skipped, st.skip_ticket = cat.allocate_many_locked(keys)
        finally:
            lock.release_quiet()
        for p, e in failed.items():
            st.out[p] = e
            tier._end_store(keys[p], t0, e)
        self._writing.used += len(st.slots)
        self._jobs[slot] = st
        if not st.slots:
            return self._acknowledge(tier, slot, job, st)
        try:
            st.runs = _split_by_key_length(tier._slabs.runs(st.slots, tier._run_limit), keys)
            if st.evict and not cat.journal.flushed(st.evict):  # a reused slot's EVICT record first
                return self._park(st.evict, slot, job, st)
            return self._run_fields(tier, slot, job, st)
        except Exception as e:  # never leave the slots allocated
            return self._settle_on_thread(tier, slot, job, st, e)

    def _on_thread(self, tier: NvmeTier, job: Job) -> Continuation:
        if job.grouped:
            return partial(self._engine.blocking, tier._store_group, *job.args)
        return partial(self._engine.blocking, tier._store_job, *job.args)

    def _run_fields(self, tier: NvmeTier, slot: int, job: Job, st: _Store) -> nativeio.JobFields:
        """The descriptor of ``st``'s next runs: one GROUP job of up to ``RUNS_A_TURN`` WRITEV
        jobs, one a run (a store whose slots lie apart makes one round trip through the loop,
        not one a run: a full slab's stores averaged 3.9 runs of 10.7 chunks). Each header
        (checksums left to the worker) in ``slot``'s header blocks, the iovecs, the checksums'
        array, each run at its own place in them (:func:`.bulk.pack_slot_writes`)."""
        slabs, spec = tier._slabs, tier.offloading_spec
        runs = st.runs[st.next : st.next + RUNS_A_TURN]
        st.batch = len(runs)
        H = slabs.hdr_area
        need = sum(map(len, runs))
        area = self._areas.get(slot)
        if area is None or area.slots < need:
            area = self._areas[slot] = IoArea(need, H)
        if not self._view_addr:
            self._view_addr = buffer_address(tier._view)
        pool = self._engine.pool
        assert pool is not None  # planning runs on a started engine
        table, offset = pool.sub_jobs(slot)
        _ops.pack_slot_writes(table, offset, job.priority, runs, st.keys, st.cids, st.slots, slabs.fds, area.hb,
                              area.hb_addr, H, area.iov, area.iov_addr, area.sums_addr, self._view_addr,
                              spec.chunk_bytes, spec.layout_digest)  # fmt: skip
        return pool.packed_group(slot, job.priority, len(runs))

    # -- ends ------------------------------------------------------------------------------------
    def finish(self, job: Job, slot: int, result: int, csum: int, stage: int, info: int) -> Step:
        carrier = self._carrier
        if carrier is not None and carrier.slot == slot:
            return self._commit_ended(result, stage)
        tier = self._live()
        st = self._jobs[slot]
        k, first, pool = st.batch, st.next, self._engine.pool
        assert pool is not None
        runs = st.runs[first : first + k]
        res, offset = pool.sub_outcomes(slot)
        # a group refused whole (its stage set) never ran: its outcome is each run's
        bad = range(k) if stage else _ops.runs_written(res, offset, runs, self._areas[slot].sums, st.csums, st.written)
        if bad:
            self._runs_failed(tier, st, runs, bad, (result, csum, stage, info), res, offset)
        st.next = first + k
        if job.batch.cancelled:  # no next runs: their slots go back
            self._withdraw_runs(st)
        elif st.next < len(st.runs):
            try:
                return self._run_fields(tier, slot, job, st)
            except Exception as e:  # the runs left are not written: their slots go back
                st.bad += [([p for p, _, _, _ in r], e) for r in st.runs[st.next :]]
        return self._publish(tier, slot, job, st)

    # -- a step taken back from the workers (its call cancelled): nothing was written ----------
    def withdrawable(self, job: Job, slot: int) -> bool:
        carrier = self._carrier
        return carrier is None or carrier.slot != slot  # (a journal commit is not the job's)

    def withdraw(self, job: Job, slot: int) -> Continuation:
        """Its runs not written go back (on a slow-path thread, as a failed store's: their
        EVICT records may not be in); what it wrote before is published."""
        st = self._jobs[slot]
        self._withdraw_runs(st)
        return self._settle_on_thread(self._live(), slot, job, st, None)

    def _withdraw_runs(self, st: _Store) -> None:
        runs = st.runs[st.next :]
        st.bad += [([p for p, _, _, _ in run], Withdrawn()) for run in runs]
        st.next = len(st.runs)
        self._engine.withdrawn += sum(map(len, runs))

    def _runs_failed(
        self, tier: NvmeTier, st: _Store, runs: list[Run], bad: Iterable[int], own: tuple[int, int, int, int],
        res: Any, offset: int,
    ) -> None:  # fmt: skip
        """Note why each run in ``bad`` (positions in ``runs``) was not written."""
        for j in bad:
            result, _, stage, _ = own if own[2] else RESULT_LAYOUT.unpack_from(res, offset + j * RESULT_LAYOUT.size)
            run = runs[j]
            if stage == nativeio.ST_WITHDRAWN:  # taken back, its call cancelled: nothing written
                st.bad.append(([p for p, _, _, _ in run], Withdrawn()))
                self._engine.withdrawn += len(run)
                continue
            code = -result if result < 0 else errno.EIO
            what = os.strerror(code) if result < 0 else f"short write ({result} bytes)"
            where = f"{len(run)} slot(s) at offset {run[0][3]} of {tier._slabs.paths[run[0][2]]}"
            st.bad.append(([p for p, _, _, _ in run], OSError(code, f"nvme tier: writing {where} failed: {what}")))

    def _publish(self, tier: NvmeTier, slot: int, job: Job, st: _Store) -> Step:
        """Every run ended: publish what was written (the index lock only tried), then acknowledge."""
        cat = tier._catalog
        if st.bad or cat is None:
            return self._settle_on_thread(tier, slot, job, st, None)
        lock = cat.index.lock
        if not lock.acquire(blocking=False):
            tier._stats.incr("native_index_busy", len(st.written))
            self._publishing += 1
            return self._lock_waiters.park(lock, slot, job, st)
        try:
            last = cat.publish_many_locked(st.keys, st.written, st.slots, st.csums)
        finally:
            lock.release_quiet()
        self._writing.used -= len(st.slots)
        st.ticket = last  # (_acknowledge adds the keys found stored)
        return self._acknowledge(tier, slot, job, st)

    def _acknowledge(self, tier: NvmeTier, slot: int, job: Job, st: _Store) -> Step:
        """Over once the records that published its chunks (or the ones found stored) are in
        the journal; parked until then."""
        st.acking = True
        st.ticket = max(st.ticket, st.skip_ticket)
        cat = tier._catalog
        if st.ticket and (cat is None or not cat.journal.flushed(st.ticket)):
            return self._park(st.ticket, slot, job, st)
        self._over(tier, slot, job, st)
        self._book(tier)  # (rare: its records were in already) before its caller may look
        return None

    def _over(self, tier: NvmeTier, slot: int, job: Job, st: _Store) -> None:
        del self._jobs[slot]
        dt = perf_counter() - st.t0
        self._booked += [dt] * len(st.written)
        self._skipped += [dt] * len(st.skipped)
        for p in st.skipped:
            st.out[p] = SKIPPED
        _set_outcome(job, st.out)

    def _book(self, tier: NvmeTier) -> None:
        """Count the stores acknowledged since the last time, under one lock."""
        if self._booked or self._skipped:
            booked, skipped = self._booked + self._skipped, len(self._skipped)
            self._booked, self._skipped = [], []
            tier._stats.record_each("offload", tier.offloading_spec.chunk_bytes, booked, skipped=skipped)

    def _settle_on_thread(
        self, tier: NvmeTier, slot: int, job: Job, st: _Store, err: BaseException | None
    ) -> Continuation:
        """The rest of ``st`` by the threads path's steps on a slow-path thread: free the slots
        not written (all of them with ``err``: their EVICT records may not be in), publish and
        wait for the others, the keys found stored."""
        del self._jobs[slot]
        self._writing.used -= len(st.slots)
        if self._writing.waiting:  # room freed here may be all there is: admit after this step
            self._engine.call_soon(self._admit_now)

        def settle() -> Outcomes:
            keys, t0, out = st.keys, st.t0, st.out
            if err is not None:
                tier._abort_group(keys, list(st.slots), st.slots, out, err, t0, st.evict)
            else:
                for ps, e in st.bad:
                    tier._abort_group(keys, ps, st.slots, out, e, t0, st.evict)
                tier._publish_group(keys, t0, out, st.slots, st.written, st.csums)
            tier._settle_skipped(keys, t0, out, st.skipped, st.skip_ticket)
            return out

        engine = self._engine
        withdrawn = not st.written and job.batch.cancelled

        async def rest() -> Any:
            if withdrawn:
                # no chunk I/O (the index, journal records): neither behind the I/O tokens nor
                # on the engine's threads, which slow paths holding or awaiting tokens may fill
                out = await run_on_thread_to_end(settle)
            else:
                out = await engine.blocking(settle)
            return out if job.grouped else _raise_first(out)

        return rest

    # -- the journal: one commit for every job parked ------------------------------------------
    # A commit is a worker job (COMMIT: the records written, synced when durable) run as the
    # next step of one of the parked jobs, the carrier: its end comes back with the batch of
    # ends it is in, not through a thread and a wake-up of its own. A thread does it when the
    # journal is being written by someone else (a slow path's wait, a checkpoint's rotation).
    def _park(self, ticket: int, slot: int, job: Job, st: _Store) -> Parked:
        """Park until record ``ticket`` is in the journal; the commit starts once the batch
        being planned or booked is done (flush, or the next turn of the loop), so the jobs
        parked meanwhile share it."""
        st.ticket = ticket
        self._parked.append((ticket, slot, job, st))
        self._kick_due = True
        return PARKED

    def _kick_later(self) -> None:
        self._kick_soon = False
        if self._kick_due:
            self._kick()
            self._engine.pump()

    def _kick(self) -> None:
        """Start a commit for the parked jobs unless one runs (the caller has the engine pump)."""
        self._kick_due = False
        if self._committing or not self._parked:
            return
        writing = len(self._jobs) - len(self._parked) - self._publishing
        if 2 * len(self._parked) < writing:
            # most stores are still writing: their ends (each followed by a flush, which calls
            # this again) join this commit, rather than one commit, a worker job and a wake-up
            # of the loop, per store
            self._kick_due = True
            return
        tier = self._tier()
        cat = tier._catalog if tier is not None else None
        executor = self._engine.executor
        if cat is None or executor is None:  # the parked jobs hold the engine and the tier open
            self._committed(0, TierClosedError("the nvme tier closed with stores waiting for its journal"), pump=False)
            return
        lock = cat.index.lock
        if lock.acquire(blocking=False):  # (never waited for on the loop thread; else not this time)
            try:
                cat.evict_ahead_locked()  # its records go with this commit
            finally:
                lock.release_quiet()
        journal = cat.journal
        fds = journal.data_fds if journal.durable else []
        claim = journal.claim() if len(fds) <= nativeio.COMMIT_FDS_MAX else None
        self._committing = True
        if claim is not None:
            _, slot, job, _ = self._parked[-1]
            fd_array = self._commit_fds
            for i, fd in enumerate(fds):
                fd_array[i] = fd
            # the records read in place (a bytes object does not move; the carrier holds it),
            # not copied into a ctypes array of their length (a new array type for each length
            # not in use: about 8 µs, and a cyclic object for the collector)
            data = ctypes.cast(ctypes.c_char_p(claim.data), ctypes.c_void_p).value
            assert data is not None  # (a bytes object's own buffer)
            self._carrier = _Carrier(slot, journal, claim)
            # nativeio.fields written out: the records at their offset, the data synced first when durable
            self._engine.resume(slot, job, (nativeio.COMMIT, PRIO_LOAD, -1, 0, journal.fd, -1, int(journal.durable),
                                            0, 0, 0, ctypes.addressof(fd_array), len(fds), data,
                                            len(claim.data), claim.start, b"", b"", b""))  # fmt: skip
            return
        try:
            executor.submit(self._commit, journal, journal.appended)
        except RuntimeError as e:  # shut down
            self._committing = False
            self._committed(0, e, pump=False)

    def _commit_ended(self, result: int, stage: int) -> Step:
        """The carrier's COMMIT job ended (inside the engine's batch of ends: no pump here)."""
        c = self._carrier
        assert c is not None
        self._carrier = None
        if not stage and result == len(c.claim.data):
            c.journal.claimed(c.claim)
            self._committing = False
            self._committed(c.claim.target, None, c.journal, pump=False)
            return PARKED  # the carrier too went on (or stays parked) in _committed
        code = -result if result < 0 else errno.EIO
        err = OSError(code, f"nvme journal {c.journal.path(c.journal.gen)}: writing its records failed: "
                            f"{os.strerror(code) if result < 0 else f'short write ({result} bytes)'}")  # fmt: skip
        executor = self._engine.executor
        assert executor is not None  # the carrier holds the engine running
        executor.submit(self._claim_failed, c.journal, c.claim, err)
        return PARKED  # the carrier stays parked with the others: they hear of it together

    def _claim_failed(self, journal: Journal, claim: Claim, err: BaseException) -> None:
        """(a slow-path thread) A failed commit: cut the journal back, then tell the loop."""
        try:
            journal.claim_failed(claim, err)
        finally:
            self._engine.call_soon_threadsafe(partial(self._committed_for, journal, claim.target, err))

    def _commit(self, journal: Journal, target: int) -> None:
        """(a slow-path thread) Write the journal up to ``target``, then tell the loop."""
        err: BaseException | None = None
        try:
            journal.wait(target)
        except BaseException as e:
            err = e
        self._engine.call_soon_threadsafe(partial(self._committed_for, journal, target, err))

    def _committed_for(self, journal: Journal, target: int, err: BaseException | None) -> None:
        self._committing = False
        self._committed(target, err, journal)

    def _committed(
        self, target: int, err: BaseException | None, journal: Journal | None = None, *, pump: bool = True
    ) -> None:
        """(the loop thread) Let the parked jobs whose records are in go on; fail those a failed
        commit covered (``err``); commit again for the others."""
        parked, self._parked = self._parked, []
        tier = self._tier()
        if err is None:
            # each ticket up to this one is in: a later one was queued after the commit began
            upto = journal.flushed_upto() if journal is not None else sys.maxsize
            for item in parked:
                if item[0] > upto:
                    self._parked.append(item)  # the next commit's
                else:
                    _, slot, job, st = item
                    self._go_on(tier, slot, job, st, None)
        else:
            for item in parked:
                if item[0] > target > 0:
                    self._parked.append(item)  # a later commit may succeed
                else:
                    _, slot, job, st = item
                    self._go_on(tier, slot, job, st, err)
        if tier is not None:
            self._book(tier)
        self._admit()
        if self._parked:
            self._kick()
        if pump:
            self._engine.pump()  # the steps resumed and the jobs let in, in one submission

    def _go_on(self, tier: NvmeTier | None, slot: int, job: Job, st: _Store, err: BaseException | None) -> None:
        engine = self._engine
        if tier is None:  # only a bug gets here (a call holds its tier): end the job failed
            self._jobs.pop(slot, None)
            job.exc = TierClosedError("the nvme tier was dropped")
            engine.unpark(slot, job)
            return
        if not st.acking:  # waited for the EVICT records: write now, or give the slots back
            if err is None and job.batch.cancelled:  # its call cancelled meanwhile: nothing written
                self._withdraw_runs(st)
            elif err is None:
                try:
                    engine.resume(slot, job, self._run_fields(tier, slot, job, st))
                    return
                except Exception as e:  # as in _plan: never leave the slots allocated (nor the job parked)
                    err = e
            engine.unpark(slot, job, self._settle_on_thread(tier, slot, job, st, err))
            return
        if err is not None:  # as the threads path: the stores it covered fail
            for p in st.written + st.skipped:
                st.out[p] = err
                tier._end_store(st.keys[p], st.t0, err)
            st.written, st.skipped = [], []
        self._over(tier, slot, job, st)
        engine.unpark(slot, job)

    def flush(self) -> None:
        """After a batch of ends: count the stores acknowledged, plan the jobs that waited for
        room, start a commit for the jobs parked."""
        tier = self._tier()
        if tier is not None:
            self._book(tier)
        if self._writing.waiting:
            self._admit()
        if self._kick_due:
            self._kick()


def _split_by_key_length(runs: list[Run], keys: list[bytes]) -> list[Run]:
    """``runs`` cut where the key length changes: a WRITEV job's headers share one length."""
    if len(set(map(len, keys))) == 1:  # the usual case: one hash size
        return runs
    out: list[Run] = []
    for run in runs:
        start = 0
        for i in range(1, len(run)):
            if len(keys[run[i][0]]) != len(keys[run[i - 1][0]]):
                out.append(run[start:i])
                start = i
        out.append(run[start:] if start else run)
    return out


def _set_outcome(job: Job, out: Outcomes) -> None:
    if job.grouped:
        job.result = out
    elif isinstance(out[0], BaseException):
        job.exc = out[0]
    else:
        job.result = out[0]  # None, or SKIPPED


def _raise_first(out: Outcomes) -> Skipped | None:
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]
