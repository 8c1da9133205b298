"""How many chunks the fs tier's loads may pin ahead of the I/O on the native engine.

A load pins its chunks when the engine plans it, so that no store evicts them before they are
read, and the engine plans jobs ahead of the workers: up to ``max_inflight + max(max_inflight,
8)`` jobs of up to :data:`.native.GROUP_CHUNKS` chunks, 1024 chunks at the default depth. A store
into a full tier evicts a chunk that is not pinned, and fails with ``CapacityError`` when none
is: so a burst of loads could fail every store into a tier of fewer chunks than that. Here the
load jobs planned and not yet ended pin at most half the tier's capacity; a job past that waits
in its engine slot (parked) until the ones ahead end, as the nvme tier's stores wait for room.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from asynctier.core.jobs import Job
from asynctier.engines.native_engine import PARKED, Parked, Step

if TYPE_CHECKING:
    from asynctier.engines.native_engine import NativeEngine

__all__ = ["LoadsAhead"]


class LoadsAhead:
    """The chunks of the load jobs planned and not yet ended, and the jobs parked in order: a
    load until there is room for its chunks, a store until the loads parked before it are
    planned (loads go ahead of stores: parking a load must not let a later store evict its
    chunks first). Shared by the tier's two paths; on the loop thread only."""

    def __init__(self) -> None:
        #: the most chunks planned at once (None: no bound), set by the load path from the
        #: tier's capacity
        self.most: int | None = None
        self.chunks = 0
        #: (slot, job, how to plan it, the chunks it pins: 0 for a store)
        self.waiting: deque[tuple[int, Job, Callable[[Job, int], Step], int]] = deque()

    def room(self, n: int) -> bool:
        """Whether a load of ``n`` chunks may be planned now (one always may, with none ahead)."""
        return not self.chunks or self.most is None or self.chunks + n <= self.most

    def park(self, slot: int, job: Job, plan: Callable[[Job, int], Step], n: int) -> Parked:
        self.waiting.append((slot, job, plan, n))
        return PARKED

    def admit(self, engine: NativeEngine) -> None:
        """Plan the jobs parked, in order, while there is room (on the loop thread, outside
        the engine's own steps: the caller then has the engine pump, or is the engine's flush)."""
        waiting = self.waiting
        if any(w[1].batch.cancelled for w in waiting):
            # never planned: nothing pinned or reserved, nothing to undo; over now, wherever
            # they wait (a cancelled call does not wait for other calls' loads to end)
            for slot, job, _, _ in waiting:
                if job.batch.cancelled:
                    engine.go_on(slot, job, None)
            self.waiting = waiting = deque(w for w in waiting if not w[1].batch.cancelled)
        while waiting and (not waiting[0][3] or self.room(waiting[0][3])):
            slot, job, plan, _ = waiting.popleft()
            try:
                r = plan(job, slot)
            except BaseException as e:  # the job's failure, as the engine's own planning books it
                job.exc, r = e, None
            engine.go_on(slot, job, r)
