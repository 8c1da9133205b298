"""The runtime's own cost per chunk: a tier whose primitives do nothing.

Measures, on the stock asyncio loop and on uvloop:

* chunk operations/s through ``offload`` calls of 1024 chunks (the engine's per-chunk cost:
  a job, a heap push/pop, a worker-thread pass; one loop wake-up per call);
* the round trip of one single-chunk call awaited back to back (thread hand-off + loop wake);
* single-chunk calls/s with 5000 callers at once.

Run from the repository root: ``.venv/bin/python bench/bench_engine.py``; writes
``bench/results/engine.{json,md}`` (``--out`` for another directory; ``--scale`` below 1 for a
quick run with fewer calls).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asynctier import BlockingChunkTier, OffloadingSpec
from asynctier.cli import benchkit
from asynctier.testing import loop_factories

REPO = Path(__file__).resolve().parent.parent


class NullTier(BlockingChunkTier):
    """Stores nothing, so only the runtime is measured."""

    def write_chunk(self, key: bytes, data: memoryview) -> None:
        pass

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        pass

    def chunk_exists(self, key: bytes) -> bool:
        return True

    def delete_chunk(self, key: bytes) -> bool:
        return True


SPEC = OffloadingSpec(65536, 1024)


async def measure(scale: float = 1.0) -> dict[str, float]:
    """The three figures; ``scale`` multiplies the number of calls of each."""
    batches, singles, callers = (max(1, round(n * scale)) for n in (50, 3000, 5000))
    view = memoryview(bytearray(SPEC.total_bytes))
    async with NullTier(offloading_spec=SPEC, primary_kv_view=view, max_inflight=16) as t:
        ids = list(range(1024))
        n, t0 = 0, time.perf_counter()
        for r in range(batches):
            await t.offload([b"%d-%d" % (r, i) for i in range(1024)], ids)
            n += 1024
        batch_ops = n / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for i in range(singles):
            await t.offload([b"s%d" % i], [i % 1024])
        round_trip_us = (time.perf_counter() - t0) / singles * 1e6
        t0 = time.perf_counter()
        await asyncio.gather(*(t.offload([b"p%d" % i], [i % 1024]) for i in range(callers)))
        concurrent_ops = callers / (time.perf_counter() - t0)
    return {
        "batch_chunk_ops_per_s": batch_ops,
        "single_call_round_trip_us": round_trip_us,
        "concurrent_single_calls_per_s": concurrent_ops,
    }


def run_on(factory: Callable[[], asyncio.AbstractEventLoop], scale: float) -> dict[str, float]:
    loop = factory()
    try:
        return loop.run_until_complete(measure(scale))
    finally:
        loop.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(REPO / "bench" / "results"), help="directory for engine.json and engine.md")
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the default number of calls")
    args = ap.parse_args()
    if args.scale <= 0:
        ap.error(f"--scale must be positive, got {args.scale}")
    started = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
    rows: list[dict[str, Any]] = []
    for name, factory in loop_factories().items():
        r = run_on(factory, args.scale)
        rows.append({"loop": name, **r})
        print(
            f"{name:8} {r['batch_chunk_ops_per_s']:>10,.0f} chunk ops/s (1024-chunk calls)  "
            f"{r['single_call_round_trip_us']:6.0f} us/single call  "
            f"{r['concurrent_single_calls_per_s']:>8,.0f} single calls/s (5000 callers)"
        )
    md = [
        "# Runtime overhead per chunk (a tier that does no I/O)",
        "",
        f"Run {started}; `.venv/bin/python bench/bench_engine.py`"
        + (f" --scale {args.scale}" if args.scale != 1 else "")
        + "; max_inflight=16.",
        "",
        "| loop | chunk ops/s, 1024-chunk calls | one single-chunk call, round trip (us) "
        "| single-chunk calls/s, 5000 callers |",
        "| --- | --- | --- | --- |",
        *(
            f"| {r['loop']} | {r['batch_chunk_ops_per_s']:,.0f} | {r['single_call_round_trip_us']:.0f} "
            f"| {r['concurrent_single_calls_per_s']:,.0f} |"
            for r in rows
        ),
    ]
    data = {"started": started, "rows": rows, "machine": benchkit.machine_info()}
    for p in benchkit.write_results(args.out, "engine", data, "\n".join(md) + "\n"):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
