"""The hand-off between the event loop and the native workers: the loop's side (submitting,
reaping) never waits for the workers' lock, every job submitted is reported once, and a
pool told to stop while the loop submits runs what it took and refuses the rest."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import shutil
import subprocess
import sysconfig
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from native_helpers import HeldToken

from asynctier.engines import native as nativeio

native_only = pytest.mark.skipif(nativeio.problem() is not None, reason=f"no native workers: {nativeio.problem()}")
ROOT = Path(__file__).resolve().parents[1]


def _cc() -> str | None:
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc) or shutil.which("cc")


@native_only
@pytest.mark.skipif(_cc() is None, reason="no C compiler to build the test harness")
def test_the_loop_side_never_waits_for_the_workers_lock(tmp_path: Path) -> None:
    """A C harness (tests/c/pool_handoff.c) holds the workers' lock, as a worker descheduled
    while holding it would, and submits, reaps and sets the low water mark from another
    thread: they return (before the rings, each waited for the lock), and a slow path's token
    calls made holding the GIL say -EAGAIN rather than wait; the job runs once the lock is
    let go."""
    exe = tmp_path / "pool_handoff"
    src = ROOT / "asynctier" / "engines"
    sources = [ROOT / "tests" / "c" / "pool_handoff.c", *(src / f"_nativeio{p}.c" for p in ("", "_submit", "_jobs"))]
    build = [_cc(), "-O1", "-pthread", "-I", str(src), *map(str, sources), "-o", str(exe)]
    subprocess.run(build, check=True, capture_output=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"harness failed ({run.returncode}): {run.stdout}{run.stderr}"
    assert run.stdout.strip() == "ok"


@native_only
@pytest.mark.skipif(_cc() is None, reason="no C compiler to build the test harness")
def test_an_end_is_counted_in_its_own_group_when_its_slot_is_reused_at_once(tmp_path: Path) -> None:
    """A C harness (tests/c/report_race.c) holds a worker just after it published a job's
    end, as a preempted one would be; the loop reaps that job and submits the next into the
    same slot, in another group, before the worker goes on. Both groups' counts end at zero
    and the second group's end wakes the loop. Before, the worker read the slot's group after
    publishing: it counted the next job's group down, whose end then woke no one (a call
    waiting for it hung; seen once in ~3 million stores into a full fs tier)."""
    exe = tmp_path / "report_race"
    src = ROOT / "asynctier" / "engines"
    sources = [ROOT / "tests" / "c" / "report_race.c", *(src / f"_nativeio{p}.c" for p in ("", "_submit", "_jobs"))]
    build = [_cc(), "-O1", "-pthread", "-DAT_TEST_HOOKS", "-I", str(src), *map(str, sources), "-o", str(exe)]
    subprocess.run(build, check=True, capture_output=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, f"harness failed ({run.returncode}): {run.stdout}{run.stderr}"
    assert run.stdout.strip() == "ok"


def _unlink(dfd: int, i: int) -> nativeio.JobFields:
    return nativeio.fields(nativeio.UNLINK, i % 4, dfd, b"absent-%d" % i)


@native_only
async def test_every_job_submitted_in_batches_is_reported_once(tmp_path: Path) -> None:
    """Batches of every size into whichever slots are free, reaped as they end, while the
    workers drain the ring: each job comes back once, with its own outcome, and nothing is
    left waiting (a lost wake-up of a worker or of the loop would hang here)."""
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=5, bound=2, slots=8)
    seen: dict[int, tuple[int, int]] = {}
    dupes: list[int] = []
    free = asyncio.Event()

    def on_done(owner: Any, slot: int, result: int, csum: int, stage: int, info: int) -> None:
        if owner in seen:
            dupes.append(owner)
        seen[owner] = (result, stage)
        pool.put_slot(slot)
        free.set()

    pool.on_done = on_done
    pool.attach()
    rng = random.Random(7)
    try:
        n = 0
        with anyio.fail_after(60):
            while n < 3000:
                if not pool.free_slots:
                    free.clear()
                    await free.wait()
                k = rng.randint(1, len(pool.free_slots))
                batch = [(pool.take_slot(), rng.choice((-1, 0)), n + i, _unlink(dfd, n + i)) for i in range(k)]
                assert pool.submit_many(batch) == []
                n += k
                if rng.random() < 0.3:
                    await asyncio.sleep(0)
            while len(seen) < n:
                free.clear()
                await free.wait()
    finally:
        await pool.aclose()
        os.close(dfd)
    assert not dupes
    assert sorted(seen) == list(range(n))
    assert set(seen.values()) == {(-errno.ENOENT, nativeio.ST_UNLINK)}


@native_only
async def test_a_pool_stopped_while_the_loop_submits_runs_what_it_took(tmp_path: Path) -> None:
    """at_shutdown from another thread (a pool dropped without aclose) while the loop keeps
    submitting: each job is either refused at submission or run and reported, never lost."""
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=3, bound=2, slots=16)
    reported: list[int] = []
    refused: list[int] = []
    ended = asyncio.Event()

    def on_done(owner: Any, slot: int, *_: int) -> None:
        reported.append(owner)
        pool.put_slot(slot)
        ended.set()

    pool.on_done = on_done
    pool.attach()
    stop = threading.Timer(0.02, pool._lib.at_shutdown, (pool._h,))
    try:
        stop.start()
        n = 0
        with anyio.fail_after(60):
            while not refused:
                while pool.free_slots and not refused:
                    out = pool.submit_many([(pool.take_slot(), -1, n, _unlink(dfd, n))])
                    refused += [owner for _, owner, err in out if err == errno.ESHUTDOWN]
                    for slot, _, _ in out:
                        pool.put_slot(slot)
                    n += 1
                await asyncio.sleep(0)
            while len(reported) + len(refused) < n:
                ended.clear()
                await ended.wait()
    finally:
        stop.join()
        await pool.aclose()
        os.close(dfd)
    assert sorted(reported + refused) == list(range(n))
    assert refused == [n - 1]  # the first refused ends the submissions


class TokenHeld:
    """A pool of one I/O token that a slow path (a thread inside hold()) holds until
    :meth:`let_go`; ``ended`` lists the owners of the jobs reported, in order."""

    def __init__(self, tmp_path: Path) -> None:
        self.dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        self.pool = nativeio.NativePool(threads=3, bound=1, slots=4)
        self.ended: list[object] = []
        self.reported = asyncio.Event()  # set at the first report
        self.pool.on_done = lambda owner, slot, *_: (self.ended.append(owner), self.reported.set())
        self.pool.attach()
        self._held = HeldToken(self.pool)

    async def __aenter__(self) -> TokenHeld:
        await self._held.__aenter__()
        return self

    def let_go(self) -> None:
        self._held.let_go()

    async def __aexit__(self, *exc: object) -> None:
        await self._held.__aexit__()
        await self.pool.aclose()
        os.close(self.dfd)


@native_only
async def test_a_job_submitted_while_slow_paths_hold_every_token_runs_when_one_is_given_back(
    tmp_path: Path,
) -> None:
    """A job submitted while slow paths hold every I/O token waits for one, and runs once one
    is given back: whoever gives a token back must find what was submitted meanwhile (a
    submission that woke no worker for want of a token would otherwise wait for ever)."""
    async with TokenHeld(tmp_path) as t:
        assert t.pool.submit_many([(t.pool.take_slot(), -1, "job", _unlink(t.dfd, 1))]) == []
        await asyncio.sleep(0.2)
        assert not t.ended  # no token: it waits
        t.let_go()
        with anyio.fail_after(30):
            await t.reported.wait()
        assert t.ended == ["job"]


@native_only
async def test_aclose_waits_for_jobs_submitted_in_a_batch_and_reports_them(tmp_path: Path) -> None:
    """aclose() waits for every job submitted, submit_many()'s as well as run()'s, and each is
    reaped (on_done called) before the pool goes: here a batch job waits for the one token a
    slow path holds while aclose() begins."""
    async with TokenHeld(tmp_path) as t:
        assert t.pool.submit_many([(t.pool.take_slot(), -1, "job", _unlink(t.dfd, 1))]) == []
        closing = asyncio.ensure_future(t.pool.aclose())
        await asyncio.sleep(0.2)
        assert not closing.done() and not t.ended  # the job waits for the token
        t.let_go()
        with anyio.fail_after(30):
            await closing
        assert t.ended == ["job"]
