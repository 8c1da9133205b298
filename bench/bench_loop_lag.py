"""Event-loop lag while a tier streams at full speed: async servers must stay responsive.

A ticker coroutine asks to wake every millisecond and records how late it wakes; meanwhile
``--streams`` producer coroutines keep the tier saturated with ``--batch``-chunk offload
calls of fresh keys (``max_inflight`` = each of ``--depths``), then with load calls of stored keys, for
``--seconds`` each. The primary buffer is small and reused (fresh keys every call), and the
tier has a ``capacity_bytes`` so old chunks are evicted as the stream goes on: the disk
stays bounded however long the stream runs.

Target (issue 28; issue 6 asked for 5 ms): p99 lag at most 2 ms while an fs offload runs at full
speed. A lag tail moves by a few tenths of a millisecond from run to run on a small machine:
``--repeat`` runs every point that many times, interleaved (each repeat goes over every point
once), and the report then gives each point's p99 of every run, their median and how many
runs missed the target; the target is held to the median.

Run from the repository root::

    .venv/bin/python bench/bench_loop_lag.py                # fs, 256 KiB and 2 MiB, uvloop and asyncio
    .venv/bin/python bench/bench_loop_lag.py --tier nvme --tier obj

Writes ``bench/results/loop_lag.json`` and ``bench/results/loop_lag.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.cli import benchkit
from asynctier.cli.sizes import format_size, parse_size
from asynctier.cli.tierfile import DEFAULT_TIERS
from asynctier.posix_io import aligned_buffer
from asynctier.testing import loop_factories

REPO = Path(__file__).resolve().parent.parent

TICK_S = 0.001
TARGET_P99_S = 0.002


class Ticker:
    """Wakes every ``TICK_S`` and records how late each wake-up was (the loop's lag)."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._stop = False

    async def run(self) -> None:
        while not self._stop:
            t = time.perf_counter()
            await asyncio.sleep(TICK_S)
            self.lags.append(max(0.0, time.perf_counter() - t - TICK_S))

    def stop(self) -> None:
        self._stop = True

    def summary(self) -> dict[str, float]:
        s = sorted(self.lags)
        return {
            "samples": len(s),
            "p50_s": benchkit.percentile(s, 0.50),
            "p99_s": benchkit.percentile(s, 0.99),
            "p999_s": benchkit.percentile(s, 0.999),
            "max_s": s[-1] if s else 0.0,
        }


async def measure(
    tier_name: str,
    chunk: int,
    depth: int,
    args: argparse.Namespace,
    workdir: Path,
    loop_name: str,
    io_engine: str | None = None,
    worker_nice: int | None = None,
) -> list[dict[str, Any]]:
    slots = max(args.batch * args.streams, 2 * depth)
    spec = OffloadingSpec(chunk, slots, namespace=f"bench/loop-lag/{loop_name}")
    view = aligned_buffer(spec.total_bytes)  # page-aligned, as a pinned host buffer is
    view[:] = os.urandom(spec.total_bytes)
    d = workdir / f"{tier_name}-{chunk}-{depth}-{loop_name}-{io_engine}"
    d.mkdir(parents=True)
    cfg: dict[str, Any] = {
        k: (str(v).replace("{dir}", str(d)) if isinstance(v, str) else v)
        for k, v in DEFAULT_TIERS.get(tier_name, {"type": tier_name}).items()
    }
    cap = args.capacity
    if cfg.get("capacity_bytes") == "{capacity}" or "capacity_bytes" not in cfg:
        cfg["capacity_bytes"] = cap
    cfg["max_inflight"] = depth
    if io_engine is not None:
        cfg["io_engine"] = io_engine
    if worker_nice is not None and tier_name in ("fs", "nvme"):
        cfg["worker_nice"] = worker_nice
    out: list[dict[str, Any]] = []
    tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
    async with tier:
        # idle: the loop with nothing to do but the ticker
        ticker = Ticker()
        seen = benchkit.Interference()
        task = asyncio.ensure_future(ticker.run())
        await asyncio.sleep(min(1.0, args.seconds))
        ticker.stop()
        await task
        out.append({"op": "idle", "bytes_per_s": 0.0, "lag": ticker.summary(), **seen.stop()})

        stored: list[bytes] = []
        counter = 0
        moved = 0
        failures = 0

        async def producer(op: str, p: int, deadline: float, keep: list[bytes]) -> None:
            nonlocal counter, moved, failures
            ids = list(range(p * args.batch, (p + 1) * args.batch))
            while time.perf_counter() < deadline:
                if op == "offload":
                    keys = [f"lag/{loop_name}/{chunk}/{counter + i}".encode() for i in range(args.batch)]
                    counter += args.batch
                    res = await tier.offload(keys, ids)
                    stored.extend(res.succeeded)
                else:
                    base = counter % max(1, len(keep) - args.batch)
                    counter += args.batch
                    keys = keep[base : base + args.batch]
                    res = await tier.load(keys, ids[: len(keys)])
                moved += res.bytes_transferred
                failures += len(res.failed)

        for op in ("offload", "load"):
            counter = moved = failures = 0
            keep: list[bytes] = []
            if op == "load":
                # keys still stored (older ones were evicted to stay within capacity)
                hits = await tier.lookup(stored)
                keep = [k for k, h in zip(stored, hits) if h]
                if len(keep) < args.batch:
                    continue
            ticker = Ticker()
            seen = benchkit.Interference()
            task = asyncio.ensure_future(ticker.run())
            t0 = time.perf_counter()
            deadline = t0 + args.seconds
            await asyncio.gather(*(producer(op, p, deadline, keep) for p in range(args.streams)))
            elapsed = time.perf_counter() - t0
            ticker.stop()
            await task
            out.append(
                {
                    "op": op,
                    "bytes_per_s": moved / elapsed,
                    "bytes": moved,
                    "failed_chunks": failures,
                    "lag": ticker.summary(),
                    **seen.stop(),
                }
            )
        stats = tier.stats()
        for r in out:
            r["evictions"] = stats.evictions
    shutil.rmtree(d, ignore_errors=True)
    engine = getattr(tier, "active_io_engine", None)
    for r in out:
        r.update(tier=tier_name, chunk_bytes=chunk, loop=loop_name, depth=depth, io_engine=engine, asked=io_engine,
                 worker_nice=getattr(tier, "worker_nice", None))  # fmt: skip
    return out


_POINT = ("loop", "tier", "asked", "io_engine", "worker_nice", "chunk_bytes", "depth", "op")


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each point's runs: its p99 in each, their median, and how many missed the target."""
    points: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        p = points.setdefault(tuple(r.get(k) for k in _POINT), {k: r.get(k) for k in _POINT} | {"p99_s": []})
        p["p99_s"].append(r["lag"]["p99_s"])
    for p in points.values():
        p["median_p99_s"] = statistics.median(p["p99_s"])
        p["runs_over_target"] = sum(v > TARGET_P99_S for v in p["p99_s"])
    return list(points.values())


def _repeat_table(points: list[dict[str, Any]]) -> list[str]:
    rows = [
        [p["loop"], p["tier"] + (f" ({p['io_engine']})" if p["io_engine"] else ""), format_size(p["chunk_bytes"]),
         str(p["depth"]), p["op"], ", ".join(f"{v * 1e3:.2f}" for v in p["p99_s"]), f"{p['median_p99_s'] * 1e3:.2f}",
         f"{p['runs_over_target']} of {len(p['p99_s'])}"]
        for p in points
    ]  # fmt: skip
    over = f"runs over {TARGET_P99_S * 1e3:g} ms"
    head = ["loop", "tier", "chunk", "depth", "phase", "p99 ms, each run", "median", over]
    return ["Each point over the runs:", "", benchkit.md_table(head, rows), ""]


def run_on(factory: Callable[[], asyncio.AbstractEventLoop], coro: Any) -> Any:
    loop = factory()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tier", action="append", help="a tier type to stream through; repeat for several (default: fs)")
    ap.add_argument("--chunk-sizes", default="256K,2M")
    ap.add_argument("--depths", default="4,16", help="max_inflight values, comma-separated")
    ap.add_argument("--batch", type=int, default=32, help="chunks per call")
    ap.add_argument("--streams", type=int, default=4, help="concurrent producer coroutines")
    ap.add_argument("--seconds", type=float, default=4.0, help="per stream phase")
    ap.add_argument("--capacity", type=parse_size, default=parse_size("1G"), help="tier capacity_bytes")
    ap.add_argument("--loops", default=",".join(loop_factories()), help="event loops: uvloop,asyncio")
    ap.add_argument("--root", default=None, help="directory for the tier's files (default: a temporary one)")
    ap.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="sys.setswitchinterval (s) for this run (default: Python's, 0.005)",
    )
    ap.add_argument(
        "--worker-nice",
        default="-",
        help="worker_nice values of the fs and nvme tiers' native workers, comma-separated, each run as "
        "its own point ('-': the tier's default)",
    )
    ap.add_argument(
        "--fs-engines",
        default="auto,threads",
        help="io_engine values to run the fs tier with; the first (default: the tier's own default, "
        "'auto') is the one held to the target",
    )
    ap.add_argument(
        "--nvme-engines",
        default="threads",
        help="io_engine values to run the nvme tier with",
    )
    ap.add_argument("--repeat", type=int, default=1, help="runs of every point, interleaved")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--name", default="loop_lag", help="base name of the result files")
    args = ap.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    tiers = args.tier or ["fs"]
    sizes = [parse_size(s) for s in args.chunk_sizes.split(",")]
    depths = [int(d) for d in args.depths.split(",")]
    factories = loop_factories()
    loops = [n for n in args.loops.split(",") if n in factories]
    if args.root:  # a scratch directory that does not exist yet is made, not an error
        Path(args.root).mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="asynctier-lag-", dir=args.root))
    results: list[dict[str, Any]] = []
    started = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
    if args.repeat < 1:
        ap.error(f"--repeat must be 1 or more; got {args.repeat}")
    try:
        for run, loop_name in ((r, n) for r in range(args.repeat) for n in loops):
            for tier_name in tiers:
                engines: list[str | None] = [None]
                if tier_name in ("fs", "nvme"):
                    chosen = args.fs_engines if tier_name == "fs" else args.nvme_engines
                    engines = list(dict.fromkeys(e.strip() for e in chosen.split(",") if e.strip()))
                nices: list[int | None] = [None if n.strip() == "-" else int(n) for n in args.worker_nice.split(",")]
                sweep = ((c, d, e, n) for c in sizes for d in depths for e in engines for n in nices)
                for chunk, depth, engine, nice in sweep:
                    coro = measure(tier_name, chunk, depth, args, workdir, loop_name, engine, nice)
                    rows = run_on(factories[loop_name], coro)
                    for r in rows:
                        r["run"] = run
                    results += rows
                    for r in rows:
                        lag = r["lag"]
                        print(
                            f"{loop_name:8} {tier_name:5} {r['io_engine'] or '':9} nice {r['worker_nice']!s:4} "
                            f"{format_size(chunk):>8} "
                            f"depth {depth:2} {r['op']:8} "
                            f"{r['bytes_per_s'] / 1e9:6.2f} GB/s  lag p50 {lag['p50_s'] * 1e3:6.2f} ms  "
                            f"p99 {lag['p99_s'] * 1e3:6.2f} ms  max {lag['max_s'] * 1e3:7.2f} ms",
                            flush=True,
                        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    points = summarize([r for r in results if r["op"] != "idle"])
    # held to the target: the fs tier as configured by default (the first of --fs-engines)
    default_engine = args.fs_engines.split(",")[0].strip()
    fs_default = [p for p in points if p["tier"] == "fs" and p["op"] == "offload" and p["asked"] == default_engine]
    worst_point = max(fs_default, key=lambda p: p["median_p99_s"], default=None)
    worst = worst_point["median_p99_s"] if worst_point else None
    worst_engine = f"{default_engine} -> {worst_point['io_engine']}" if worst_point else None
    data: dict[str, Any] = {
        "started": started,
        "command": " ".join([".venv/bin/python", "bench/bench_loop_lag.py", *sys.argv[1:]]),
        "machine": benchkit.machine_info(),
        "switch_interval_s": sys.getswitchinterval(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "root")},
        "target_p99_s": TARGET_P99_S,
        "worst_fs_offload_p99_s": worst,
        "worst_fs_offload_engine": worst_engine,
        "meets_target": worst is not None and worst <= TARGET_P99_S,
        "points": points,
        "results": results,
    }
    rows = [
        [
            r["loop"] + (f" #{r['run'] + 1}" if args.repeat > 1 else ""),
            r["tier"]
            + (f" ({r['asked']}: {r['io_engine']})" if r.get("io_engine") else "")
            + (f" nice {r['worker_nice']}" if r.get("worker_nice") is not None else ""),
            format_size(r["chunk_bytes"]),
            str(r["depth"]),
            r["op"],
            f"{r['bytes_per_s'] / 1e9:.2f}" if r["op"] != "idle" else "-",
            f"{r['lag']['p50_s'] * 1e3:.2f}",
            f"{r['lag']['p99_s'] * 1e3:.2f}",
            f"{r['lag']['p999_s'] * 1e3:.2f}",
            f"{r['lag']['max_s'] * 1e3:.2f}",
            str(r["lag"]["samples"]),
            f"{r['steal_share'] * 100:.1f}" if r.get("steal_share") is not None else "-",
            str(r["loop_preempted"]),
            ("yes" if r["lag"]["p99_s"] <= TARGET_P99_S else "no") if r["op"] != "idle" else "",
        ]
        for r in results
    ]
    m: dict[str, Any] = data["machine"]
    md = "\n".join(
        [
            "# Event-loop lag while streaming",
            "",
            f"Run {started} on {m['cpus']} CPUs, {m['platform']}, Python {m['python']}:",
            "",
            f"    {data['command']}",
            "",
            f"A ticker asks to wake every {TICK_S * 1e3:.0f} ms and records how late it wakes, while "
            f"{args.streams} producers keep the tier busy with {args.batch}-chunk calls (max_inflight = depth) "
            f"for {args.seconds:g} s per phase. Loads read chunks just written (page cache warm: the most CPU per "
            f"second the loop has to share). Target: p99 <= {TARGET_P99_S * 1e3:g} ms during an fs offload at "
            "full speed. *steal %*: the share of the machine's CPU time its hypervisor kept meanwhile (a "
            "virtual CPU stopped, which no thread in the guest sees); *loop preempted*: the loop thread's "
            "involuntary context switches. On a virtual machine a lag tail with steal well above zero is "
            "the host's, not the tier's.",
            "",
            benchkit.md_table(
                [
                    "loop",
                    "tier",
                    "chunk",
                    "depth",
                    "phase",
                    "GB/s",
                    "lag p50 ms",
                    "p99 ms",
                    "p99.9 ms",
                    "max ms",
                    "samples",
                    "steal %",
                    "loop preempted",
                    f"p99 <= {TARGET_P99_S * 1e3:g} ms",
                ],
                rows,
            ),
            "",
            *(_repeat_table(points) if args.repeat > 1 else []),
            f"Worst fs offload p99 with the default engine ({worst_engine}"
            + (f", median of {args.repeat} runs" if args.repeat > 1 else "")
            + f"): {worst * 1e3:.2f} ms -> "
            f"{'meets' if data['meets_target'] else 'MISSES'} the {TARGET_P99_S * 1e3:g} ms target."
            if worst is not None
            else "No fs offload measured.",
        ]
    )
    for p in benchkit.write_results(args.out, args.name, data, md):
        print(f"wrote {p}")
    return 0 if data["meets_target"] or worst is None else 1


if __name__ == "__main__":
    sys.exit(main())
