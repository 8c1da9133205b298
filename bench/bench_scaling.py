"""Cost per chunk of lookup and index as the number of stored chunks grows from 10^3 to 10^6.

Costs must grow linearly with keys (a flat cost per chunk): lookups are O(1) in memory,
index updates O(1), a reopen (index rebuild) linear in the chunks stored.

* ``LRUIndex`` (the runtime's index, used by the memory and fs tiers): insert
  (reserve + commit), lookup hit and miss, touch, eviction under a capacity, bytes per entry.
* Tiers, filled with ``n`` small chunks through ``offload`` (calls of 4096 chunks): offload
  cost per chunk, ``lookup`` per key (hits and misses, batched calls), and for the media that
  persist (fs, nvme) reopening: the index rebuild, per chunk stored.

Run from the repository root::

    .venv/bin/python bench/bench_scaling.py                     # index to 10^6, memory to 10^6, fs and nvme to 10^5
    .venv/bin/python bench/bench_scaling.py --max-fs 6 --max-nvme 6   # slow: a million files / slots

Writes ``bench/results/scaling.json`` and ``bench/results/scaling.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import shutil
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.cli import benchkit
from asynctier.cli.sizes import format_size, parse_size
from asynctier.lru import LRUIndex
from asynctier.posix_io import aligned_buffer

REPO = Path(__file__).resolve().parent.parent

CALL = 4096  # chunks per offload / lookup call
SAMPLE = 100_000  # keys looked up per measurement (all of them when fewer are stored)


def keys_for(n: int, tag: bytes = b"k") -> list[bytes]:
    """``n`` distinct 16-byte keys (cheap to make, like truncated prefix hashes)."""
    return [tag + i.to_bytes(15, "big") for i in range(n)]


def per_op_ns(fn: Callable[[], object], ops: int) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) / max(ops, 1) * 1e9


def index_costs(n: int) -> dict[str, Any]:
    keys = keys_for(n)
    miss = keys_for(min(n, SAMPLE), b"m")
    idx = LRUIndex(capacity_bytes=None)

    def insert() -> None:
        for k in keys:
            idx.reserve(k, 4096)
            idx.commit(k)

    out: dict[str, Any] = {"n": n, "insert_ns": per_op_ns(insert, n)}
    # memory in a second index: tracemalloc slows every allocation, so never while timing
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    other = LRUIndex(capacity_bytes=None)
    for k in keys:
        other.reserve(k, 4096)
        other.commit(k)
    out["bytes_per_entry"] = (tracemalloc.get_traced_memory()[0] - before) / n  # keys themselves not counted
    tracemalloc.stop()
    del other
    sample = keys[:: max(1, n // SAMPLE)]
    out["lookup_hit_ns"] = per_op_ns(lambda: [k in idx for k in sample], len(sample))
    out["lookup_miss_ns"] = per_op_ns(lambda: [k in idx for k in miss], len(miss))
    out["touch_ns"] = per_op_ns(lambda: idx.touch(sample), len(sample))
    # at capacity: every insert evicts the least recently used entry
    idx.capacity_bytes = n * 4096
    extra = keys_for(min(n, SAMPLE), b"e")

    def insert_evict() -> None:
        for k in extra:
            idx.reserve(k, 4096)
            idx.commit(k)

    out["insert_with_eviction_ns"] = per_op_ns(insert_evict, len(extra))
    assert len(idx) == n
    return out


async def tier_costs(tier_type: str, n: int, chunk: int, workdir: Path) -> dict[str, Any]:
    slots = CALL
    spec = OffloadingSpec(chunk, slots, namespace="bench/scaling")
    view = aligned_buffer(spec.total_bytes)
    d = workdir / f"{tier_type}-{n}"
    d.mkdir(parents=True)
    cfg: dict[str, Any] = {"type": tier_type, "max_inflight": 16}
    if tier_type == "fs":
        cfg.update(root=str(d), background_scan=False)  # reopen: time the whole rebuild
    elif tier_type == "nvme":
        cfg.update(path=str(d / "slab"), capacity_bytes=(n + CALL) * (chunk + 8192))
    elif tier_type == "obj":
        cfg.update(url=f"file://{d}")
    keys = keys_for(n)
    sample = keys[:: max(1, n // SAMPLE)]
    miss = keys_for(len(sample), b"m")
    out: dict[str, Any] = {"tier": tier_type, "n": n, "chunk_bytes": chunk}
    tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
    async with tier:
        t = time.perf_counter()
        failed = 0
        for off in range(0, n, CALL):
            part = keys[off : off + CALL]
            res = await tier.offload(part, list(range(len(part))))
            failed += len(res.failed)
        out["offload_us"] = (time.perf_counter() - t) / n * 1e6
        out["failed"] = failed

        async def lookup_all(ks: list[bytes]) -> list[bool]:
            hits: list[bool] = []
            for off in range(0, len(ks), CALL):
                hits += await tier.lookup(ks[off : off + CALL])
            return hits

        t = time.perf_counter()
        hits = await lookup_all(sample)
        out["lookup_hit_ns"] = (time.perf_counter() - t) / len(sample) * 1e9
        t = time.perf_counter()
        misses = await lookup_all(miss)
        out["lookup_miss_ns"] = (time.perf_counter() - t) / len(miss) * 1e9
        out["lookup_correct"] = all(hits) and not any(misses)
    if tier_type in ("fs", "nvme"):
        again = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
        t = time.perf_counter()
        await again.open()
        out["reopen_s"] = time.perf_counter() - t
        out["reopen_us_per_chunk"] = out["reopen_s"] / n * 1e6
        out["reopen_lookup_correct"] = all(await again.lookup(sample))
        await again.aclose()
    shutil.rmtree(d, ignore_errors=True)
    return out


def fmt(v: float | None, digits: int = 0) -> str:
    return "-" if v is None else f"{v:,.{digits}f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-index", type=int, default=6, help="largest power of ten for LRUIndex")
    ap.add_argument("--max-memory", type=int, default=6, help="largest power of ten for the memory tier")
    ap.add_argument("--max-fs", type=int, default=5, help="largest power of ten for the fs tier (files)")
    ap.add_argument("--max-nvme", type=int, default=5, help="largest power of ten for the nvme tier (slots)")
    ap.add_argument("--max-obj", type=int, default=0, help="largest power of ten for the obj tier on file:// (0: skip)")
    ap.add_argument("--chunk", type=parse_size, default=parse_size("4K"), help="chunk size for the tiers")
    ap.add_argument("--root", default=None, help="directory for the tiers' files (default: a temporary one)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args()
    started = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
    index_rows: list[dict[str, Any]] = []
    for e in range(3, args.max_index + 1):
        r = index_costs(10**e)
        index_rows.append(r)
        print(
            f"LRUIndex n=10^{e}: insert {r['insert_ns']:.0f} ns, hit {r['lookup_hit_ns']:.0f} ns, "
            f"miss {r['lookup_miss_ns']:.0f} ns, touch {r['touch_ns']:.0f} ns, "
            f"insert+evict {r['insert_with_eviction_ns']:.0f} ns, {r['bytes_per_entry']:.0f} B/entry",
            flush=True,
        )
    tier_rows: list[dict[str, Any]] = []
    if args.root:  # a scratch directory that does not exist yet is made, not an error
        Path(args.root).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="asynctier-scaling-", dir=args.root))
    try:
        for tier_type, top in (
            ("memory", args.max_memory),
            ("fs", args.max_fs),
            ("nvme", args.max_nvme),
            ("obj", args.max_obj),
        ):
            for e in range(3, top + 1):
                r = _run(tier_costs(tier_type, 10**e, args.chunk, workdir))
                tier_rows.append(r)
                print(
                    f"{tier_type} n=10^{e}: offload {r['offload_us']:.1f} us/chunk, lookup hit "
                    f"{r['lookup_hit_ns']:.0f} ns, miss {r['lookup_miss_ns']:.0f} ns"
                    + (
                        f", reopen {r['reopen_s']:.2f} s ({r['reopen_us_per_chunk']:.1f} us/chunk)"
                        if "reopen_s" in r
                        else ""
                    ),
                    flush=True,
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    cmd = " ".join([".venv/bin/python", "bench/bench_scaling.py", *sys.argv[1:]])
    ok = all(r["lookup_correct"] and r["failed"] == 0 and r.get("reopen_lookup_correct", True) for r in tier_rows)
    data: dict[str, Any] = {
        "started": started,
        "command": cmd,
        "machine": benchkit.machine_info(),
        "index": index_rows,
        "tiers": tier_rows,
        "all_lookups_correct": ok,
    }
    m = data["machine"]
    md = "\n".join(
        [
            "# Cost per chunk as chunks grow",
            "",
            f"Run {started} on {m['cpus']} CPUs, {m['platform']}, Python {m['python']}:",
            "",
            f"    {cmd}",
            "",
            "## LRUIndex (nanoseconds per key)",
            "",
            benchkit.md_table(
                ["chunks", "insert", "lookup hit", "lookup miss", "touch", "insert + evict", "bytes/entry"],
                [
                    [
                        f"{r['n']:,}",
                        fmt(r["insert_ns"]),
                        fmt(r["lookup_hit_ns"]),
                        fmt(r["lookup_miss_ns"]),
                        fmt(r["touch_ns"]),
                        fmt(r["insert_with_eviction_ns"]),
                        fmt(r["bytes_per_entry"]),
                    ]
                    for r in index_rows
                ],
            ),
            "",
            f"## Tiers ({format_size(args.chunk)} chunks, calls of {CALL} chunks, max_inflight 16)",
            "",
            benchkit.md_table(
                [
                    "tier",
                    "chunks",
                    "offload us/chunk",
                    "lookup hit ns/key",
                    "lookup miss ns/key",
                    "reopen s",
                    "reopen us/chunk",
                ],
                [
                    [
                        r["tier"],
                        f"{r['n']:,}",
                        fmt(r["offload_us"], 1),
                        fmt(r["lookup_hit_ns"]),
                        fmt(r["lookup_miss_ns"]),
                        fmt(r.get("reopen_s"), 2),
                        fmt(r.get("reopen_us_per_chunk"), 1),
                    ]
                    for r in tier_rows
                ],
            ),
            "",
            "Lookups are batched calls (a key costs the call's share); offload includes the I/O. "
            f"Every lookup answer was {'correct' if ok else 'NOT correct'} (hits for stored keys, misses "
            "for absent ones, also after reopening).",
        ]
    )
    for p in benchkit.write_results(args.out, "scaling", data, md):
        print(f"wrote {p}")
    return 0 if ok else 1


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


if __name__ == "__main__":
    sys.exit(main())
