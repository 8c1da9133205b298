"""The native paths' jobs that found the index lock busy (the event loop's thread only ever
tries it): parked in their engine slots until its next release (:class:`.slots.IndexLock`),
then planned again on the loop thread.

Why: a checkpoint holds the lock across its snapshot (3-13 ms at 390,000 slots). Such a job
went to a slow-path thread, which waited there for the lock and then ran the threads path's
steps, Python holding the GIL beside the checkpointer. Parked, it holds only its slot, and goes
on by the fast path at the release. (The loop's worst lateness while streaming into a large
slab did not change with it: docs/benchmarks.md.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asynctier.core.jobs import Job
from asynctier.engines.fastpath import PARKED, Parked, Step
from asynctier.engines.native_engine import NativeEngine

from .slots import IndexLock

__all__ = ["LockWaiters"]


class LockWaiters:
    """One native path's jobs parked for the index lock. ``again(slot, job, state)`` plans
    each again once it is released (on the loop thread), returning the job's next step; one
    parked with no state (not planned yet) whose call is cancelled is withdrawn instead."""

    def __init__(self, engine: NativeEngine, again: Callable[[int, Job, Any], Step]) -> None:
        self._engine = engine
        self._again = again
        self._jobs: list[tuple[int, Job, Any]] = []
        self._asked = False

    def park(self, lock: IndexLock, slot: int, job: Job, state: Any = None) -> Parked:
        """Park ``job`` (in ``slot``, ``state`` its path's) until ``lock``'s next release."""
        self._jobs.append((slot, job, state))
        if not self._asked:
            self._asked = True
            lock.when_free(self._released)
        return PARKED

    def _released(self) -> None:
        """(the releasing thread, or the loop's)"""
        self._engine.call_soon_threadsafe(self._again_all)

    def _again_all(self) -> None:
        self._asked = False
        jobs, self._jobs = self._jobs, []
        again, engine = self._again, self._engine
        for slot, job, state in jobs:
            if state is None and job.batch.cancelled:  # parked before it was planned: withdrawn
                engine.withdraw_parked(slot, job)
                continue
            try:
                step = again(slot, job, state)
            except BaseException as e:  # the job's failure, as from a plan
                job.exc, step = e, None
            engine.go_on(slot, job, step)
        engine.pump()
