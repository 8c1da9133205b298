"""Jobs a fast path parks until a count it keeps has room (on the native engine).

A path plans a job ahead of the I/O, and some of what planning takes is bounded: the chunks an
fs load pins (so that a store always finds a chunk to evict), the slots an nvme store
allocates (so that eviction always finds a victim). A job past the bound is parked in its
engine slot (:data:`~.fastpath.PARKED`) here, and planned, in order, once the jobs ahead
give back enough. A job of a cancelled call ends wherever it waits, at the path's next flush
(:meth:`.native_engine.NativeEngine.withdraw` flushes): it never waits for other calls' I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from asynctier.core.jobs import Job

from .fastpath import PARKED, Parked, Step

if TYPE_CHECKING:
    from .native_engine import NativeEngine

__all__ = ["RoomQueue"]


class RoomQueue:
    """What a path's planned jobs hold (:attr:`used`) against :attr:`most`, and the jobs parked
    until there is room for theirs, first come first planned; on the loop thread only."""

    def __init__(self) -> None:
        #: the most :attr:`used` may reach (None: no bound); set by the path
        self.most: int | None = None
        #: counted by the path: up when it plans a job, down when the job gives it back
        self.used = 0
        #: (slot, job, how to plan it, what it will use: 0 for a job that only keeps its
        #: place in the order)
        self.waiting: deque[tuple[int, Job, Callable[[Job, int], Step], int]] = deque()

    def room(self, n: int) -> bool:
        """Whether a job using ``n`` may be planned now (one always may while nothing is used)."""
        return not self.used or self.most is None or self.used + n <= self.most

    def park(self, slot: int, job: Job, plan: Callable[[Job, int], Step], n: int) -> Parked:
        self.waiting.append((slot, job, plan, n))
        return PARKED

    def admit(self, engine: NativeEngine) -> None:
        """End the parked jobs whose call is cancelled, then plan the others in order while
        there is room (on the loop thread, outside the engine's own steps: the caller then has
        the engine pump, or is the engine's flush)."""
        waiting = self.waiting
        if any(w[1].batch.cancelled for w in waiting):
            # never planned: nothing taken, nothing to undo; withdrawn now, wherever they wait
            for slot, job, _, _ in waiting:
                if job.batch.cancelled:
                    engine.withdraw_parked(slot, job)
            self.waiting = waiting = deque(w for w in waiting if not w[1].batch.cancelled)
        while waiting and (not waiting[0][3] or self.room(waiting[0][3])):
            slot, job, plan, _ = waiting.popleft()
            try:
                r = plan(job, slot)
            except BaseException as e:  # the job's failure, as the engine's own planning books it
                job.exc, r = e, None
            engine.go_on(slot, job, r)
