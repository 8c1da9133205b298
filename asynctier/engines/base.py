"""What the scheduler needs from an engine (:class:`Engine`), and the counters every engine keeps.

An engine runs :class:`~asynctier.core.jobs.Job` objects under the tier's bound, lowest
priority first (loads ahead of queued stores). :meth:`Engine.run` is the whole life of one
call's jobs, cancellation included: when the awaiting task is cancelled, the pending jobs are
withdrawn, the running ones finish, and only then does the cancellation go on.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from typing import Protocol

import anyio

from ..core import backend
from ..core.backend import Event, LoopCaller, current_loop, event_class, loop_caller, loop_running, wait_uninterrupted
from ..core.jobs import CANCELLED, DONE, PENDING, RUNNING, Batch, Job
from ..core.ops import Op
from ..errors import TierStateError

__all__ = ["DropHandler", "Engine", "EngineCounters", "LoopEngine", "new_batch_of", "refuse_other_loop"]

#: Called with the store jobs withdrawn because no I/O slot came in time (``store_backpressure="drop"``).
DropHandler = Callable[[list[Job]], None]


class Engine(Protocol):
    """What a tier needs from an engine."""

    @property
    def in_flight(self) -> int: ...
    @property
    def peak_in_flight(self) -> int: ...
    @property
    def queued(self) -> int: ...
    @property
    def workers(self) -> int: ...
    def start(self) -> None: ...
    async def run(
        self, jobs: list[Job], *, drop_after: float | None = None, on_drop: DropHandler | None = None
    ) -> None:
        """Run ``jobs`` (one call's, sharing one batch); return when each is done or withdrawn.

        ``drop_after``: seconds after which jobs still waiting for a slot are withdrawn and
        handed to ``on_drop``. On cancellation: withdraw the pending jobs, wait for the running
        ones, re-raise.
        """
        ...

    def cancel_pending(self, jobs: Iterable[Job]) -> list[Job]: ...
    def withdraw(self, jobs: Iterable[Job]) -> None:
        """The call of ``jobs`` is cancelled: withdraw every job of it that no worker started."""
        ...

    async def stop(self) -> None: ...
    def stop_nowait(self) -> None: ...


class EngineCounters:
    """Counters every engine keeps, read by ``stats()`` without a lock (ints: GIL-atomic)."""

    def __init__(self, workers: int, name: str) -> None:
        self._workers = workers
        self._name = name
        self._in_flight = 0
        self._peak = 0
        self._queued = 0
        self._stopping = False
        # (priority, seq, job): tuples compare in C; seq is unique, so jobs are never compared
        self._heap: list[tuple[int, int, Job]] = []

    def new_batch(self, size: int, op: Op) -> Batch:
        """The :class:`~asynctier.core.jobs.Batch` of a call of ``size`` jobs (on its loop).
        Optional for an :class:`Engine` (a tier makes a plain ``Batch`` where it is missing): an
        engine bound to one loop gives that loop's own event (:func:`new_batch_of`)."""
        return Batch(size)

    def _claim(self) -> Job | None:
        """The next pending job off the queue, marked running and counted; None when none is
        left (the threads engine calls this under its lock)."""
        heap = self._heap
        while heap:
            job = heapq.heappop(heap)[2]
            if job.state == PENDING:
                job.state = RUNNING
                self._queued -= 1
                self._in_flight += 1
                if self._in_flight > self._peak:
                    self._peak = self._in_flight
                return job
        return None

    def _abort_queued(self) -> None:
        """Fail every job still queued: no worker is left to run it (its loop ended)."""
        while (job := self._claim()) is not None:
            job.exc = abandoned()
            self._in_flight -= 1
            job.state = DONE
            job.batch.one_done()

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def peak_in_flight(self) -> int:
        return self._peak

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def workers(self) -> int:
        return self._workers

    # -- what every engine does with one call's jobs ---------------------------------------
    def submit(self, jobs: Iterable[Job]) -> None:
        raise NotImplementedError

    def cancel_pending(self, jobs: Iterable[Job]) -> list[Job]:
        """Withdraw the jobs not started yet; for engines whose queue lives on the loop thread
        (the threads engine takes its lock around the same steps)."""
        taken = [j for j in jobs if j.state == PENDING]
        for j in taken:
            j.state = CANCELLED
            j.batch.one_done()
        self._queued -= len(taken)
        return taken

    def withdraw(self, jobs: Iterable[Job]) -> None:
        """The call of ``jobs`` is cancelled: withdraw its jobs not started (here, those queued
        on the loop thread; an engine that hands jobs to its workers ahead takes those back too)."""
        self.cancel_pending(jobs)

    async def run(
        self, jobs: list[Job], *, drop_after: float | None = None, on_drop: DropHandler | None = None
    ) -> None:
        """Queue ``jobs`` for the workers and wait until each is done or withdrawn (the one
        cancellation primitive: docs/cancellation.md)."""
        if not jobs:
            return
        done = jobs[0].batch.event
        made_in = backend.fork_generation()
        self.submit(jobs)
        try:
            if drop_after is not None:
                with anyio.move_on_after(drop_after):
                    await done.wait()
                if not done.is_set() and on_drop is not None:
                    on_drop(self.cancel_pending(jobs))
            if done.is_set():  # every job ended in submit: a checkpoint all the same, as anyio's wait
                await anyio.lowlevel.checkpoint()
            else:
                await done.wait()
        except BaseException:
            # No new I/O of this call starts; I/O already running touches the caller's
            # buffer, so the caller hears of the cancellation only once it has finished. The
            # same for a KeyboardInterrupt (trio raises it into the task that waits here).
            self.withdraw(jobs)
            if backend.fork_generation() == made_in:  # (forked: the I/O is the parent's, never ends here)
                await wait_uninterrupted(done)
            raise


class LoopEngine(EngineCounters):
    """An engine whose workers serve the event loop it started on (:meth:`_bind_loop`, from
    ``start``): its calls' batches carry that loop's own event and caller."""

    def __init__(self, workers: int, name: str) -> None:
        super().__init__(workers, name)
        self._loop: object = None
        self._call: LoopCaller | None = None
        self._new_event: Callable[[], Event] | None = None
        self._ended: anyio.Event | None = None  # set once the workers have ended (stop waits on it)

    def _bind_loop(self) -> None:
        """(``start``, on the loop served) That loop, its caller and its event class."""
        self._loop = current_loop()
        self._call = loop_caller()
        self._new_event = event_class()
        self._ended = anyio.Event()

    def new_batch(self, size: int, op: Op) -> Batch:
        """A call's batch with this loop's own event and caller, made once at start (the loop
        its workers serve: another loop's call is refused at submit)."""
        if self._new_event is None or self._call is None:
            return Batch(size)
        return Batch(size, self._new_event(), self._call)


def new_batch_of(engine: Engine) -> Callable[[int, Op], Batch]:
    """How ``engine`` makes a call's :class:`~asynctier.core.jobs.Batch`: its ``new_batch``
    where it has one (not part of :class:`Engine`: an engine of a tier's own need not), else
    a plain one, this loop's ``anyio.Event``."""
    make: Callable[[int, Op], Batch] | None = getattr(engine, "new_batch", None)
    return make if make is not None else lambda size, op: Batch(size)


def refuse_other_loop(name: str, home_loop: object, this_loop: object) -> None:
    """Raise :class:`TierStateError` for a call from another event loop than the one whose
    workers serve the tier: its completions are delivered to that loop, so it would wait for ever."""
    if this_loop is not home_loop:
        raise TierStateError(
            f"{name}: this tier was opened on another event loop, and its workers serve that "
            "loop only: open one tier per event loop"
        )


def abandoned() -> ConnectionAbortedError:
    """A job's failure when the loop whose workers would run or reap it ended first."""
    return ConnectionAbortedError("chunk I/O abandoned: the event loop the tier's workers served ended")


def refuse_close_elsewhere(name: str, home_loop: object) -> None:
    """Raise :class:`TierStateError` for a close on another event loop than ``home_loop``,
    the loop whose coroutines serve the tier, while that loop still runs: the close must run
    there (once it is gone, a close runs anywhere: see :func:`orphaned`)."""
    if home_loop is not None and current_loop() is not home_loop and loop_running(home_loop):
        raise TierStateError(
            f"{name}: this tier was opened on another event loop, which still runs: close it on that "
            "loop (its workers serve that loop only)"
        )


def orphaned(name: str, home_loop: object) -> bool:
    """For the stop of an engine whose workers serve ``home_loop`` (service coroutines, and
    completions delivered there): whether it runs on another loop, once that one is gone (its
    service coroutines went with it, so the engine stops without them). Raises as
    :func:`refuse_close_elsewhere` while it still runs."""
    refuse_close_elsewhere(name, home_loop)
    return home_loop is not None and current_loop() is not home_loop
