"""The native engine's own cost per job on the event loop's thread: jobs that do next to nothing.

A fast path whose every job is one C worker job unlinking a name that does not exist (one
failed system call): what the loop thread then spends per job is the engine's and the pool's
share of any tier's cost (claiming, planning, the pool's submission and its batch of ends,
booking), without a tier's own planning. The fs tier runs one such job per chunk, the nvme
tier one per run of adjacent slots. ``callers`` coroutines each submit calls of ``batch``
jobs until ``jobs`` have run; reported per loop: the loop thread's CPU time per job
(``time.thread_time``), the wall time per job and the workers' wake-ups of the loop per job;
the median of ``repeat`` runs.

Run from the repository root: ``.venv/bin/python bench/bench_native_engine.py`` (``--help``);
prints a table and, with ``--json``, writes the figures. Needs the native library (built by
``pip install -e .`` with a C compiler).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import anyio
from rows_json import write_rows

from asynctier.core.jobs import Batch, Job
from asynctier.core.ops import PRIO_LOAD, Op
from asynctier.engines import native as nativeio
from asynctier.engines.native_engine import NativeEngine

BACKENDS: dict[str, tuple[str, dict[str, Any]]] = {
    "asyncio": ("asyncio", {}),
    "uvloop": ("asyncio", {"use_uvloop": True}),
    "trio": ("trio", {}),
}


class _Unlink:
    """A fast path: every job unlinks ``name`` in ``dfd`` (absent: ENOENT) and is then over."""

    def __init__(self, dfd: int) -> None:
        self._fields = nativeio.fields(nativeio.UNLINK, PRIO_LOAD, dfd, b"absent")

    def plan(self, job: Job, slot: int) -> nativeio.JobFields:
        return self._fields

    def finish(self, job: Job, slot: int, result: int, csum: int, stage: int, info: int) -> None:
        return None

    def flush(self) -> None:
        pass

    def withdrawable(self, job: Job, slot: int) -> bool:
        return True

    def withdraw(self, job: Job, slot: int) -> None:
        return None  # (planning did nothing to undo)


async def measure(dfd: int, jobs: int, batch: int, callers: int, depth: int) -> dict[str, float]:
    engine = NativeEngine(depth, nice=5)
    engine.fast[Op.LOAD] = _Unlink(dfd)
    engine.start()
    calls = max(1, jobs // batch // callers)

    async def caller() -> None:
        for _ in range(calls):
            b = Batch(batch)
            await engine.run([Job(Op.LOAD, _never, (), (b"k",), b, priority=PRIO_LOAD) for _ in range(batch)])

    n = calls * batch * callers
    try:
        wakes0, cpu0, t0 = engine.wakeups, time.thread_time(), time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(callers):
                tg.start_soon(caller)
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - t0
        return {"us_per_job": cpu / n * 1e6, "wall_us_per_job": wall / n * 1e6,
                "wakeups_per_job": (engine.wakeups - wakes0) / n}  # fmt: skip
    finally:
        await engine.stop()


def _never() -> None:  # a job's body: never run (the fast path takes every job)
    raise AssertionError("the fast path runs every job")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=40_000, help="jobs per run")
    ap.add_argument("--batch", type=int, default=32, help="jobs per call")
    ap.add_argument("--callers", type=int, default=4, help="concurrent callers")
    ap.add_argument("--depth", type=int, default=16, help="the engine's bound (max_inflight)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per loop, interleaved; the median is reported")
    ap.add_argument("--backends", default="asyncio,uvloop,trio")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    if nativeio.problem() is not None:
        print(f"the native engine is unavailable: {nativeio.problem()}", file=sys.stderr)
        return 2
    backends = args.backends.split(",")
    runs: dict[str, list[dict[str, float]]] = {b: [] for b in backends}
    with tempfile.TemporaryDirectory(prefix="asynctier-engine-") as d:
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for rep in range(args.repeat):
                for b in backends:
                    name, options = BACKENDS[b]
                    r = anyio.run(measure, dfd, args.jobs, args.batch, args.callers, args.depth,
                                  backend=name, backend_options=options)  # fmt: skip
                    runs[b].append(r)
                    print(f"[{rep + 1}/{args.repeat}] {b:8} {r['us_per_job']:6.2f} us/job on the loop, "
                          f"{r['wall_us_per_job']:6.2f} us/job wall", flush=True)  # fmt: skip
        finally:
            os.close(dfd)
    rows = [{"backend": b, **{k: statistics.median(r[k] for r in runs[b]) for k in runs[b][0]}} for b in backends]
    print(f"\nnative engine, jobs of one failed unlink, calls of {args.batch}, {args.callers} callers, "
          f"depth {args.depth} (median of {args.repeat})")  # fmt: skip
    print(f"{'loop':8} | {'loop us/job':>11} | {'wall us/job':>11} | {'wakes/job':>9}")
    for row in rows:
        print(f"{row['backend']:8} | {row['us_per_job']:11.2f} | {row['wall_us_per_job']:11.2f} | "
              f"{row['wakeups_per_job']:9.3f}")  # fmt: skip
    write_rows(args.json, args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
