"""What a cancelled call still moves, and how long its cancellation takes (docs/cancellation.md).

Per tier (fs, nvme; ``--engine``: the native engine where it serves, or threads for
reference), operation, chunk size and depth: one call of ``--chunks`` chunks, cancelled as
soon as its first chunks are counted. Reports the chunks counted after the cancellation
(those running or ended then, and any started after it), the time from ``task.cancel()`` to
the call coming back, and the chunks the tier reports withdrawn
(``stats().extra["withdrawn"]``); medians over ``--repeat`` calls, each into a fresh tier.
Loads read from a cold page cache.

Run from the repository root: ``.venv/bin/python bench/bench_cancel.py --dir /var/tmp/bench-cancel``
(the directory is emptied first; ``--json`` writes the rows).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.cli import benchkit
from asynctier.posix_io import aligned_buffer

NVME_HEADER = 4096  # an nvme slot's header block, beside its payload


def _tier(kind: str, root: Path, chunk: int, n: int, depth: int, view: memoryview, engine: str) -> Any:
    config: dict[str, Any] = {"type": kind, "max_inflight": depth, "io_engine": engine}
    if kind == "fs":
        config["root"] = str(root)
    else:
        config.update(path=str(root / "slab"), capacity_bytes=(2 * n + 64) * (chunk + NVME_HEADER))
    return SecondaryTierFactory.create_secondary_tier(config, view, OffloadingSpec(chunk, 2 * n, namespace="bench/c"))


def _fresh(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)


async def one(kind: str, op: str, root: Path, chunk: int, n: int, depth: int, engine: str) -> dict[str, float]:
    _fresh(root)
    view = aligned_buffer(2 * n * chunk)
    view[:] = os.urandom(len(view))
    tier = _tier(kind, root, chunk, n, depth, view, engine)
    keys = [b"k%d" % i for i in range(n)]
    counter = "loaded" if op == "load" else "offloaded"
    async with tier:
        if op == "load":
            assert (await tier.offload(keys, list(range(n)))).ok
            benchkit.drop_page_cache(benchkit.files_under(root))
            call = tier.load(keys, list(range(n, 2 * n)))
        else:
            call = tier.offload(keys, list(range(n)))
        task = asyncio.ensure_future(call)
        while not getattr(tier.stats(), counter):  # noqa: ASYNC110 (a counter: no event to wait on)
            await asyncio.sleep(0.0002)
        at = getattr(tier.stats(), counter)
        t0 = time.perf_counter()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        took = time.perf_counter() - t0
        s = tier.stats()
        return {"after": getattr(s, counter) - at, "ms": took * 1e3, "withdrawn": s.extra.get("withdrawn", 0)}


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for kind in args.tiers:
        for op in ("store", "load"):
            for kib in args.sizes_kib:
                got = [await one(kind, op, args.dir, kib * 1024, args.chunks, args.depth, args.engine)
                       for _ in range(args.repeat)]  # fmt: skip
                row = {"tier": kind, "op": op, "chunk_kib": kib, "depth": args.depth, "chunks": args.chunks,
                       "engine": args.engine}  # fmt: skip
                for k in ("after", "ms", "withdrawn"):
                    row[k] = statistics.median(g[k] for g in got)
                    row[k + "_all"] = [round(g[k], 1) for g in got]
                rows.append(row)
                print(f"| {kind} | {op} | {kib} KiB | {row['after']:.0f} ({row['after_all']}) | "
                      f"{row['ms']:.1f} ({row['ms_all']}) | {row['withdrawn']:.0f} |", flush=True)  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, required=True, help="scratch directory (emptied)")
    p.add_argument("--tiers", nargs="+", default=["fs", "nvme"], choices=["fs", "nvme"])
    p.add_argument("--sizes-kib", nargs="+", type=int, default=[64, 256])
    p.add_argument("--chunks", type=int, default=1024, help="chunks in the call")
    p.add_argument("--depth", type=int, default=16, help="max_inflight")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--engine", default="auto", choices=["auto", "native", "threads"], help="the tiers' io_engine")
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    print("| tier | call | chunk | chunks counted after cancel: median (each) | cancel ms: median (each) | withdrawn |")
    print("| --- | --- | --- | --- | --- | --- |")
    rows = asyncio.run(run(args))
    shutil.rmtree(args.dir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
