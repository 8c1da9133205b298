"""The native engine's planning: one turn of the event loop plans at most ``plan_chunks``
chunks of new jobs (at least one job), the rest in the turns after, so that a large call, or
a call of group jobs, does not hold the loop for its whole planning."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from asynctier.core.jobs import Batch, Job, evened
from asynctier.core.ops import PRIO_LOAD, Op
from asynctier.engines import native as nativeio
from asynctier.engines.native_engine import NativeEngine

native_only = pytest.mark.skipif(nativeio.problem() is not None, reason=f"no native workers: {nativeio.problem()}")


class Counting:
    """A fast path whose jobs each unlink an absent name (one failed system call), counting
    the chunks planned."""

    def __init__(self, dfd: int) -> None:
        self._fields = nativeio.fields(nativeio.UNLINK, PRIO_LOAD, dfd, b"absent")
        self.planned = 0
        self.finished = 0

    def plan(self, job: Job, slot: int) -> nativeio.JobFields:
        self.planned += len(job.keys)
        return self._fields

    def finish(self, job: Job, slot: int, result: int, csum: int, stage: int, info: int) -> None:
        self.finished += len(job.keys)
        if job.grouped:
            job.result = [None] * len(job.keys)

    def flush(self) -> None:
        pass


def _never() -> None:  # the fast path runs every job
    raise AssertionError("not run")


def _jobs(n: int, per_job: int = 1) -> list[Job]:
    batch = Batch(n)
    if per_job == 1:
        return [Job(Op.LOAD, _never, (), (b"k",), batch, priority=PRIO_LOAD) for _ in range(n)]
    return [Job(Op.LOAD, _never, (), (b"k",) * per_job, batch, grouped=True) for _ in range(n)]


@native_only
async def test_a_turn_of_the_loop_plans_at_most_plan_chunks(tmp_path: Path) -> None:
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    engine = NativeEngine(16, plan_chunks=16)
    path = engine.fast[Op.LOAD] = Counting(dfd)
    engine.start()
    try:
        assert NativeEngine(16).plan_chunks > 1000  # unbounded unless asked
        jobs = _jobs(40)
        engine.submit(jobs)
        assert path.planned == 16  # this turn: the budget; the slots (32) would take more
        with anyio.fail_after(10):
            await jobs[0].batch.event.wait()
        assert path.planned == path.finished == 40
        # jobs larger than the budget: one a turn
        big = _jobs(3, per_job=24)
        engine.submit(big)
        assert path.planned == 40 + 24
        with anyio.fail_after(10):
            await big[0].batch.event.wait()
        assert path.finished == 40 + 72
    finally:
        await engine.stop()
        os.close(dfd)


def test_evened_cuts_a_call_into_as_few_jobs_as_it_takes_evened_out() -> None:
    """``evened`` (tiers' group_size): as few jobs of at most ``most`` as it takes, the
    chunks spread evenly over them; ``most`` below 1 counts as 1."""
    assert [evened(n, 16) for n in (1, 2, 16, 17, 20, 32, 33)] == [1, 2, 16, 9, 10, 16, 11]
    assert evened(5, 0) == evened(5, 1) == 1
