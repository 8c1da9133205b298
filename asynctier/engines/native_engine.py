"""The native engine: a call's chunk jobs reach the C workers in batches, and their ends come
back in batches.

Why: a coroutine, an event, a task wake-up and a round of bookkeeping per chunk cost the event
loop's thread 40-100 us per chunk (bench/bench_loop_cpu.py), CPU taken from the server the
library lives in. Here a tier gives, per operation, a :class:`~.fastpath.FastPath`: ``plan`` turns a
job into one worker descriptor on the loop thread, synchronously; ``finish`` books its
outcome, synchronously, when the workers report it. The engine plans every job it may start
(up to :attr:`NativeEngine.slots` at once) and hands them to the pool in one call
(:meth:`NativePool.submit_many`), each call's jobs as one group: the workers wake the loop
when the group's last job ends, or when their queue runs low while jobs wait here, not once
per chunk. A call's waiter wakes once (its :class:`~asynctier.core.jobs.Batch`). A tier
whose planning costs much per chunk bounds the chunks planned in one turn of the loop
(:attr:`NativeEngine.plan_chunks`), so that one large call does not hold the loop.

Whatever is not the plain case (a key being deleted, victims to evict, an index still being
rebuilt, a failure to retry on a thread) becomes a *continuation*: a coroutine run by one of
the engine's service coroutines, as every job ran before. A job that waits for something
other than the workers (the nvme journal) is *parked*: it keeps its slot until its path
resumes it with a next step or ends it. The bound is the pool's I/O
tokens (a slow path on a thread holds one too); loads go ahead of queued stores both here
(one priority queue) and in the pool (its priority queues); a cancelled caller withdraws the
jobs not started and waits for the others (docs/cancellation.md).
"""

from __future__ import annotations

import concurrent.futures
import errno
import heapq
import logging
import os
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import anyio

from ..core.backend import (
    LoopCaller,
    current_loop,
    loop_soon,
    own_cancellation,
    run_on_thread_to_end,
    spawn_service,
    wait_uninterrupted,
)
from ..core.jobs import CANCELLED, DONE, Batch, Job
from ..core.ops import PRIO_LOAD, Op
from .base import LoopEngine, abandoned, orphaned, refuse_close_elsewhere, refuse_other_loop
from .fastpath import PARKED, Continuation, FastPath, Parked, Step
from .native import JobFields, NativePool
from .threads import EngineStoppedError

__all__ = ["NativeEngine"]

T = TypeVar("T")

log = logging.getLogger(__name__)


def _queue_ahead(bound: int) -> int:
    """Jobs the pool may hold at once: the bound plus as many again (at least 8), so that a
    worker finds its next job queued when it ends one."""
    return bound + max(bound, 8)


