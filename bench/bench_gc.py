"""How long Python's cycle collector takes, by generation, while a tier's index of N entries is held.

The collector runs on whichever thread allocates past its threshold, holding the GIL, so the
event loop waits for the whole pass. It reads every container it tracks in the generations it
collects: a list or an OrderedDict with an item per chunk is read whole by the first young
collections after it is made, and by every full collection for as long as it lives. This builds
each index as the tier does, then times ``gc.collect(0)`` once (the first young collection
after the tier opened), ``gc.collect(1)``, and full collections (their median), and counts the
tracked containers of more than 10,000 items. ``none`` is the process with no index: the floor.

- ``nvme``: a fresh nvme tier of N slots (4 KiB chunks, a sparse slab under ``--dir``): its
  per-slot key list and free list.
- ``lru``: the fs and memory tiers' LRU index with N committed entries.

Run from the repository root: ``.venv/bin/python bench/bench_gc.py`` (``--help``). It uses the
installed asynctier, so an older one in a venv of its own runs the same script.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
from bench_loop_cpu import _aligned_view

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.lru import LRUIndex

CHUNK = 4096


@asynccontextmanager
async def _none(n: int, where: str | None) -> AsyncIterator[object]:
    yield None


@asynccontextmanager
async def _nvme(n: int, where: str | None) -> AsyncIterator[object]:
    root = tempfile.mkdtemp(prefix="asynctier-gc-", dir=where)
    spec = OffloadingSpec(CHUNK, 8, namespace="gc")
    # a slot is the chunk and its header block; the slab is left sparse (nothing is written)
    cfg = {"type": "nvme", "path": os.path.join(root, "slab"), "capacity_bytes": 2 * CHUNK * n, "preallocate": False}
    try:
        async with SecondaryTierFactory.create_secondary_tier(cfg, _aligned_view(spec.total_bytes), spec) as tier:
            yield tier
    finally:
        shutil.rmtree(root, ignore_errors=True)


@asynccontextmanager
async def _lru(n: int, where: str | None) -> AsyncIterator[object]:
    idx = LRUIndex(None)
    for i in range(n):
        key = b"model/req-%08d/block-%04d" % (i, i % 1000)
        idx.reserve(key, CHUNK)
        idx.commit(key)
    yield idx


CASES: dict[str, Callable[[int, str | None], AbstractAsyncContextManager[object]]] = {
    "none": _none,
    "nvme": _nvme,
    "lru": _lru,
}


def _timed(generation: int) -> float:
    t0 = time.perf_counter()
    gc.collect(generation)
    return (time.perf_counter() - t0) * 1e3


async def measure(case: str, n: int, where: str | None, repeat: int) -> dict[str, Any]:
    gc.collect()
    gc.disable()  # (only the passes timed here run, not ones the setup's allocations would start)
    try:
        async with CASES[case](n, where) as held:
            first0, then1 = _timed(0), _timed(1)
            full = [_timed(2) for _ in range(repeat)]
            big = sum(1 for o in gc.get_objects() if len(gc.get_referents(o)) > 10_000)
            del held
    finally:
        gc.enable()
    return {"case": case, "entries": 0 if case == "none" else n, "first_gen0_ms": first0, "gen1_ms": then1,
            "full_ms": statistics.median(full), "full_ms_max": max(full), "tracked_over_10k": big}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default="none,nvme,lru", help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--entries", type=int, default=1 << 20, help="the index's size (slots, entries)")
    ap.add_argument("--repeat", type=int, default=5, help="full collections timed")
    ap.add_argument("--dir", default=None, help="where the nvme slab goes (sparse; default: a temporary directory)")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    cases = args.cases.split(",")
    if unknown := sorted(set(cases) - set(CASES)):
        ap.error(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    rows = [anyio.run(measure, c, args.entries, args.dir, args.repeat) for c in cases]
    print(f"{'case':5} {'entries':>9} {'first gen0':>10} {'gen1':>8} {'full (median, max)':>20} {'tracked >10k':>12}")
    for r in rows:
        print(f"{r['case']:5} {r['entries']:9} {r['first_gen0_ms']:8.1f}ms {r['gen1_ms']:6.1f}ms "
              f"{r['full_ms']:9.1f}ms {r['full_ms_max']:6.1f}ms {r['tracked_over_10k']:12}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"argv": sys.argv, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
