"""Offload speed into an empty tier and into a full one, where every store evicts.

A KV-cache tier lives at capacity: once warm, each chunk stored makes room by evicting the
least recently used one (the fs tier recycles the victim's file, or unlinks it; nvme reuses
the slot). The figure that matches a running server is therefore the steady state, not the
fill of an empty tier. Per point this makes a tier with room for ``--capacity-mib``, then

* **fill**: streams fresh keys until it is full (no eviction yet);
* **steady**: streams ``--steady-x`` times as many fresh keys again: each store evicts one.

and reports GB/s of each phase, their ratio, the evictions seen (``stats().evictions``),
the loop thread's CPU per chunk (``time.thread_time``) and, for fs, the files recycled.
Points (tier x engine x chunk size) run interleaved over ``--repeat`` repeats; medians are
reported. Only the public API is used, so an older checkout runs it too
(``PYTHONPATH=that/checkout``).

Run from the repository root::

    .venv/bin/python bench/bench_steady.py                       # fs (native, threads) and nvme, 64 KiB-2 MiB
    .venv/bin/python bench/bench_steady.py --tiers fs --engines native --chunk-kib 256 --root /mnt/nvme/x

Absolute GB/s swing with the disk and with other load on the machine; the steady/fill
ratio in one run is the figure to compare.
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import anyio
from rows_json import write_rows

from asynctier import OffloadingSpec, SecondaryTierFactory

BACKENDS: dict[str, tuple[str, dict[str, Any]]] = {
    "asyncio": ("asyncio", {}),
    "uvloop": ("asyncio", {"use_uvloop": True}),
    "trio": ("trio", {}),
}


def _view(nbytes: int) -> memoryview:
    buf = mmap.mmap(-1, nbytes)  # page-aligned, as pinned memory is (the O_DIRECT path)
    block = os.urandom(min(nbytes, 1 << 20))
    for off in range(0, nbytes, len(block)):
        buf[off : off + len(block)] = block[: nbytes - off]
    return memoryview(buf)


async def _stream(tier: Any, keys: list[bytes], slots: int, batch: int, streams: int) -> None:
    calls = [keys[i : i + batch] for i in range(0, len(keys), batch)]

    async def caller(n: int) -> None:
        for j in range(n, len(calls), streams):
            ks = calls[j]
            res = await tier.offload(ks, [(j * batch + i) % slots for i in range(len(ks))])
            if res.failed:
                raise RuntimeError(f"offload failed: {next(iter(res.failed.values()))!r}")

    async with anyio.create_task_group() as tg:
        for n in range(streams):
            tg.start_soon(caller, n)


async def measure(config: dict[str, Any], chunk: int, capacity_chunks: int, steady_x: float, batch: int,
                  streams: int) -> dict[str, Any]:  # fmt: skip
    slots = max(batch * streams, 64)
    spec = OffloadingSpec(chunk, slots, namespace="bench/steady")
    tier = SecondaryTierFactory.create_secondary_tier(config, _view(spec.total_bytes), spec)
    out: dict[str, Any] = {}
    async with tier:
        fill = [b"steady-fill-%d" % i for i in range(capacity_chunks)]
        steady = [b"steady-more-%d" % i for i in range(int(capacity_chunks * steady_x))]
        for phase, keys in (("fill", fill), ("steady", steady)):
            before = tier.stats()
            cpu0, t0 = time.thread_time(), time.perf_counter()
            await _stream(tier, keys, slots, batch, streams)
            cpu, wall = time.thread_time() - cpu0, time.perf_counter() - t0
            after = tier.stats()
            out[phase] = {
                "gbps": len(keys) * chunk / wall / 1e9,
                "loop_us_per_chunk": cpu / len(keys) * 1e6,
                "evictions": after.evictions - before.evictions,
                "recycled": after.extra.get("recycled", 0) - before.extra.get("recycled", 0),
            }
        out["stored_chunks"] = tier.stats().stored_chunks
        out["io_engine"] = getattr(tier, "active_io_engine", None)
    return out


def _config(tier: str, engine: str | None, root: str, depth: int, capacity: int) -> dict[str, Any]:
    config: dict[str, Any] = {"type": tier, "max_inflight": depth, "capacity_bytes": capacity}
    if tier == "fs":
        config["root"] = root
        if engine is not None:
            config["io_engine"] = engine
    elif tier == "nvme":
        config["path"] = os.path.join(root, "slab")
    return config


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiers", default="fs,nvme")
    ap.add_argument("--engines", default="native,threads", help="io_engine values on fs; '-' for the default")
    ap.add_argument("--chunk-kib", default="64,256,2048", help="chunk sizes in KiB, comma-separated")
    ap.add_argument("--capacity-mib", type=int, default=256, help="the tier's capacity (what the fill writes)")
    ap.add_argument("--steady-x", type=float, default=1.0, help="steady phase: this many capacities of new keys")
    ap.add_argument("--depth", type=int, default=16, help="max_inflight")
    ap.add_argument("--batch", type=int, default=32, help="chunks per call")
    ap.add_argument("--streams", type=int, default=4, help="concurrent callers")
    ap.add_argument("--repeat", type=int, default=3, help="runs per point, interleaved; medians reported")
    ap.add_argument("--backend", default="asyncio", choices=sorted(BACKENDS))
    ap.add_argument("--root", default=None, help="directory for the tiers' files (default: a temporary one)")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    engines = [None] if args.engines == "-" else args.engines.split(",")
    points = [
        (tier, engine, int(kib))
        for tier in args.tiers.split(",")
        for kib in args.chunk_kib.split(",")
        for engine in (engines if tier == "fs" else [None])
    ]
    runs: dict[tuple[str, str | None, int], list[dict[str, Any]]] = {p: [] for p in points}
    errors: dict[tuple[str, str | None, int], str] = {}
    name, options = BACKENDS[args.backend]
    if args.root is not None:
        os.makedirs(args.root, exist_ok=True)
    for rep in range(args.repeat):
        for point in points:
            if point in errors:
                continue
            tier, engine, kib = point
            chunk = kib << 10
            # the fs tier counts each chunk with its header block; nvme with its slot
            capacity_chunks = max(args.batch * args.streams, (args.capacity_mib << 20) // chunk)
            capacity = capacity_chunks * (chunk + 4096)
            root = tempfile.mkdtemp(prefix="asynctier-steady-", dir=args.root)
            try:
                r = anyio.run(measure, _config(tier, engine, root, args.depth, capacity), chunk, capacity_chunks,
                              args.steady_x, args.batch, args.streams, backend=name,
                              backend_options=options)  # fmt: skip
            except Exception as e:
                errors[point] = f"{type(e).__name__}: {e}"[:160]
                print(f"{tier} {engine or '-'} {kib} KiB: did not run: {errors[point]}", flush=True)
                continue
            finally:
                shutil.rmtree(root, ignore_errors=True)
            runs[point].append(r)
            f, s = r["fill"], r["steady"]
            print(f"[{rep + 1}/{args.repeat}] {tier:5} {engine or '-':8} {kib:5} KiB  fill {f['gbps']:5.2f} GB/s  "
                  f"steady {s['gbps']:5.2f} GB/s ({s['evictions']} evictions, {s['recycled']} recycled)",
                  flush=True)  # fmt: skip
    rows = []
    print()
    print("offload into an empty tier (fill) and into a full one (steady: each store evicts); medians")
    print(f"{'tier':5} {'engine':8} {'KiB':>5} | {'fill GB/s':>9} {'steady GB/s':>11} {'steady/fill':>11} | "
          f"{'loop us fill':>12} {'steady':>6} | {'evicted':>7} {'recycled':>8}")  # fmt: skip
    for point in points:
        tier, engine, kib = point
        done = runs[point]
        row: dict[str, Any] = {"tier": tier, "engine": engine, "chunk_kib": kib, "error": errors.get(point)}
        if done:
            for phase in ("fill", "steady"):
                row[phase] = {k: statistics.median(r[phase][k] for r in done) for k in done[0][phase]}
            row["steady_x_fill"] = statistics.median(r["steady"]["gbps"] / r["fill"]["gbps"] for r in done)
            row["io_engine"] = done[0]["io_engine"]
            f, s, ratio = row["fill"], row["steady"], row["steady_x_fill"]
            print(f"{tier:5} {engine or '-':8} {kib:5} | {f['gbps']:9.2f} {s['gbps']:11.2f} {ratio:11.2f} | "
                  f"{f['loop_us_per_chunk']:12.1f} {s['loop_us_per_chunk']:6.1f} | {s['evictions']:7.0f} "
                  f"{s['recycled']:8.0f}")  # fmt: skip
        else:
            print(f"{tier:5} {engine or '-':8} {kib:5} | did not run: {errors.get(point)}")
        rows.append(row)
    write_rows(args.json, args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
