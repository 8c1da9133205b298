"""The engines that run chunk I/O under a bound, loads first.

A tier never starts chunk I/O from the event loop itself. It hands :class:`Job` objects to
an engine, which owns exactly ``max_inflight`` workers pulling from one priority queue:

* :class:`ThreadEngine` — OS threads for blocking primitives (``preadv``/``pwritev``, sync
  clients). Workers pull the next job themselves, so a slot is refilled without a round trip
  through the event loop (a trial here kept ~14 of 16 I/Os in flight this way against ~7 when
  each I/O was started from the loop).
* :class:`AsyncEngine` — asyncio tasks for primitives that are coroutines.

The bound is the number of workers, so it holds for all callers together. Lower
``priority`` runs first; loads use :data:`PRIO_LOAD` and jump ahead of queued stores.
A job is ``PENDING`` until a worker claims it, then ``RUNNING``, then ``DONE``; a caller may
take back pending jobs (:meth:`cancel_pending`) but never a running one — that is what lets
cancellation wait for every I/O that touches the caller's buffer.

The jobs of one call share a :class:`Batch`: a job's outcome is kept on the job, and the
event loop is woken once, when the last job of the call is done or taken back — not once per
chunk, which keeps the loop free at tens of thousands of chunks per second.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

__all__ = [
    "AsyncEngine",
    "Batch",
    "Engine",
    "HASH_ON_THREAD_BYTES",
    "Job",
    "PRIO_LOAD",
    "PRIO_LOOKUP",
    "PRIO_REMOVE",
    "PRIO_STORE",
    "ThreadEngine",
    "finish_on_thread",
    "wait_to_end",
]

#: Chunks of at least this many bytes are checksummed on a thread (with
#: :func:`finish_on_thread`) by engines that run on the event-loop thread: xxh3 of 2 MiB takes
#: ~250 us, which would stall every other task; below it the hop costs more than the hash.
HASH_ON_THREAD_BYTES = 1 << 20

log = logging.getLogger(__name__)
T = TypeVar("T")

PRIO_LOAD = 0
PRIO_LOOKUP = 1
PRIO_STORE = 2
PRIO_REMOVE = 3

PENDING, RUNNING, DONE, CANCELLED = range(4)

_seq = itertools.count()


class Batch:
    """The jobs of one call; :attr:`future` resolves when none is left pending or running."""

    __slots__ = ("future", "loop", "remaining")

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()
        self.remaining = size


def _finish(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Job:
    """One chunk I/O: ``fn(*args)`` run by a worker; its outcome lands in ``result``/``exc``."""

    __slots__ = ("args", "batch", "exc", "fn", "priority", "result", "seq", "state")

    def __init__(self, priority: int, fn: Callable[..., Any], args: tuple[Any, ...], batch: Batch) -> None:
        self.priority = priority
        self.seq = next(_seq)  # FIFO within one priority
        self.fn = fn
        self.args = args
        self.batch = batch
        self.state = PENDING
        self.result: Any = None
        self.exc: BaseException | None = None


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
    def submit(self, jobs: Iterable[Job]) -> None: ...
    def cancel_pending(self, jobs: Iterable[Job]) -> list[Job]: ...
    async def stop(self) -> None: ...
    def stop_nowait(self) -> None: ...


class _EngineBase:
    """Counters both engines keep, read by ``stats()`` without a lock (ints, GIL-atomic)."""

    def __init__(self, workers: int, name: str) -> None:
        self._workers = workers
        self._name = name
        # (priority, seq, job): tuples compare in C; a Job.__lt__ per comparison cost ~12
        # Python calls per chunk at depth 16 (seq is unique, so the job is never compared)
        self._heap: list[tuple[int, int, Job]] = []
        self._in_flight = 0
        self._peak = 0
        self._queued = 0
        self._stopping = False

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


class ThreadEngine(_EngineBase):
    """``workers`` daemon threads running blocking callables, lowest priority first."""

    def __init__(self, workers: int, name: str = "asynctier") -> None:
        super().__init__(workers, name)
        self._cv = threading.Condition(threading.Lock())
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self._workers):
            t = threading.Thread(target=self._run, name=f"{self._name}-io-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def submit(self, jobs: Iterable[Job]) -> None:
        with self._cv:
            if self._stopping:
                raise RuntimeError("engine is stopped")
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
        taken = []
        emptied = []
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
            b.loop.call_soon_threadsafe(_finish, b.future)
        return taken

    def _run(self) -> None:
        cv = self._cv
        while True:
            with cv:
                while not self._heap and not self._stopping:
                    cv.wait()
                if not self._heap:
                    return
                job = heapq.heappop(self._heap)[2]
                if job.state != PENDING:
                    continue
                job.state = RUNNING
                self._queued -= 1
                self._in_flight += 1
                if self._in_flight > self._peak:
                    self._peak = self._in_flight
            try:
                job.result = job.fn(*job.args)
            except BaseException as e:  # delivered to the caller as that chunk's failure
                job.exc = e
            batch = job.batch
            with cv:
                self._in_flight -= 1
                job.state = DONE
                batch.remaining -= 1
                last = batch.remaining == 0
            if last:
                try:
                    batch.loop.call_soon_threadsafe(_finish, batch.future)
                except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
                    pass
            del job, batch

    def stop_nowait(self) -> None:
        """Tell workers to end once the queue is empty, without waiting for them."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()

    async def stop(self) -> None:
        """Let workers finish the queue, then join them (in a thread: joining blocks)."""
        self.stop_nowait()
        threads, self._threads = self._threads, []
        if threads:

            def join_all() -> None:
                for t in threads:
                    t.join()

            await asyncio.to_thread(join_all)


