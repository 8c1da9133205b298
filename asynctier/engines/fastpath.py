"""What a tier gives the native engine to run one operation's jobs on the loop thread: a
:class:`FastPath` (plan a job into a worker descriptor, book what the workers report), and
the values its steps return. The engine that drives it: :mod:`.native_engine`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..core.jobs import Job
from .native import JobFields

__all__ = ["PARKED", "Continuation", "FastPath", "Parked", "Step"]

#: What is left of a job when it leaves the fast path: a coroutine function whose outcome is the job's.
Continuation = Callable[[], Awaitable[Any]]


class Parked:
    """The type of :data:`PARKED`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PARKED"


#: A job that waits for something other than the workers (the nvme journal) keeping its slot:
#: its path later calls :meth:`~.native_engine.NativeEngine.resume` or :meth:`~.native_engine.NativeEngine.unpark`.
PARKED = Parked()

#: What ``plan`` and ``finish`` return (see :class:`FastPath`).
Step = JobFields | Continuation | Parked | None


class FastPath(Protocol):
    """How a tier runs one operation's jobs on the loop thread, without a coroutine per chunk."""

    def plan(self, job: Job, slot: int) -> Step:
        """Begin ``job`` holding pool slot ``slot``: the descriptor to run in it; or a
        continuation (the slot is given back first); or None when the job is over (its
        outcome set); or :data:`PARKED` (it keeps the slot). An exception is the job's failure."""
        ...

    def finish(self, job: Job, slot: int, result: int, csum: int, stage: int, info: int) -> Step:
        """Book what the workers reported for ``job`` (slot still held): None when it is
        over; the descriptor of its next step (run in the same slot); a continuation (the
        slot is given back first); or :data:`PARKED`. An exception is the job's failure."""
        ...

    def flush(self) -> None:
        """Book what :meth:`finish` left to do in bulk (counters): called after each batch
        of ends, before any caller they woke runs, and after a call's jobs were withdrawn:
        a job parked while waiting for room (not for its own I/O) whose call is cancelled
        ends here (:meth:`~.native_engine.NativeEngine.go_on` with None)."""
        ...

    def withdrawable(self, job: Job, slot: int) -> bool:
        """Whether the step of ``job`` handed to the workers in ``slot`` may be taken back
        (its call is cancelled): not a step that is not the job's own (a journal commit)."""
        ...

    def withdraw(self, job: Job, slot: int) -> Continuation | None:
        """``job``'s step in ``slot`` was taken back before any worker started it (its call is
        cancelled): undo what planning it did (reservations, pins, files made ahead), as if
        it had never started; None, or a continuation that does what cannot be done here
        (slot still held; it is given back first). Its outcome is not read."""
        ...
