"""Engines that run chunk I/O under a bound, loads first (moved to :mod:`asynctier.core`).

Kept as one import path for the engines and their job types: :class:`ThreadEngine` (OS threads
for blocking primitives) and :class:`AsyncEngine` (coroutine bodies; the tasks engine).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from .core.backend import run_on_thread_to_end
from .core.engine_base import Engine
from .core.jobs import CANCELLED, DONE, PENDING, RUNNING, Batch, Job
from .core.ops import PRIO_LOAD, PRIO_LOOKUP, PRIO_REMOVE, PRIO_STORE, Op
from .core.task_engine import TaskEngine
from .core.thread_engine import EngineStoppedError, ThreadEngine

__all__ = [
    "AsyncEngine",
    "Batch",
    "CANCELLED",
    "DONE",
    "Engine",
    "EngineStoppedError",
    "HASH_ON_THREAD_BYTES",
    "Job",
    "Op",
    "PENDING",
    "PRIO_LOAD",
    "PRIO_LOOKUP",
    "PRIO_REMOVE",
    "PRIO_STORE",
    "RUNNING",
    "TaskEngine",
    "ThreadEngine",
    "finish_on_thread",
    "wait_to_end",
]

T = TypeVar("T")

#: Chunks of at least this many bytes are checksummed on a thread by engines whose job bodies
#: run on the event-loop thread: hashing a large chunk there would stall every other task.
HASH_ON_THREAD_BYTES = 1 << 20

AsyncEngine = TaskEngine


async def finish_on_thread(fn: Callable[..., T], *args: Any, executor: Any = None) -> T:
    """``fn(*args)`` on a thread; if the caller is cancelled, it runs to its end first."""
    return await run_on_thread_to_end(fn, *args, executor=executor)


async def wait_to_end(fut: asyncio.Future[Any]) -> None:
    """Wait for an asyncio future to finish, through any number of cancellations; its outcome
    stays on it (the caller reads it, and re-raises its own cancellation)."""
    while not fut.done():
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:
            pass
        except Exception:
            pass