class NativeEngine(LoopEngine):
    """The runtime's engine for a :class:`NativePool`: jobs of the operations in :attr:`fast`
    are planned and booked on the loop thread around one pool call per batch; the others, and
    continuations, run on :attr:`slots` service coroutines. Slow paths run on
    :attr:`executor` threads, each holding an I/O token (:meth:`blocking`).

    ``in_flight``, ``peak_in_flight`` and ``workers`` report the bound's view (tokens).
    ``nice``: see :class:`NativePool`; ``plan_chunks``: see :attr:`plan_chunks`.
    """

    def __init__(self, bound: int, name: str = "asynctier", nice: int = 0, plan_chunks: int | None = None) -> None:
        super().__init__(_queue_ahead(bound), name)
        self.bound = bound
        self.nice = nice
        #: jobs started at once (in the pool, or as continuations)
        self.slots = _queue_ahead(bound)
        #: group jobs whose ends wake the loop once (see _group_of)
        self.wake_every = max(1, bound // 4)
        #: chunks of new jobs planned in one turn of the loop at most (at least one job; None:
        #: as many as there are slots for): the rest in the next turns, so that the loop's
        #: other callbacks run in between (a tier whose planning costs much per chunk sets it)
        self.plan_chunks = sys.maxsize if plan_chunks is None else max(1, plan_chunks)
        self._pump_soon = False
        #: the tier's fast paths, by operation
        self.fast: dict[Op, FastPath] = {}
        self.pool: NativePool | None = None
        self.executor: concurrent.futures.ThreadPoolExecutor | None = None
        #: wake-ups of the loop by the workers (each reaps every job ended so far)
        self.wakeups = 0
        #: chunks of cancelled calls whose I/O never began (the tiers' paths count them)
        self.withdrawn = 0
        self._last = (0, 0, 0)
        self._free_slots: list[int] = []
        self._started = 0  # jobs started and not over
        self._stores_in_pool = 0  # jobs in the pool that a load goes ahead of
        # groups of jobs whose last end wakes the loop (a call's jobs started together): the
        # free numbers, the jobs left in each, the group of the job in each slot
        self._groups = list(range(self.slots))
        self._group_left = [0] * self.slots
        self._slot_group = [0] * self.slots
        self._slot_path: list[FastPath | None] = [None] * self.slots
        self._paths: list[FastPath] = []  # those in fast, once started
        self._low_water = -1  # as last told to the pool
        self._slow: deque[tuple[Job, Continuation]] = deque()
        self._next: list[tuple[int, Job, JobFields]] = []  # jobs' next steps, to submit with the next batch
        self._idle: list[anyio.Event] = []
        self._running_workers = 0
        self._soon: LoopCaller | None = None

    def start(self) -> None:
        # more threads than tokens: those beyond the bound hash while the others do I/O
        threads = self.bound + min(self.bound, os.cpu_count() or 1)
        pool = NativePool(threads, self.bound, self.slots, self.nice)
        pool.on_done = self._ended_in_pool
        pool.on_reaped = self._reaped
        pool.attach()
        self.pool = pool
        self._free_slots = pool.free_slots
        self._paths = list(dict.fromkeys(self.fast.values()))
        self.executor = concurrent.futures.ThreadPoolExecutor(self.bound, thread_name_prefix=f"{self._name}-slow")
        self._bind_loop()
        self._soon = loop_soon()
        for i in range(self.slots):
            self._running_workers += 1
            spawn_service(self._work, name=f"{self._name}-io-{i}")

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a slow-path thread holding an I/O token; runs to its end even if
        the caller is cancelled (it may touch the caller's buffer)."""
        assert self.pool is not None
        return await run_on_thread_to_end(self.pool.hold, fn, *args, executor=self.executor)

    # -- jobs in -------------------------------------------------------------------------------
    def submit(self, jobs: Iterable[Job]) -> None:
        if self._stopping or self._ended is None:
            raise EngineStoppedError("engine is not running")
        refuse_other_loop(self._name, self._loop, current_loop())
        heap = self._heap
        n = len(heap)
        if n:
            for job in jobs:
                heapq.heappush(heap, (job.priority, job.seq, job))
        else:  # one call's jobs: one priority, in order, so the list is a heap as it is
            heap.extend([(job.priority, job.seq, job) for job in jobs])
        n = len(heap) - n
        if n:
            self._queued += n
            self._pump()

    def _pump(self) -> None:
        """Start queued jobs while slots are free: the fast ones planned and handed to the
        pool in one call, the others to the service coroutines."""
        pool = self.pool
        assert pool is not None
        slot_group, slot_path = self._slot_group, self._slot_path
        planned = 0
        while self._next or (self._heap and self._started < self.slots and planned < self.plan_chunks):
            batch: list[tuple[int, int, Any, JobFields]] = []
            # per call (its jobs share a batch and an operation): its fast path, its group
            calls: dict[Batch, tuple[FastPath | None, list[int]]] = {}
            nexts, self._next = self._next, []
            for held, started, step in nexts:  # the next step of jobs already started (their slots held)
                call = calls.get(started.batch)
                if call is None:
                    call = calls[started.batch] = (slot_path[held], [])
                group = self._group_of(started, call[1])
                slot_group[held] = group
                if started.priority != PRIO_LOAD:
                    self._stores_in_pool += 1
                batch.append((held, group, started, step))
            while self._heap and self._started < self.slots and planned < self.plan_chunks:
                job = self._claim()
                if job is None:
                    break
                self._started += 1
                planned += len(job.keys)
                call = calls.get(job.batch)
                if call is None:
                    call = calls[job.batch] = (self.fast.get(job.op), [])
                path = call[0]
                if path is None:
                    self._continue(job, _body(job))
                    continue
                slot = pool.take_slot()
                try:
                    r = path.plan(job, slot)
                except BaseException as e:  # delivered to the caller as that chunk's failure
                    job.exc, r = e, None
                if type(r) is tuple:
                    group = self._group_of(job, call[1])
                    slot_group[slot] = group
                    slot_path[slot] = path
                    if job.priority != PRIO_LOAD:
                        self._stores_in_pool += 1
                    batch.append((slot, group, job, r))
                    continue
                if r is PARKED:
                    slot_path[slot] = path
                    continue
                pool.put_slot(slot)
                if r is None:
                    self._over(job)
                else:
                    self._continue(job, r)  # type: ignore[arg-type]
            if batch:
                try:
                    refused = pool.submit_many(batch)  # refused: the pool is shutting down
                except Exception:
                    # a descriptor the pool cannot take is a bug: its jobs end as failed
                    # first steps (the slow path does them again) rather than wait for ever
                    log.exception("%s: native I/O submission failed; its jobs go the slow way", self._name)
                    for slot, _, _, _ in batch:
                        pool.forget(slot)
                    refused = [(slot, job, errno.EINVAL) for slot, _, job, _ in batch]
                for slot, job, err in refused:
                    self._ended_in_pool(job, slot, -err, 0, 1, 0)
                if refused:  # ends with no wake-up of their own: what their paths parked for room goes on
                    for path in self._paths:
                        path.flush()
        if planned >= self.plan_chunks and self._heap and self._started < self.slots and not self._pump_soon:
            self._pump_soon = True
            assert self._soon is not None
            self._soon(self._pump_later)
        # jobs waiting here are let in when the pool's queue runs low; a load at the next end
        # while stores are queued there (it goes ahead of them)
        heap = self._heap
        if not heap:
            want = -1
        elif heap[0][0] == PRIO_LOAD and self._stores_in_pool:
            want = self.slots
        else:
            want = self.bound // 2
        if want != self._low_water:
            self._low_water = want
            pool.set_low_water(want)

    def _pump_later(self) -> None:
        self._pump_soon = False
        if self.pool is not None and (self._heap or self._next):
            self._pump()

    def _group_of(self, job: Job, call_group: list[int]) -> int:
        """The wake-up group of ``job``'s next step in the pool, ``call_group`` being its call's
        current one (id, jobs in it): the workers wake the loop when a group's last job ends.
        One chunk jobs: the call's one group. Group jobs, each many chunks: groups of
        :attr:`wake_every`, so that a group job's next run, and its caller's progress, do not
        wait for all of the call's other jobs."""
        if not call_group or (job.grouped and call_group[1] >= self.wake_every):
            call_group[:] = [self._groups.pop(), 0]  # as many as slots: one is free
        call_group[1] += 1
        group = call_group[0]
        self._group_left[group] += 1
        return group

    # -- jobs out ------------------------------------------------------------------------------
    def _left_pool(self, job: Job, slot: int) -> None:
        """``job``'s step in ``slot`` is out of the pool (ended, or taken back): its counts."""
        if job.priority != PRIO_LOAD:
            self._stores_in_pool -= 1
        group = self._slot_group[slot]
        self._group_left[group] -= 1
        if not self._group_left[group]:
            self._groups.append(group)

    def _ended_in_pool(self, job: Job, slot: int, result: int, csum: int, stage: int, info: int) -> None:
        self._left_pool(job, slot)
        try:
            r = self._slot_path[slot].finish(job, slot, result, csum, stage, info)  # type: ignore[union-attr]
        except BaseException as e:
            job.exc, r = e, None
        if type(r) is tuple:  # its next step, in the same slot: with the next batch
            self._next.append((slot, job, r))
            return
        if r is PARKED:
            return
        self._free_slots.append(slot)  # NativePool.put_slot
        if r is not None:
            self._continue(job, r)  # type: ignore[arg-type]
            return
        # _over and Batch.one_done written out: this runs per chunk
        job.state = DONE
        self._started -= 1
        self._in_flight -= 1
        b = job.batch
        b.remaining -= 1
        if not b.remaining:
            b.event.set()
        if self._stopping and not self._started and not self._queued:
            self._wake_all()

    # -- a cancelled call ------------------------------------------------------------------------
    def withdraw(self, jobs: Iterable[Job]) -> None:
        """The call of ``jobs`` is cancelled: its jobs still queued here are withdrawn, and
        so are its steps handed to the workers that none has started (each path undoes its
        plan); a job of several steps starts no next one (``Batch.cancelled``). The running
        ones end as usual (docs/cancellation.md)."""
        jobs = list(jobs)
        self.cancel_pending(jobs)
        if not jobs:
            return
        batch = jobs[0].batch
        batch.cancelled = True
        pool = self.pool
        if pool is None or not batch.remaining:
            return
        slot_path = self._slot_path

        def ours(slot: int, owner: Any) -> bool:
            path = slot_path[slot]
            return type(owner) is Job and owner.batch is batch and path is not None and path.withdrawable(owner, slot)

        taken, cut = pool.take_back(ours)
        # the latest planned first: a tier that puts what planning took back in front of its
        # order (the fs tier's victims) then keeps the earlier ones ahead of the later ones
        for slot, job in sorted(taken, key=lambda t: t[1].seq, reverse=True):
            self._taken_back(job, slot)
        if taken or cut:
            pool.reap_now()  # (it pumps)
        if batch.remaining:  # its jobs a path parked (waiting for room) end at the path's flush
            try:
                for path in self._paths:
                    path.flush()
                self.pump()
            except Exception:  # a bug: logged; the caller still waits for its jobs running
                log.exception("%s: ending a cancelled call's parked jobs failed", self._name)

    def _taken_back(self, job: Job, slot: int) -> None:
        """``job``'s step in ``slot`` never ran: its path undoes its plan (and counts the chunks
        in :attr:`withdrawn`); it is over."""
        self._left_pool(job, slot)
        try:
            r = self._slot_path[slot].withdraw(job, slot)  # type: ignore[union-attr]
        except BaseException as e:  # a bug: logged, the job is over all the same
            log.exception("%s: undoing a withdrawn job's plan failed", self._name)
            job.exc, r = e, None
        self._free_slots.append(slot)  # NativePool.put_slot
        if r is not None:
            self._continue(job, r)
        else:
            self._over(job, CANCELLED)

    # -- parked jobs (on the loop thread) -------------------------------------------------------
    # (neither submits anything: call pump() once after a batch of them, so that their steps and
    # the jobs their slots let in reach the workers in one call, as one wake-up group)
    def resume(self, slot: int, job: Job, step: JobFields) -> None:
        """Run the next step of ``job``, parked in ``slot``, with the next batch."""
        self._next.append((slot, job, step))

    def unpark(self, slot: int, job: Job, then: Continuation | None = None) -> None:
        """``job``, parked in ``slot``, is over (its outcome set), or goes on as ``then``."""
        self._free_slots.append(slot)
        if then is not None:
            self._continue(job, then)
        else:
            self._over(job)

    def withdraw_parked(self, slot: int, job: Job) -> None:
        """``job``, parked in ``slot`` and never planned, is over as withdrawn: its call is
        cancelled (its outcome, if read, is the cancellation, never a success)."""
        self._free_slots.append(slot)
        self._over(job, CANCELLED)

    def go_on(self, slot: int, job: Job, step: Step) -> None:
        """``job``, parked in ``slot``, goes on with ``step`` as a path's ``plan`` or
        ``finish`` returns it: :meth:`resume` or :meth:`unpark`, or nothing while parked."""
        if type(step) is tuple:
            self.resume(slot, job, step)
        elif step is None:
            self.unpark(slot, job)
        elif not isinstance(step, Parked):
            self.unpark(slot, job, step)  # type: ignore[arg-type]

    def pump(self) -> None:
        """Submit what :meth:`resume` and :meth:`unpark` left to do (on the loop thread, not
        from inside a path's ``plan`` or ``finish``)."""
        if self._heap or self._next:
            self._pump()

    def call_soon(self, fn: Callable[[], object]) -> None:
        """``fn()`` on the loop thread after the callbacks ready now; from the loop thread
        only (asyncio: no write to its self-pipe, as :meth:`call_soon_threadsafe` makes)."""
        assert self._soon is not None
        self._soon(fn)

    def call_soon_threadsafe(self, fn: Callable[[], object]) -> None:
        """``fn()`` on the loop thread, from any thread (dropped once the loop is gone)."""
        assert self._call is not None
        self._call(fn)

    def _reaped(self) -> None:
        self.wakeups += 1
        for path in self._paths:
            path.flush()
        if self._heap or self._next:
            self._pump()

    def _over(self, job: Job, state: int = DONE) -> None:
        job.state = state
        self._started -= 1
        self._in_flight -= 1
        job.batch.one_done()
        if self._stopping and not self._started and not self._queued:
            self._wake_all()

    def _continue(self, job: Job, fn: Continuation) -> None:
        self._slow.append((job, fn))
        if self._idle:
            self._idle.pop().set()

    async def _work(self) -> None:
        slow = self._slow
        cancelled = own_cancellation()
        try:
            while True:
                if slow:
                    job, fn = slow.popleft()
                    try:
                        job.result = await fn()
                    except anyio.get_cancelled_exc_class() as e:
                        # workers are not cancelled by callers: the loop ending, or a cancelled future inside
                        job.exc = ConnectionAbortedError(f"chunk I/O cancelled inside the tier: {e!r}")
                    except BaseException as e:  # delivered to the caller as that chunk's failure
                        job.exc = e
                    self._over(job)
                    del job, fn  # an idle worker must not keep the last job (and through it the tier) alive
                    cancelled()  # this worker's own (its loop ends), whatever the job made of it: out
                    if self._heap:
                        self._pump()
                    continue
                if self._stopping and not self._started and not self._queued:
                    break
                wake = anyio.Event()
                self._idle.append(wake)
                await wake.wait()
        finally:
            # also when the loop ends, cancelling the workers as they wait for work: the last one
            # out refuses new jobs and fails the continuations left (as the tasks engine does)
            self._running_workers -= 1
            if self._running_workers == 0:
                self._stopping = True
                while slow:
                    job, _ = slow.popleft()
                    job.exc = abandoned()
                    self._over(job)
                if self._ended is not None:
                    self._ended.set()

    # -- counters and teardown -------------------------------------------------------------------
    def _pool_counts(self) -> tuple[int, int, int]:
        if self.pool is not None:
            self._last = self.pool.counts()
        return self._last

    @property
    def in_flight(self) -> int:
        return self._pool_counts()[0]

    @property
    def peak_in_flight(self) -> int:
        return self._pool_counts()[1]

    @property
    def queued(self) -> int:
        return self._queued + self._pool_counts()[2]

    @property
    def workers(self) -> int:
        return self.bound

    def _wake_all(self) -> None:
        idle, self._idle = self._idle, []
        for wake in idle:
            wake.set()

    def stop_nowait(self) -> None:
        """Tell the engine to end once its jobs are over (from any thread), without waiting;
        its slow-path threads end once their queue is empty (the finalizer of a tier dropped
        open calls this: they were left waiting until a collection found the engine)."""
        if not self._stopping:
            self._stopping = True
            if self._call is not None:
                self._call(self._wake_all)
        if self.pool is not None:
            self.pool.abandon()
        if self.executor is not None:
            self.executor.shutdown(wait=False)

    def check_stop_here(self) -> None:
        """Raise :class:`TierStateError` where :meth:`stop` cannot run (see :func:`.base.orphaned`)."""
        refuse_close_elsewhere(self._name, self._loop)

    async def stop(self) -> None:
        """Let the jobs started and queued end, then the service coroutines, then the pool."""
        self._stopping = True
        if orphaned(self._name, self._loop):
            # the loop it served is gone, and its service coroutines with it: nothing reaps
            # the workers' ends. A slow-path job still running (it may write the caller's
            # buffer, and holds a token) ends first; the workers finish theirs, then are joined
            executor, self.executor = self.executor, None
            if executor is not None:
                await run_on_thread_to_end(executor.shutdown)
            pool, self.pool = self.pool, None
            if pool is not None:
                await pool.aclose_orphaned()
            return
        self._wake_all()
        if self._ended is not None and self._running_workers:
            await wait_uninterrupted(self._ended)
        pool, self.pool = self.pool, None
        if pool is not None:
            self._last = pool.counts()
            await pool.aclose()
        executor, self.executor = self.executor, None
        if executor is not None:
            executor.shutdown(wait=False)


def _body(job: Job) -> Continuation:
    """A job without a fast path: its own coroutine body."""

    def run() -> Awaitable[Any]:
        return job.fn(*job.args)  # type: ignore[no-any-return]

    return run
