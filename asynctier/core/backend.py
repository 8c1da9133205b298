"""The few places where the runtime meets the event loop, for asyncio (uvloop) and trio alike.

Everything else is written on anyio. Two things anyio does not offer are here:

* :func:`loop_caller` — run a callback on the event loop's thread *from a worker thread, without
  blocking that thread* (asyncio: ``call_soon_threadsafe``; trio: ``TrioToken.run_sync_soon``).
  anyio's ``from_thread.run_sync`` waits for the loop, which would stall an I/O worker.
* :func:`event_class` — the loop's own event (asyncio's or trio's), for the one a call waits
  on: ``anyio.Event`` wraps the same object and costs 3 µs more to make and about 6 µs more
  per wait (docs/benchmarks-issue-28.md, fourteenth pass); anyio's cancel scopes interrupt either.
* :func:`wait_uninterrupted` — wait for an event through any number of cancellations. anyio's
  shielded scopes stop anyio and trio cancellation, but on asyncio a plain ``task.cancel()``
  (``wait_for``, ``asyncio.timeout``) still interrupts a shielded wait; this waits again.

Both serve one rule (docs/cancellation.md): a cancelled call returns only after every I/O that
touches the caller's buffer has finished.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import anyio
import sniffio

__all__ = [
    "current_loop",
    "loop_running",
    "event_class",
    "spawn_service",
    "Event",
    "CloseHandle",
    "LoopCaller",
    "ReadableWatch",
    "watch_readable",
    "start_close",
    "loop_caller",
    "run_on_thread_to_end",
    "run_to_completion",
    "wait_uninterrupted",
    "fork_generation",
    "after_fork_in_child",
    "in_this_process",
    "lock_held_by",
    "own_cancellation",
]

T = TypeVar("T")


class LoopCaller(Protocol):
    def __call__(self, fn: Callable[[], object], /) -> None: ...


class Event(Protocol):
    """What a call's completion event offers: ``anyio.Event``, ``asyncio.Event``, ``trio.Event``."""

    def set(self) -> object: ...
    def is_set(self) -> bool: ...
    async def wait(self) -> object: ...


def event_class() -> Callable[[], Event]:
    """For the running event loop: its own event class (asyncio's, trio's; else anyio's).
    Call it once on the loop (it looks the library up) and make events with what it gives."""
    library = sniffio.current_async_library()
    if library == "asyncio":
        return asyncio.Event
    if library == "trio":
        import trio

        return trio.Event
    return anyio.Event  # pragma: no cover - anyio runs on asyncio or trio


def loop_caller() -> LoopCaller:
    """For the running event loop: a function that schedules ``fn()`` on the loop's thread
    from any thread. Once the loop is gone, the call is dropped (nobody waits any more)."""
    library = sniffio.current_async_library()
    if library == "trio":
        import trio

        token = trio.lowlevel.current_trio_token()

        def call_trio(fn: Callable[[], object]) -> None:
            try:
                token.run_sync_soon(fn)
            except trio.RunFinishedError:
                pass

        return call_trio
    if library == "asyncio":
        loop = asyncio.get_running_loop()

        def call_asyncio(fn: Callable[[], object]) -> None:
            try:
                loop.call_soon_threadsafe(fn)
            except RuntimeError:  # the loop is closed
                pass

        return call_asyncio
    raise RuntimeError(f"asynctier runs on asyncio (uvloop) and trio; got {library!r}")


def loop_soon() -> LoopCaller:
    """For the running event loop: a function that schedules ``fn()`` after the callbacks
    ready now, called *from the loop's thread* (asyncio's ``call_soon``: no wake-up of the
    loop, unlike :func:`loop_caller`'s; trio has one way for both)."""
    if sniffio.current_async_library() == "asyncio":
        return asyncio.get_running_loop().call_soon  # type: ignore[return-value]
    return loop_caller()


async def wait_uninterrupted(event: Event) -> BaseException | None:
    """Wait until ``event`` is set, whatever cancellation or KeyboardInterrupt comes; return
    the first that came (the caller re-raises it), or None."""
    cancelled: BaseException | None = None
    while not event.is_set():
        try:
            with anyio.CancelScope(shield=True):
                await event.wait()
        # asyncio's task.cancel() pierces the shield; trio raises a KeyboardInterrupt into it
        except (anyio.get_cancelled_exc_class(), KeyboardInterrupt) as e:
            if cancelled is None:
                cancelled = e
    return cancelled


_shared_executor: concurrent.futures.ThreadPoolExecutor | None = None

#: How many forks this process is from the one that imported asynctier: a tier opened in one
#: generation refuses calls in another (its threads did not cross the fork).
_generation = 0
_after_fork: list[Callable[[], None]] = []


