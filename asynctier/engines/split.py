"""An engine that runs some operations on the native engine and the rest on the threads engine,
under one bound.

Why: a tier may have native fast paths for some operations only (the nvme and fs tiers' loads
and stores) while its other operations are blocking bodies that need a thread each (removals,
lookups, verification). On the native engine alone such a body runs as a continuation, a
coroutine and a thread hand-off per job; the threads engine runs it with no loop round trip
per chunk. Each threads-engine job holds one of the native pool's I/O tokens while it runs
(:meth:`~asynctier.engines.native.NativePool.hold`, at the job's priority), so ``bound`` holds
across both and queued loads still go ahead of the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ..core.jobs import Batch, Job
from ..core.ops import Op
from .base import DropHandler
from .native_engine import NativeEngine
from .threads import ThreadEngine

__all__ = ["SplitEngine"]


class SplitEngine:
    """``native`` runs the operations it has a fast path for (:attr:`NativeEngine.fast`);
    ``threads`` runs the others, each job holding a native I/O token (:meth:`held`). ``nice``:
    the C workers' (:class:`~asynctier.engines.native.NativePool`); ``plan_chunks``: the
    native engine's (:class:`~asynctier.engines.native_engine.NativeEngine`)."""

    def __init__(self, bound: int, name: str = "asynctier", nice: int = 0, plan_chunks: int | None = None) -> None:
        self.native = NativeEngine(bound, name=name, nice=nice, plan_chunks=plan_chunks)
        self.threads = ThreadEngine(bound, name=f"{name}-t")
        self.bound = bound

    @property
    def fast(self) -> dict[Op, Any]:
        """The native engine's fast paths, by operation (the tier fills it in before start)."""
        return self.native.fast

    def held(self, body: Callable[..., Any], prio: int) -> Callable[..., Any]:
        """``body`` (a blocking job body for the threads engine) run holding one I/O token of
        the native pool, taken at ``prio`` (the job's priority)."""

        def run(*args: Any) -> Any:
            pool = self.native.pool
            if pool is None:  # stopped: the threads engine refuses new jobs before this
                raise RuntimeError("native I/O pool is not running")
            return pool.hold(body, *args, prio=prio)

        return run

    def _for(self, jobs: Iterable[Job]) -> NativeEngine | ThreadEngine:
        for job in jobs:  # a call's jobs share one operation
            return self.native if job.op in self.native.fast else self.threads
        return self.threads

    # -- Engine ----------------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return self.native.in_flight  # the pool's tokens: both engines' jobs hold one

    @property
    def peak_in_flight(self) -> int:
        return self.native.peak_in_flight

    @property
    def queued(self) -> int:
        return self.native.queued + self.threads.queued

    @property
    def workers(self) -> int:
        return self.bound

    def new_batch(self, size: int, op: Op) -> Batch:
        return (self.native if op in self.native.fast else self.threads).new_batch(size, op)

    def start(self) -> None:
        self.native.start()
        try:
            self.threads.start()
        except BaseException:
            self.native.stop_nowait()
            raise

    async def run(
        self, jobs: list[Job], *, drop_after: float | None = None, on_drop: DropHandler | None = None
    ) -> None:
        # (runs per call: _for written out)
        engine = self.native if jobs and jobs[0].op in self.native.fast else self.threads
        await engine.run(jobs, drop_after=drop_after, on_drop=on_drop)

    def cancel_pending(self, jobs: Iterable[Job]) -> list[Job]:
        jobs = list(jobs)
        return self._for(jobs).cancel_pending(jobs)

    def withdraw(self, jobs: Iterable[Job]) -> None:
        jobs = list(jobs)
        self._for(jobs).withdraw(jobs)

    def check_stop_here(self) -> None:
        self.native.check_stop_here()  # (the threads engine serves any loop)

    async def stop(self) -> None:
        try:
            await self.threads.stop()  # its jobs hold the pool's tokens: they end first
        finally:
            await self.native.stop()

    def stop_nowait(self) -> None:
        self.threads.stop_nowait()
        self.native.stop_nowait()
