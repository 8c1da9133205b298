"""A private asyncio event loop on a thread of the tier's own, so that valkey-py (asyncio-only)
serves a tier opened under trio: each client call is run there as a task, and the caller waits
for that task's end, also when it is cancelled (docs/tiers/valkey.md, "Event loops")."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from asynctier.core.backend import fork_generation, loop_caller, wait_uninterrupted
from asynctier.errors import TierUnavailableError

__all__ = ["LoopThread"]

T = TypeVar("T")


class LoopThread:
    """An asyncio event loop running on a daemon thread until :meth:`stop`."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._ended = threading.Event()
        self._stopping = False
        # the thread holds the loop, not this object: a dropped tier is collected, and stops it
        self._thread = threading.Thread(target=_serve, args=(self._loop, self._ended), name=name, daemon=True)
        self._thread.start()
        # a tier dropped without aclose() must not leave its loop thread behind
        self._finalizer = weakref.finalize(self, _stop_soon, self._loop, fork_generation())

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)`` on the private loop, from the caller's loop (trio). A cancelled
        caller cancels that task and waits for it to end before the cancellation goes on: no
        I/O it started is left running when the caller sees the cancellation."""
        wake = loop_caller()  # schedules on the caller's loop from the private loop's thread
        done = anyio.Event()
        holder: list[asyncio.Task[T]] = []

        def start() -> None:
            task = self._loop.create_task(_run(fn, args))
            holder.append(task)
            task.add_done_callback(lambda _t: wake(done.set))  # after the coroutine has ended

        def cancel() -> None:
            if holder:
                holder[0].cancel()

        try:
            if self._stopping:  # a task started now could outlive the loop's last round
                raise RuntimeError
            self._loop.call_soon_threadsafe(start)
        except RuntimeError:  # the loop is closed
            raise TierUnavailableError("the valkey client's event loop has stopped (the tier is closed)") from None
        try:
            await done.wait()
        except anyio.get_cancelled_exc_class():
            with contextlib.suppress(RuntimeError):  # closed: its last round cancelled the task already
                self._loop.call_soon_threadsafe(cancel)  # after start(): the loop runs its callbacks in order
            await wait_uninterrupted(done)
            raise
        task = holder[0]
        if task.cancelled():  # by stop(), while this call was in flight
            raise TierUnavailableError("the valkey client's event loop has stopped (the tier is closed)")
        return task.result()

    async def stop(self) -> None:
        """Stop the loop (its remaining tasks are cancelled and awaited there) and wait for the
        thread's end."""
        self._stopping = True
        self._finalizer.detach()
        _stop_soon(self._loop)  # after every start() scheduled so far: those tasks are cancelled and awaited
        if not self._ended.is_set():
            await anyio.to_thread.run_sync(self._ended.wait)


def _serve(loop: asyncio.AbstractEventLoop, ended: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
        # what is left (a connection's closing) ends here, on the loop it belongs to
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()
        ended.set()


async def _run(fn: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> T:
    return await fn(*args)


def _stop_soon(loop: asyncio.AbstractEventLoop, made_in: int | None = None) -> None:
    if made_in is not None and fork_generation() != made_in:  # a forked child's: the loop thread is the parent's
        return
    try:
        loop.call_soon_threadsafe(loop.stop)
    except RuntimeError:  # already closed
        pass