#: Descriptors that hold a lock for a tier (fs owners lock, nvme slab lock): a forked child's
#: copy held the lock on after the parent let it go. By number, with the file they named.
_locks: dict[int, tuple[int, int]] = {}


def fork_generation() -> int:
    return _generation


def lock_held_by(fd: int) -> None:
    """Register ``fd``, which holds a lock on its file for a tier: a forked child closes its
    copy at once (a lock on an open file description lasts while any copy is open)."""
    st = os.fstat(fd)
    _locks[fd] = (st.st_dev, st.st_ino)


def in_this_process(fn: Callable[..., object]) -> Callable[..., None]:
    """``fn`` as a finalizer of something made in this process: in a forked child it does
    nothing (the threads, pools and loops it would stop or join are the parent's)."""
    made_in = _generation

    def run(*args: Any) -> None:
        if _generation == made_in:
            fn(*args)

    return run


def after_fork_in_child(fn: Callable[[], None]) -> None:
    """Run ``fn`` in a child right after a fork (to drop a thread pool, whose threads a
    child does not have: an inherited pool takes jobs and never runs them)."""
    _after_fork.append(fn)


def _in_child() -> None:
    global _generation, _shared_executor
    _generation += 1
    _shared_executor = None
    for fd, named in list(_locks.items()):
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == named:  # (not a number the parent reused for another file)
                os.close(fd)
        except OSError:
            pass
    _locks.clear()
    for fn in _after_fork:
        fn()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_in_child)


def _default_executor() -> concurrent.futures.ThreadPoolExecutor:
    global _shared_executor
    if _shared_executor is None:
        # slow paths only (open, close, listing, rare fallbacks); chunk I/O has its own workers
        _shared_executor = concurrent.futures.ThreadPoolExecutor(32, thread_name_prefix="asynctier-blocking")
    return _shared_executor


async def run_on_thread_to_end(
    fn: Callable[..., T], *args: Any, executor: concurrent.futures.Executor | None = None
) -> T:
    """``fn(*args)`` on a thread of ``executor`` (default: a shared pool for slow paths).

    If the caller is cancelled before ``fn`` started, it never starts. Once it runs, it runs
    to its end before the cancellation goes on (it may touch the caller's buffer or hold the
    medium's descriptors); its own outcome is then dropped.
    """
    done = anyio.Event()
    call = loop_caller()
    fut = (executor or _default_executor()).submit(fn, *args)
    fut.add_done_callback(lambda _: call(done.set))
    try:
        await done.wait()
    except (anyio.get_cancelled_exc_class(), KeyboardInterrupt):  # (trio raises Ctrl-C into the task)
        if not fut.cancel():  # it started: wait for its end
            await wait_uninterrupted(done)
        raise
    return fut.result()