class AsyncEngine(_EngineBase):
    """``workers`` asyncio tasks awaiting coroutine callables, lowest priority first."""

    def __init__(self, workers: int, name: str = "asynctier") -> None:
        super().__init__(workers, name)
        # One release per pushed entry and one acquire per popped entry, so a worker is
        # always awake for every entry in the heap.
        self._ready: asyncio.Semaphore | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._ready = asyncio.Semaphore(0)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(), name=f"{self._name}-io-{i}") for i in range(self._workers)]

    def submit(self, jobs: Iterable[Job]) -> None:
        if self._stopping or self._ready is None:
            raise RuntimeError("engine is not running")
        for job in jobs:
            heapq.heappush(self._heap, (job.priority, job.seq, job))
            self._queued += 1
            self._ready.release()

    def cancel_pending(self, jobs: Iterable[Job]) -> list[Job]:
        taken = [j for j in jobs if j.state == PENDING]
        for j in taken:
            j.state = CANCELLED
            j.batch.remaining -= 1
            if j.batch.remaining == 0:
                _finish(j.batch.future)
        self._queued -= len(taken)
        return taken

    async def _run(self) -> None:
        assert self._ready is not None
        ready = self._ready
        while True:
            await ready.acquire()
            if not self._heap:
                if self._stopping:
                    return
                continue
            job = heapq.heappop(self._heap)[2]
            if job.state != PENDING:
                continue
            job.state = RUNNING
            self._queued -= 1
            self._in_flight += 1
            self._peak = max(self._peak, self._in_flight)
            try:
                coro: Awaitable[Any] = job.fn(*job.args)
                job.result = await coro
            except asyncio.CancelledError as e:
                if not _worker_cancelled():
                    # raised by the primitive (a cancelled future it awaited), not aimed at
                    # this worker: that chunk fails, the worker goes on
                    job.exc = ConnectionAbortedError(f"chunk I/O cancelled inside the tier: {e!r}")
                    self._done(job)
                    del job
                    continue
                # Only stop() cancels workers, and only after draining; hand the job's
                # caller a failure rather than leaving it waiting, then end this worker.
                job.exc = ConnectionAbortedError("tier engine stopped")
                self._done(job)
                raise
            except (KeyboardInterrupt, SystemExit) as e:  # the process ends: the caller must not hang
                job.exc = e
                self._done(job)
                raise
            except BaseException as e:  # delivered to the caller as that chunk's failure, as threads do
                job.exc = e
            self._done(job)
            del job

    def _done(self, job: Job) -> None:
        self._in_flight -= 1
        job.state = DONE
        job.batch.remaining -= 1
        if job.batch.remaining == 0:
            _finish(job.batch.future)

    def stop_nowait(self) -> None:
        """Tell workers to end once the queue is empty, without waiting for them."""
        if self._stopping:
            return
        self._stopping = True
        if self._ready is not None:
            for _ in range(self._workers):
                self._ready.release()

    async def stop(self) -> None:
        """Let workers finish the queue, then end them."""
        self.stop_nowait()
        tasks, self._tasks = self._tasks, []
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def _worker_cancelled() -> bool:
    """Whether the running task itself was cancelled (Python 3.11+ can tell; before that,
    every CancelledError counts as one)."""
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    return True if cancelling is None else bool(cancelling())


async def finish_on_thread(fn: Callable[..., T], *args: Any, executor: Any = None) -> T:
    """``fn(*args)`` on a thread (``executor``, default the loop's); its result.

    For the blocking helpers of an async engine that read or write the caller's buffer
    (hashing a chunk, a retried transfer): if the awaiting task is cancelled, the thread
    cannot be stopped, so this waits for ``fn`` to return before the cancellation goes on,
    as the contract requires of any I/O touching the caller's memory.
    """
    fut = asyncio.get_running_loop().run_in_executor(executor, fn, *args)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await wait_to_end(fut)  # fn's own failure, if any, gives way to the cancellation
        if not fut.cancelled():
            fut.exception()  # retrieved
        raise


async def wait_to_end(fut: asyncio.Future[Any]) -> None:
    """Wait for ``fut`` to finish, through any number of cancellations; its outcome stays on
    it (the caller reads it, and re-raises its own cancellation)."""
    while not fut.done():
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            pass
        except Exception:
            pass
