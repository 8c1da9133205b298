"""The tasks engine: coroutine job bodies (async clients) run by the calling task's own workers.

Each call runs its jobs in a task group of its own (structured concurrency: nothing outlives
the call), with at most ``max_inflight`` jobs of all callers running at once. Slots are handed
out by :class:`PrioritySlots` in priority order across callers, so a load that arrives after
a flood of stores still runs next. A running job body is shielded from the caller's
cancellation (it may be writing into the caller's buffer); a job still waiting for a slot is
withdrawn.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Awaitable, Iterable
from typing import Any

import anyio

from ..core.jobs import CANCELLED, DONE, PENDING, RUNNING, Job
from .base import DropHandler, EngineCounters
from .threads import EngineStoppedError

__all__ = ["PrioritySlots", "TaskEngine"]


class _Waiter:
    __slots__ = ("event", "gone", "granted")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.granted = False
        self.gone = False


class PrioritySlots:
    """``total`` slots granted lowest ``(priority, seq)`` first; loop thread only."""

    def __init__(self, total: int) -> None:
        self.free = total
        self._waiters: list[tuple[int, int, _Waiter]] = []

    async def acquire(self, priority: int, seq: int) -> None:
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return
        w = _Waiter()
        heapq.heappush(self._waiters, (priority, seq, w))
        try:
            await w.event.wait()
        except BaseException:
            if w.granted:  # granted as we were cancelled: pass the slot on
                self.release()
            else:
                w.gone = True
            raise

    def release(self) -> None:
        while self._waiters:
            w = heapq.heappop(self._waiters)[2]
            if not w.gone:
                w.granted = True
                w.event.set()
                return
        self.free += 1


class TaskEngine(EngineCounters):
    """Runs coroutine job bodies, at most ``workers`` at once across all callers."""

    def __init__(self, workers: int, name: str = "asynctier") -> None:
        super().__init__(workers, name)
        self._slots = PrioritySlots(workers)

    def start(self) -> None:
        """Nothing to start: each call brings its own tasks."""

    def cancel_pending(self, jobs: Iterable[Job]) -> list[Job]:
        taken = [j for j in jobs if j.state == PENDING]
        for j in taken:
            j.state = CANCELLED
            j.batch.one_done()
        self._queued -= len(taken)
        return taken

    async def run(
        self, jobs: list[Job], *, drop_after: float | None = None, on_drop: DropHandler | None = None
    ) -> None:
        if self._stopping:
            raise EngineStoppedError("engine is stopped")
        self._queued += len(jobs)
        queue = deque(jobs)
        deadline = anyio.current_time() + drop_after if drop_after is not None else math.inf
        try:
            async with anyio.create_task_group() as outer:
                if drop_after is not None:
                    outer.start_soon(self._drop_at, deadline, queue, on_drop)
                async with anyio.create_task_group() as tg:
                    for _ in range(min(len(jobs), self._workers)):
                        tg.start_soon(self._work, queue, deadline, on_drop)
                outer.cancel_scope.cancel()  # every job ran: no drop to come
        finally:
            self.cancel_pending(queue)  # left unstarted by a cancelled call

    async def _drop_at(self, deadline: float, queue: deque[Job], on_drop: DropHandler | None) -> None:
        """At the back-pressure deadline, drop the stores of this call that no worker took yet."""
        await anyio.sleep_until(deadline)
        dropped = self.cancel_pending(queue)
        queue.clear()
        if on_drop is not None and dropped:
            on_drop(dropped)

    async def _work(self, queue: deque[Job], deadline: float, on_drop: DropHandler | None) -> None:
        while queue:
            job = queue.popleft()
            if job.state != PENDING:
                continue
            got = False
            try:
                # a call cancelled while this worker ran a shielded body starts nothing more
                await anyio.lowlevel.checkpoint_if_cancelled()
                with anyio.move_on_after(deadline - anyio.current_time()):
                    await self._slots.acquire(job.priority, job.seq)
                    got = True
            finally:
                if not got:  # cancelled, or no slot in time: this job never starts
                    queue.appendleft(job)
            if not got:  # store back-pressure: every store of this call still waiting is dropped
                dropped = self.cancel_pending(queue)
                queue.clear()
                if on_drop is not None:
                    on_drop(dropped)
                return
            job.state = RUNNING
            self._queued -= 1
            self._in_flight += 1
            self._peak = max(self._peak, self._in_flight)
            try:
                with anyio.CancelScope(shield=True):
                    await self._body(job)
            finally:
                self._in_flight -= 1
                job.state = DONE
                job.batch.one_done()
                self._slots.release()

    @staticmethod
    async def _body(job: Job) -> None:
        try:
            coro: Awaitable[Any] = job.fn(*job.args)
            job.result = await coro
        except anyio.get_cancelled_exc_class() as e:
            # shielded, so not aimed at this job: a cancelled future inside the primitive
            job.exc = ConnectionAbortedError(f"chunk I/O cancelled inside the tier: {e!r}")
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # delivered to the caller as that chunk's failure
            job.exc = e

    def stop_nowait(self) -> None:
        self._stopping = True

    async def stop(self) -> None:
        self._stopping = True