async def run_to_completion(fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``fn()`` to its end even if the caller is cancelled meanwhile; then re-raise the
    cancellation (for closing and undoing, which must never stop half-way).

    trio and anyio honour a shielded scope; asyncio's ``task.cancel()`` does not, so there the
    work runs as a task of its own that the caller waits for.
    """
    if sniffio.current_async_library() != "asyncio":
        with anyio.CancelScope(shield=True):
            return await fn()
    task = asyncio.ensure_future(fn())
    cancelled: BaseException | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as e:
            if task.done():
                break
            cancelled = cancelled or e
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the cancellation wins
        raise cancelled
    return task.result()


class CloseHandle:
    """A close in progress that several callers wait for (:func:`start_close`).

    asyncio: the close is a task of its own, so a cancelled waiter returns at once and the
    close goes on. trio has no detached tasks: the first waiter runs the close in a shielded
    scope and the others wait for it.
    """

    def __init__(self, fn: Callable[[], Awaitable[None]]) -> None:
        self._fn: Callable[[], Awaitable[None]] | None = fn
        self._task: asyncio.Future[None] | None = None
        self._done = anyio.Event()
        self._error: BaseException | None = None
        if sniffio.current_async_library() == "asyncio":
            self._task = asyncio.ensure_future(fn())
            self._task.add_done_callback(lambda t: t.cancelled() or t.exception())  # waiters re-raise it
            self._fn = None

    async def wait(self) -> None:
        """Until the close is over; its failure, if any, is raised to every waiter."""
        if self._task is not None:
            await asyncio.shield(self._task)
            return
        fn, self._fn = self._fn, None
        if fn is not None:  # the first waiter runs it
            with anyio.CancelScope(shield=True):
                try:
                    await fn()
                except BaseException as e:
                    self._error = e
                finally:
                    self._done.set()
        await self._done.wait()
        if self._error is not None:
            raise self._error


def start_close(fn: Callable[[], Awaitable[None]]) -> CloseHandle:
    """Begin ``fn()`` so that no caller's cancellation stops it half-way."""
    return CloseHandle(fn)


class ReadableWatch:
    """Calls ``callback()`` on the event loop's thread whenever ``fd`` becomes readable, until
    :meth:`close` (:func:`watch_readable`).

    asyncio (uvloop too): the loop's own ``add_reader``. trio: a system task waiting in
    ``wait_readable``; it needs no nursery of the caller's and ends with the run.
    """

    def __init__(self, fd: int, callback: Callable[[], object], busy: Callable[[], bool] | None = None) -> None:
        self.fd = fd
        self.call_soon: LoopCaller = loop_caller()
        self.home = current_loop()
        self._closed = False
        self._scope: anyio.CancelScope | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        if sniffio.current_async_library() == "asyncio":
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(fd, callback)
            return
        import trio

        self._scope = anyio.CancelScope()
        scope = self._scope

        async def watch() -> None:
            with scope:
                try:
                    while True:
                        await trio.lowlevel.wait_readable(fd)
                        callback()
                except trio.Cancelled:
                    if self._closed or busy is None:
                        raise
                    # the run is ending (its system tasks cancelled): what is in flight is
                    # reaped first, or its callers (shielded ones) would wait for ever, and the
                    # run with them
                    with trio.CancelScope(shield=True):
                        while busy():
                            await trio.lowlevel.wait_readable(fd)
                            callback()
                    raise

        trio.lowlevel.spawn_system_task(watch, name=f"asynctier-fd{fd}-watch")

    def gone(self) -> bool:
        """Whether the loop it watches on is gone (and the watch with it)."""
        return not loop_running(self.home)

    def forget(self) -> None:
        """The loop it watched on is gone, and the watch with it: only note it closed."""
        self._closed = True

    def close(self) -> None:
        """Stop watching (on the loop's thread; idempotent). Before closing ``fd``."""
        if self._closed:
            return
        self._closed = True
        if self._loop is not None:
            if not self._loop.is_closed():
                self._loop.remove_reader(self.fd)
        else:
            import trio

            assert self._scope is not None
            self._scope.cancel()
            trio.lowlevel.notify_closing(self.fd)


def watch_readable(fd: int, callback: Callable[[], object], busy: Callable[[], bool] | None = None) -> ReadableWatch:
    """Run ``callback()`` on the current event loop each time ``fd`` is readable; while
    ``busy()``, also as the loop ends (trio cancels its system tasks; asyncio's readers serve
    until the loop is closed)."""
    return ReadableWatch(fd, callback, busy)


_service_tasks: set[asyncio.Task[None]] = set()  # asyncio keeps only weak references to tasks


def own_cancellation() -> Callable[[], None]:
    """For a service task (an engine's worker): a check to run after each job, raising the
    task's own cancellation if it came while the job ran. asyncio cancels a task once
    (``asyncio.run`` ending), and the job's code may have turned it into its failure (a
    chunk's ``ConnectionAbortedError``, a client's own error) or swallowed it: the worker
    would then wait for work for ever and the run would never end. A cancellation raised
    out of a future cancelled inside the job (a client's own) leaves the task's count at 0.
    trio raises a cancellation again at the next await, and Python 3.10 cannot tell
    (``Task.cancelling`` is 3.11's): the check does nothing there."""
    task = asyncio.current_task() if sniffio.current_async_library() == "asyncio" else None
    cancelling = getattr(task, "cancelling", None)
    if cancelling is None:
        return _nothing

    def check() -> None:
        if cancelling() > 0:
            raise asyncio.CancelledError

    return check


def spawn_service(fn: Callable[[], Awaitable[None]], name: str) -> None:
    """Start ``fn()`` as a task that lives beyond the caller (an engine's workers, from
    ``open()`` to ``aclose()``). asyncio: a task of the loop; trio: a system task. ``fn`` must
    not raise: on trio a system task's exception ends the whole run."""
    if sniffio.current_async_library() == "asyncio":
        coro = fn()
        assert asyncio.iscoroutine(coro), "spawn_service takes a coroutine function"
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name)
        _service_tasks.add(task)
        task.add_done_callback(_service_tasks.discard)
        return
    import trio

    trio.lowlevel.spawn_system_task(fn, name=name)


def loop_running(loop: object) -> bool:
    """Whether ``loop`` (a :func:`current_loop` identity) can still run anything: an asyncio
    loop not closed yet (``asyncio.run`` closes its loop as it returns), a trio run not over."""
    if isinstance(loop, asyncio.AbstractEventLoop):
        return not loop.is_closed()
    import trio

    try:
        loop.run_sync_soon(_nothing)  # type: ignore[attr-defined]
    except trio.RunFinishedError:
        return False
    return True


def _nothing() -> None:
    pass


def current_loop() -> object:
    """An identity of the running event loop: the asyncio loop, or trio's run token."""
    if sniffio.current_async_library() == "asyncio":
        return asyncio.get_running_loop()
    import trio

    return trio.lowlevel.current_trio_token()
