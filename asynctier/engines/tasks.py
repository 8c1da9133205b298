"""The tasks engine: coroutine job bodies (async clients, the native engine's jobs).

``workers`` coroutines, started at ``open()`` as service tasks of the event loop
(:func:`~asynctier.core.backend.spawn_service`), pull jobs from one priority queue, lowest
priority first, so a load that arrives after a flood of stores runs next. A worker goes on to
the next job with no round trip through the caller; it sleeps on an event only when the queue
is empty. Callers wait for their batch (:meth:`EngineCounters.run`), and a cancelled caller
withdraws its pending jobs and waits for the running ones: the workers themselves are never
cancelled by a caller, so a body that started always runs to its end.
"""

from __future__ import annotations

import heapq
from collections.abc import Awaitable, Iterable
from typing import Any

import anyio

from ..core.backend import (
    current_loop,
    own_cancellation,
    spawn_service,
    wait_uninterrupted,
)
from ..core.jobs import DONE, Job
from .base import LoopEngine, orphaned, refuse_close_elsewhere, refuse_other_loop
from .threads import EngineStoppedError

__all__ = ["TaskEngine"]


class TaskEngine(LoopEngine):
    """``workers`` coroutines running coroutine callables, lowest priority first."""

    def __init__(self, workers: int, name: str = "asynctier") -> None:
        super().__init__(workers, name)
        self._idle: list[anyio.Event] = []  # one per worker waiting for work
        self._running_workers = 0

    def start(self) -> None:
        self._bind_loop()
        for i in range(self._workers):
            self._running_workers += 1
            spawn_service(self._work, name=f"{self._name}-io-{i}")

    def submit(self, jobs: Iterable[Job]) -> None:
        if self._stopping or self._ended is None:
            raise EngineStoppedError("engine is not running")
        refuse_other_loop(self._name, self._loop, current_loop())
        n = 0
        for job in jobs:
            heapq.heappush(self._heap, (job.priority, job.seq, job))
            n += 1
        self._queued += n
        while n and self._idle:
            self._idle.pop().set()
            n -= 1

    async def _work(self) -> None:
        cancelled = own_cancellation()
        try:
            while True:
                job = self._claim()
                if job is None:
                    if self._stopping:
                        break
                    wake = anyio.Event()
                    self._idle.append(wake)
                    await wake.wait()
                    continue
                await self._body(job)
                self._in_flight -= 1
                job.state = DONE
                job.batch.one_done()
                del job  # an idle worker must not keep the last job (and through it the tier) alive
                cancelled()  # this worker's own (its loop ends), whatever the job made of it: out, failing the rest
        finally:
            # also when the loop ends, cancelling the workers as they wait for work: the last one
            # out refuses new jobs and fails those still queued, whose callers (a chain's
            # background writer, shielded) would otherwise wait for ever and keep the run alive
            self._running_workers -= 1
            if self._running_workers == 0:
                self._stopping = True
                self._abort_queued()
                if self._ended is not None:
                    self._ended.set()

    @staticmethod
    async def _body(job: Job) -> None:
        try:
            coro: Awaitable[Any] = job.fn(*job.args)
            job.result = await coro
        except anyio.get_cancelled_exc_class() as e:
            # workers are not cancelled by callers: the loop ending, or a cancelled future inside the primitive
            job.exc = ConnectionAbortedError(f"chunk I/O cancelled inside the tier: {e!r}")
        except BaseException as e:  # delivered to the caller as that chunk's failure
            job.exc = e

    def _wake_all(self) -> None:
        idle, self._idle = self._idle, []
        for wake in idle:
            wake.set()

    def stop_nowait(self) -> None:
        """Tell workers to end once the queue is empty (from any thread), without waiting."""
        if self._stopping:
            return
        self._stopping = True
        if self._call is not None:
            self._call(self._wake_all)

    def check_stop_here(self) -> None:
        """Raise :class:`TierStateError` where :meth:`stop` cannot run (see :func:`.base.orphaned`)."""
        refuse_close_elsewhere(self._name, self._loop)

    async def stop(self) -> None:
        """Let workers finish the queue, then end them."""
        self._stopping = True
        if orphaned(self._name, self._loop):  # its workers ended with their loop
            return
        self._wake_all()
        if self._ended is not None and self._running_workers:
            await wait_uninterrupted(self._ended)
