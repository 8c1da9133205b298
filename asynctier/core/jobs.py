"""A :class:`Job` is one unit of chunk I/O under the bound; a :class:`Batch` is the jobs of one call.

A job is one chunk, or a group of adjacent chunks a tier moves in one I/O (the nvme tier's
coalescing): :attr:`Job.keys` always lists the chunks it covers, and :attr:`Job.grouped` says
whether its body returns one outcome per chunk. A job is ``PENDING`` until an engine claims it,
then ``RUNNING``, then ``DONE``; a caller may withdraw pending jobs (``CANCELLED``), never a
running one: that is what lets a cancelled call wait for every I/O touching its buffer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import anyio

from .backend import Event, LoopCaller, loop_caller
from .ops import Op

__all__ = [
    "Batch", "CANCELLED", "DONE", "Job", "Outcome", "Outcomes", "PENDING", "RUNNING", "SKIPPED", "Skipped", "evened",
]  # fmt: skip

PENDING, RUNNING, DONE, CANCELLED = range(4)


class Skipped:
    """The type of :data:`SKIPPED` (one instance)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SKIPPED"


#: A store's outcome when the key was stored already and nothing was written: a success that
#: moved no bytes (a job's ``result``, or its entry in a group's outcomes).
SKIPPED = Skipped()
#: One chunk's outcome in a group job: the exception that failed it, :data:`SKIPPED`, or None (done).
Outcome = BaseException | Skipped | None
Outcomes = list[Outcome]

_seq = itertools.count()


def evened(n: int, most: int) -> int:
    """Chunks per job (a ``group_size``) when a call of ``n`` chunks is cut into as few jobs of
    at most ``most`` as it takes, evened out: 20 at most 16 go as two jobs of 10, not 16 and 4."""
    jobs = -(-n // max(1, most))
    return -(-n // jobs)


class Batch:
    """The jobs of one call. :attr:`event` is set once none is left pending or running; engines
    call :meth:`one_done` (loop thread) or :meth:`one_done_threadsafe` (worker threads), under
    their own lock, once per job. Made by the call, on its event loop: an engine bound to one
    loop gives its own ``event`` (:func:`~asynctier.core.backend.event_class`) and ``call``
    (:meth:`~asynctier.engines.base.EngineCounters.new_batch`); else they are this loop's."""

    __slots__ = ("_call", "cancelled", "event", "remaining")

    def __init__(self, size: int, event: Event | None = None, call: LoopCaller | None = None) -> None:
        self.event: Event = anyio.Event() if event is None else event
        self.remaining = size
        #: the call was cancelled: jobs of several steps start no next one (set by Engine.withdraw)
        self.cancelled = False
        self._call: LoopCaller = loop_caller() if call is None else call  # how a worker thread wakes its loop

    def one_done(self) -> bool:
        """On the loop thread: count one job out; True if it was the last."""
        self.remaining -= 1
        if self.remaining == 0:
            self.event.set()
            return True
        return False

    def one_done_threadsafe(self) -> bool:
        """From any thread (the engine's lock held): count one job out; the last wakes the loop."""
        self.remaining -= 1
        if self.remaining == 0:
            self._call(self.event.set)
            return True
        return False


class Job:
    """One chunk I/O (or one group): ``fn(*args)`` run by an engine; outcome in ``result``/``exc``."""

    __slots__ = ("args", "batch", "exc", "fn", "grouped", "keys", "op", "priority", "result", "seq", "state")

    def __init__(
        self,
        op: Op,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        keys: Sequence[bytes],
        batch: Batch,
        *,
        grouped: bool = False,
        priority: int | None = None,
    ) -> None:
        self.op = op
        # given by the caller that makes many: an Op's hash is Python code (enum)
        self.priority = op.priority if priority is None else priority
        self.seq = next(_seq)  # FIFO within one priority
        self.fn = fn
        self.args = args
        self.keys = keys
        self.grouped = grouped
        self.batch = batch
        self.state = PENDING
        self.result: Any = None
        self.exc: BaseException | None = None
