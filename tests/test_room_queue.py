"""The queue of jobs a native fast path parks until it has room (asynctier/engines/room.py):
first come first planned, a job that only keeps its place needs no room, a cancelled call's
jobs are withdrawn wherever they wait (never ended as a success), a failed plan is the job's
failure. The engine here records what the queue asks of it; the paths that use the queue run
against real tiers in test_fs_loads_ahead.py and test_nvme_native.py."""

from __future__ import annotations

from typing import Any

from asynctier.core import Op
from asynctier.core.jobs import Batch, Job
from asynctier.engines.fastpath import PARKED
from asynctier.engines.room import RoomQueue


class Recorder:
    """The two calls RoomQueue makes of a NativeEngine."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, Any]] = []

    def go_on(self, slot: int, job: Job, step: Any) -> None:
        self.calls.append(("go_on", slot, step))

    def withdraw_parked(self, slot: int, job: Job) -> None:
        self.calls.append(("withdrawn", slot, None))


def _job(n: int, batch: Batch | None = None) -> Job:
    keys = [b"k%d" % i for i in range(n)]
    return Job(Op.LOAD, lambda: None, (), keys, batch or Batch(1), grouped=n > 1)


async def test_parked_jobs_are_planned_in_order_while_there_is_room() -> None:
    q, engine = RoomQueue(), Recorder()
    q.most = 8
    planned: list[int] = []

    def plan(job: Job, slot: int) -> Any:
        q.used += len(job.keys)
        planned.append(slot)
        return ("fields", slot)

    assert q.room(100)  # nothing used: one job always may
    q.used = 6
    assert q.room(2) and not q.room(3)

    def keep_place(job: Job, slot: int) -> Any:  # (a store: it uses none of the count)
        planned.append(slot)
        return ("fields", slot)

    assert q.park(1, _job(4), plan, 4) is PARKED  # a load of 4
    assert q.park(2, _job(1), keep_place, 0) is PARKED  # a store keeping its place
    assert q.park(3, _job(1), plan, 1) is PARKED  # a load of 1
    q.admit(engine)  # 6 used: the head (4) does not fit, and nothing behind it goes first
    assert engine.calls == [] and len(q.waiting) == 3
    q.used = 3
    q.admit(engine)  # 3 + 4 fits; the store then goes, needing none; 7 + 1 fits
    assert planned == [1, 2, 3] and not q.waiting
    assert engine.calls == [("go_on", 1, ("fields", 1)), ("go_on", 2, ("fields", 2)), ("go_on", 3, ("fields", 3))]


async def test_a_cancelled_calls_parked_jobs_are_withdrawn_wherever_they_wait() -> None:
    q, engine = RoomQueue(), Recorder()
    q.most, q.used = 4, 4  # no room for anyone
    cancelled = Batch(2)
    plan_calls: list[int] = []

    def plan(job: Job, slot: int) -> Any:
        plan_calls.append(slot)
        return None

    q.park(1, _job(2), plan, 2)
    q.park(2, _job(2, cancelled), plan, 2)
    q.park(3, _job(1, cancelled), plan, 0)
    cancelled.cancelled = True
    q.admit(engine)
    assert engine.calls == [("withdrawn", 2, None), ("withdrawn", 3, None)]
    assert plan_calls == [] and [w[0] for w in q.waiting] == [1]


async def test_a_plan_that_raises_is_the_jobs_failure_and_the_queue_goes_on() -> None:
    q, engine = RoomQueue(), Recorder()
    bad, good = _job(1), _job(1)

    def plan(job: Job, slot: int) -> Any:
        if job is bad:
            raise OSError("no")
        return ("fields", slot)

    q.park(1, bad, plan, 1)
    q.park(2, good, plan, 1)
    q.admit(engine)
    assert isinstance(bad.exc, OSError) and good.exc is None
    assert engine.calls == [("go_on", 1, None), ("go_on", 2, ("fields", 2))]
