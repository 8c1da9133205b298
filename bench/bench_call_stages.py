"""Where a call's event-loop time goes, stage by stage: a diagnostic for the native engine.

``bench_loop_cpu.py`` gives the loop thread's CPU a chunk and ``bench_loop_opcodes.py`` the
Python it runs; neither says how much of the time is the engine's calls into C (reaping,
submitting, which may wake a worker thread), the tier's C twins, or the event loop itself.
This streams as ``bench_loop_cpu.py`` does (four callers of 32 chunks, ``max_inflight`` 16,
the native engine) through one fs or nvme tier, and times, on the loop thread, each stage of
the tier's path and each call into the native library, per call of the stream:

* wall time (``perf_counter``, no system call) of each stage, inclusive of the stages it
  calls (``submit`` holds the plan, a wake holds the ends, what they publish and the next
  submissions it starts); a stage interrupted by the scheduler counts that time too;
* the loop thread's CPU (``thread_time``) in each call into the native library: reaping and
  emptying the eventfd at each wake, and submitting, which wakes a parked worker (a futex
  call, and where that worker's CPU is idle, an interrupt sent to it);
* the loop thread's CPU for the whole stream, and what the timers themselves cost (measured
  around an empty function and taken off each figure).

It wraps the tier's and the engine's own methods, so unlike the other scripts it reads the
library's internals: it measures this checkout only, and a renamed method fails it loudly
(``tests/test_bench_scripts.py`` runs it). Run from the repository root:
``.venv/bin/python bench/bench_call_stages.py --tier nvme --op steady --root /var/tmp/DIR``
(``--help`` for options). Compare a disk with tmpfs in one sitting: the same calls into C
cost the loop more after it slept longer (docs/benchmarks-issue-28.md, thirty-fourth pass).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import anyio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_loop_cpu import BACKENDS, _aligned_view, _config, stream

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.engines import native as nativeio
from asynctier.engines.native_engine import NativeEngine

#: (class, method, what it does) of each tier's path, timed per call (inclusive)
STAGES: dict[str, list[tuple[str, str, str]]] = {
    "nvme": [
        ("tiers.nvme.stores:StorePath", "_plan", "store: slots taken, runs, headers packed"),
        ("tiers.nvme.catalog:Catalog", "allocate_many_locked", "store: slots taken (C twins)"),
        ("tiers.nvme.stores:StorePath", "finish", "store: runs ended (publish, park)"),
        ("tiers.nvme.catalog:Catalog", "publish_many_locked", "store: published, records queued (C twins)"),
        ("tiers.nvme.stores:StorePath", "_kick", "store: journal commit started"),
        ("tiers.nvme.stores:StorePath", "_committed", "store: commit ended, stores let go"),
        ("tiers.nvme.fast:LoadPath", "plan", "load: slots pinned, runs packed"),
        ("tiers.nvme.fast:LoadPath", "finish", "load: runs ended, checked"),
    ],
    "fs": [
        ("tiers.fs.fast:StorePath", "_plan_group", "store: files, headers, room"),
        ("tiers.fs.fast:StorePath", "_finish_group", "store: files published, booked"),
        ("tiers.fs.loads:LoadPath", "_plan_group", "load: files opened, pinned"),
        ("tiers.fs.loads:LoadPath", "_finish_group", "load: checked, booked"),
    ],
}
ENGINE = [
    (NativeEngine, "submit", "engine: a call's jobs in (plan included)"),
    (nativeio.NativePool, "_on_ready", "engine: a wake (reap, ends, what they start)"),
]
#: the library's calls made on the loop thread, timed in CPU
NATIVE = ("at_clear", "at_reap", "at_submit_many", "at_set_low_water")


def _cls(path: str) -> Any:
    mod, name = path.split(":")
    module = __import__(f"asynctier.{mod}", fromlist=[name])
    return getattr(module, name)


class Stages:
    """Timers around methods (wall) and native calls (CPU), undone by :meth:`close`."""

    def __init__(self) -> None:
        self.wall: collections.Counter[str] = collections.Counter()
        self.cpu: collections.Counter[str] = collections.Counter()
        self.count: collections.Counter[str] = collections.Counter()
        self._undo: list[Callable[[], None]] = []

    def method(self, cls: Any, name: str, label: str) -> None:
        orig = getattr(cls, name)  # AttributeError: the method was renamed; update STAGES
        wall, count, clock = self.wall, self.count, time.perf_counter_ns

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = clock()
            try:
                return orig(*args, **kwargs)
            finally:
                wall[label] += clock() - t
                count[label] += 1

        setattr(cls, name, timed)
        self._undo.append(lambda: setattr(cls, name, orig))

    def native(self, lib: Any, name: str) -> None:
        orig = getattr(lib, name)
        cpu, count, clock = self.cpu, self.count, time.thread_time_ns
        label = f"C call: {name}"

        def timed(*args: Any) -> Any:
            t = clock()
            try:
                return orig(*args)
            finally:
                cpu[label] += clock() - t
                count[label] += 1

        setattr(lib, name, timed)
        self._undo.append(lambda: setattr(lib, name, orig))

    def clear(self) -> None:
        self.wall.clear()
        self.cpu.clear()
        self.count.clear()

    def close(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()


def _timer_cost(clock: Callable[[], int]) -> float:
    """ns a pair of ``clock()`` readings adds around a call (the median over many calls of a
    function doing nothing, less that function's own cost)."""

    def nothing() -> None:
        return None

    timed = []
    for _ in range(2000):
        t = clock()
        nothing()
        timed.append(clock() - t)
    t0 = time.perf_counter_ns()
    for _ in range(2000):
        nothing()
    bare = (time.perf_counter_ns() - t0) / 2000
    timed.sort()
    return max(0.0, timed[len(timed) // 2] - bare)


async def run(args: argparse.Namespace, stages: Stages) -> dict[str, Any]:
    chunk = args.chunk_kib * 1024
    slots = max(args.batch * args.streams, 64)
    spec = OffloadingSpec(chunk, slots, namespace="bench/call-stages")
    view = _aligned_view(spec.total_bytes)
    root = tempfile.mkdtemp(prefix="stages-", dir=args.root)
    config = _config(args.tier, "native", root, args.depth, args.chunks, chunk, args.op == "steady")
    tier = SecondaryTierFactory.create_secondary_tier(config, view, spec)
    try:
        async with tier:
            engine = getattr(tier, "active_io_engine", None)
            if engine != "native":
                raise SystemExit(f"the {args.tier} tier runs on {engine!r} here, not the native engine")
            keys = [b"stages-%08d" % i for i in range(args.chunks)]
            if args.op != "fill":  # the keys to load, or a full tier to store new keys into
                await stream(tier, "offload", keys, slots, args.batch, args.streams)
            if args.op == "steady":
                keys = [b"stages-new-%08d" % i for i in range(args.chunks)]
            op = "load" if args.op == "load" else "offload"
            stages.clear()
            cpu0 = time.thread_time_ns()
            await stream(tier, op, keys, slots, args.batch, args.streams)
            cpu = time.thread_time_ns() - cpu0
    finally:
        shutil.rmtree(root, ignore_errors=True)
    calls = -(-args.chunks // args.batch)
    wall_cost, cpu_cost = _timer_cost(time.perf_counter_ns), _timer_cost(time.thread_time_ns)
    rows = []
    for label, ns in stages.wall.items():
        n = stages.count[label]
        rows.append({"stage": label, "per_call": n / calls, "us_per_call": (ns - n * wall_cost) / calls / 1e3,
                     "us_each": (ns - n * wall_cost) / n / 1e3, "clock": "wall"})  # fmt: skip
    for label, ns in stages.cpu.items():
        n = stages.count[label]
        rows.append({"stage": label, "per_call": n / calls, "us_per_call": (ns - n * cpu_cost) / calls / 1e3,
                     "us_each": (ns - n * cpu_cost) / n / 1e3, "clock": "cpu"})  # fmt: skip
    return {"tier": args.tier, "op": args.op, "chunk_kib": args.chunk_kib, "backend": args.backend, "root": args.root,
            "calls": calls, "loop_cpu_us_per_call": cpu / calls / 1e3, "loop_cpu_us_per_chunk": cpu / args.chunks / 1e3,
            "timer_ns": {"wall": wall_cost, "cpu": cpu_cost}, "stages": rows}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tier", choices=sorted(STAGES), default="nvme")
    ap.add_argument("--op", choices=("fill", "steady", "load"), default="fill",
                    help="fill: stores into room; steady: new keys into the full tier; load: those stored")  # fmt: skip
    ap.add_argument("--chunk-kib", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=2048)
    ap.add_argument("--depth", type=int, default=16, help="max_inflight")
    ap.add_argument("--batch", type=int, default=32, help="chunks per call")
    ap.add_argument("--streams", type=int, default=4, help="concurrent callers")
    ap.add_argument("--backend", choices=sorted(BACKENDS), default="asyncio")
    ap.add_argument("--root", default=None, help="directory for the tier's files (default: a temporary one)")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    if args.root:
        os.makedirs(args.root, exist_ok=True)
    if nativeio.problem() is not None:
        raise SystemExit(f"no native engine here: {nativeio.problem()}")

    stages = Stages()
    for path, name, label in STAGES[args.tier]:
        stages.method(_cls(path), name, label)
    for cls, name, label in ENGINE:
        stages.method(cls, name, label)
    # the library as the loop's side calls it (keeping the GIL): one object all pools share
    lib = nativeio._GIL_LIB
    for name in NATIVE:
        stages.native(lib, name)
    library, options = BACKENDS[args.backend]
    try:
        report = anyio.run(run, args, stages, backend=library, backend_options=options)
    finally:
        stages.close()

    timers = report["timer_ns"]
    print(f"{args.tier} {args.op} {args.chunk_kib} KiB on {args.backend}, {report['calls']} calls of {args.batch}: "
          f"loop CPU {report['loop_cpu_us_per_call']:.0f} us a call ({report['loop_cpu_us_per_chunk']:.1f} a chunk); "
          f"timers {timers['wall']:.0f} ns (wall), {timers['cpu']:.0f} ns (cpu), taken off")  # fmt: skip
    print(f"    {'us a call':>9} {'a call':>7} {'us each':>8}  clock  stage (inclusive of the stages it calls)")
    for r in sorted(report["stages"], key=lambda r: -r["us_per_call"]):
        print(f"    {r['us_per_call']:9.1f} {r['per_call']:7.2f} {r['us_each']:8.1f}  {r['clock']:5}  {r['stage']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
