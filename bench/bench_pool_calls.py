"""Time the event loop's thread spends inside the native pool's C calls, on and off the CPU.

The loop thread calls into the C workers' pool to submit jobs (``at_submit_many``), to reap
their ends (``at_reap``) and to set its low-water mark. A call that waits (on a lock a worker
holds, or for a CPU after a wake-up) blocks the whole event loop without using CPU, which
``bench_loop_cpu.py`` cannot see: this streams stores into a full tier, then loads, as that
script does, and reports for each call the loop thread's CPU time and wall time per chunk,
and the longest single call. A diagnostic of the native engine for its developers: it wraps
the pool's ctypes handles (``NativePool``'s ``_lib`` and, where it has one, ``_glib``), so it
measures whichever checkout is installed, old or new, run after run.

Run from the repository root: ``.venv/bin/python bench/bench_pool_calls.py`` (``--help``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import anyio
from bench_loop_cpu import _aligned_view, _config, stream

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.engines import native

#: per call name: [calls, thread CPU ns, wall ns, longest wall ns]
Tally = dict[str, list[int]]


class _Timed:
    """A ctypes library handle whose calls are timed into ``tally``."""

    def __init__(self, lib: Any, tally: Tally) -> None:
        self._lib = lib
        self._tally = tally

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._lib, name)
        tally = self._tally

        def timed(*args: Any) -> Any:
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            try:
                return fn(*args)
            finally:
                wall = time.perf_counter_ns() - w0
                t = tally[name]
                t[0] += 1
                t[1] += time.thread_time_ns() - c0
                t[2] += wall
                t[3] = max(t[3], wall)

        return timed


def _instrument(tally: Tally) -> None:
    init = native.NativePool.__init__

    def patched(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        for attr in ("_lib", "_glib"):
            if hasattr(self, attr):
                setattr(self, attr, _Timed(getattr(self, attr), tally))

    native.NativePool.__init__ = patched  # type: ignore[method-assign]


async def run(tier_type: str, kib: int, chunks: int, root: str, tally: Tally) -> list[dict[str, Any]]:
    spec = OffloadingSpec(kib << 10, 128, namespace="probe")
    cfg = _config(tier_type, "native", root, 16, chunks, kib << 10, True)
    tier = SecondaryTierFactory.create_secondary_tier(cfg, _aligned_view(spec.total_bytes), spec)
    out = []
    async with tier:
        await stream(tier, "offload", [b"fill-%d" % i for i in range(chunks)], 128, 32, 4)
        keys = [b"full-%d" % i for i in range(chunks)]
        for phase, op in (("full tier", "offload"), ("load", "load")):
            tally.clear()
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            await stream(tier, op, keys, 128, 32, 4)
            cpu, wall = time.thread_time_ns() - c0, time.perf_counter_ns() - w0
            calls = {
                name: {"calls": n, "cpu_us": c / chunks / 1e3, "wall_us": w / chunks / 1e3, "max_us": m / 1e3}
                for name, (n, c, w, m) in sorted(tally.items())
                if name in ("at_submit", "at_submit_many", "at_reap", "at_set_low_water")
            }
            out.append({"tier": tier_type, "chunk_kib": kib, "phase": phase, "loop_cpu_us": cpu / chunks / 1e3,
                        "loop_wall_us": wall / chunks / 1e3, "calls": calls})  # fmt: skip
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiers", default="fs,nvme")
    ap.add_argument("--chunk-kib", default="64,256", help="chunk sizes in KiB, comma-separated")
    ap.add_argument("--chunks", type=int, default=8192, help="chunks per phase")
    ap.add_argument("--root", default=None, help="directory for the tier's files (default: a temporary one)")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    if native.problem() is not None:
        print(f"no native workers: {native.problem()}", file=sys.stderr)
        return 1
    tally: Tally = defaultdict(lambda: [0, 0, 0, 0])
    _instrument(tally)
    rows = []
    for tier_type in args.tiers.split(","):
        for kib in map(int, args.chunk_kib.split(",")):
            root = tempfile.mkdtemp(prefix="asynctier-poolcalls-", dir=args.root)
            try:
                rows += anyio.run(run, tier_type, kib, args.chunks, root, tally)
            finally:
                shutil.rmtree(root, ignore_errors=True)
    print("loop thread per chunk (us): CPU and wall in each pool call; the longest call")
    print(f"{'tier':5} {'KiB':>4} {'phase':9} {'loop cpu':>8} | call             {'cpu':>6} {'wall':>6} {'max':>8}")
    for r in rows:
        for i, (name, c) in enumerate(r["calls"].items()):
            head = f"{r['tier']:5} {r['chunk_kib']:4} {r['phase']:9} {r['loop_cpu_us']:8.1f}" if i == 0 else " " * 29
            print(f"{head} | {name:16} {c['cpu_us']:6.2f} {c['wall_us']:6.2f} {c['max_us']:8.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"argv": sys.argv, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
