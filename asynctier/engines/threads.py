"""The threads engine: ``max_inflight`` OS threads run blocking job bodies, lowest priority first.

Workers pull the next job from one priority queue themselves, so a freed slot is refilled
without a round trip through the event loop, and the loop is woken once per call (when its
last job ends), not once per chunk. Blocking system calls (``preadv``/``pwritev``) and sync
clients release the GIL, so the threads overlap their I/O.
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Iterable

from ..core.backend import run_on_thread_to_end
from ..core.jobs import CANCELLED, DONE, PENDING, Batch, Job
from .base import EngineCounters

__all__ = ["EngineStoppedError", "ThreadEngine"]


class EngineStoppedError(RuntimeError):
    """Jobs were handed to an engine that has been stopped (the tier is closed)."""


class ThreadEngine(EngineCounters):
    """``workers`` daemon threads running blocking callables, lowest priority first."""

    def __init__(self, workers: int, name: str = "asynctier") -> None:
        super().__init__(workers, name)
        self._cv = threading.Condition(threading.Lock())
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        try:
            for i in range(self._workers):
                t = threading.Thread(target=self._work, name=f"{self._name}-io-{i}", daemon=True)
                t.start()
                self._threads.append(t)
        except BaseException:  # e.g. "can't start new thread": end those that started
            self.stop_nowait()
            raise

    def submit(self, jobs: Iterable[Job]) -> None:
        with self._cv:
            if self._stopping:
                raise EngineStoppedError("engine is stopped")
            n = 0
            for job in jobs:
                heapq.heappush(self._heap, (job.priority, job.seq, job))
                n += 1
            self._queued += n
            if n == 1:
                self._cv.notify()
            elif n:
                self._cv.notify(min(n, self._workers))

    def cancel_pending(self, jobs: Iterable[Job]) -> list[Job]:
        """Withdraw the jobs not started yet (called on the loop thread)."""
        taken = []
        emptied: list[Batch] = []
        with self._cv:
            for job in jobs:
                if job.state == PENDING:
                    job.state = CANCELLED
                    taken.append(job)
                    job.batch.remaining -= 1
                    if job.batch.remaining == 0:
                        emptied.append(job.batch)
            self._queued -= len(taken)
        for b in emptied:
            b.event.set()
        return taken

    def _work(self) -> None:
        cv = self._cv
        while True:
            with cv:
                job = self._claim()
                while job is None:
                    if self._stopping:
                        return
                    cv.wait()
                    job = self._claim()
            try:
                job.result = job.fn(*job.args)
            except BaseException as e:  # delivered to the caller as that chunk's failure
                job.exc = e
            with cv:
                self._in_flight -= 1
                job.state = DONE
                job.batch.one_done_threadsafe()
            del job

    def stop_nowait(self) -> None:
        """Tell workers to end once the queue is empty, without waiting for them."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()

    async def stop(self) -> None:
        """Let workers finish the queue, then join them (on a thread: joining blocks)."""
        self.stop_nowait()
        threads, self._threads = self._threads, []
        if threads:

            def join_all() -> None:
                for t in threads:
                    t.join()

            await run_on_thread_to_end(join_all)
