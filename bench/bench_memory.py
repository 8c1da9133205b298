"""Peak RSS growth while offloading 4 GiB through a tier: nothing may scale with the bytes moved.

A small primary buffer (``--slots`` chunks) is reused again and again with fresh keys, in
calls of ``--batch`` chunks, ``--streams`` calls at a time, until ``--total`` bytes have been
offloaded; the tier (``max_inflight = --depth``) has a ``capacity_bytes`` so old chunks are
evicted and the disk stays bounded. Memory is read from ``/proc/self/status``: the baseline
is VmRSS once the tier is open and a first call has warmed it up; the peak is VmHWM, reset
(``/proc/self/clear_refs``) right after the baseline, and also a 5 ms sampler of VmRSS.

Target (issue 6): growth at most 64 MiB + depth x chunk size.

Run from the repository root::

    .venv/bin/python bench/bench_memory.py                  # fs, nvme, obj: 2 MiB chunks, depth 16, 4 GiB each
    .venv/bin/python bench/bench_memory.py --tier fs --chunk 256K,2M

Writes ``bench/results/memory.json`` and ``bench/results/memory.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.cli import benchkit
from asynctier.cli.sizes import format_size, parse_size
from asynctier.cli.tierfile import DEFAULT_TIERS
from asynctier.posix_io import aligned_buffer

REPO = Path(__file__).resolve().parent.parent

MiB = 1 << 20


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class Sampler:
    """Samples VmRSS every few milliseconds in a thread (a second opinion on VmHWM)."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self.peak_kib = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_kib = max(self.peak_kib, status_kib("VmRSS"))
            self._stop.wait(self.period_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    chunk = args.chunk
    spec = OffloadingSpec(chunk, args.slots, namespace="bench/memory")
    view = aligned_buffer(spec.total_bytes)  # page-aligned, as a pinned host buffer is
    view[:] = os.urandom(spec.total_bytes)
    cfg: dict[str, Any] = {
        k: (str(v).replace("{dir}", str(workdir)) if isinstance(v, str) else v)
        for k, v in DEFAULT_TIERS.get(args.tier, {"type": args.tier}).items()
    }
    cfg["capacity_bytes"] = args.capacity
    cfg["max_inflight"] = args.depth
    tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
    per_call = args.batch
    calls = -(-args.total // (chunk * per_call))
    counter = 0
    failed = 0
    moved = 0

    async def one_call(stream: int) -> None:
        nonlocal counter, failed, moved
        keys = [f"mem/{counter + i}".encode() for i in range(per_call)]
        counter += per_call
        ids = [(stream * per_call + i) % args.slots for i in range(per_call)]
        res = await tier.offload(keys, ids)
        failed += len(res.failed)
        moved += res.bytes_transferred

    async with tier:
        await one_call(0)  # warm-up: threads started, first files and directories created
        baseline = status_kib("VmRSS")
        peak_reset = reset_peak()
        t0 = time.perf_counter()
        with Sampler() as sampler:
            done = 1
            while done < calls:
                n = min(args.streams, calls - done)
                await asyncio.gather(*(one_call(s) for s in range(n)))
                done += n
        elapsed = time.perf_counter() - t0
        hwm = status_kib("VmHWM") if peak_reset else 0
        stats = tier.stats()
    peak = max(hwm, sampler.peak_kib)
    growth = (peak - baseline) * 1024
    budget = 64 * MiB + args.depth * chunk
    return {
        "tier": args.tier,
        "chunk_bytes": chunk,
        "depth": args.depth,
        "primary_bytes": spec.total_bytes,
        "offloaded_bytes": moved,
        "failed_chunks": failed,
        "seconds": elapsed,
        "bytes_per_s": moved / elapsed,
        "evictions": stats.evictions,
        "stored_chunks_at_end": stats.stored_chunks,
        "baseline_rss_bytes": baseline * 1024,
        "peak_rss_bytes": peak * 1024,
        "peak_source": "VmHWM and 5 ms VmRSS sampler" if peak_reset else "5 ms VmRSS sampler",
        "growth_bytes": growth,
        "budget_bytes": budget,
        "meets_target": growth <= budget and failed == 0,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tier", action="append", help="tier type(s) (repeatable; default: fs, nvme, obj)")
    ap.add_argument("--chunk", default="2M", help="chunk size(s), comma-separated")
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--total", type=parse_size, default=parse_size("4G"), help="bytes to offload per run")
    ap.add_argument("--slots", type=int, default=64, help="primary buffer size in chunks (reused)")
    ap.add_argument("--batch", type=int, default=16, help="chunks per call")
    ap.add_argument("--streams", type=int, default=4, help="calls in flight at once")
    ap.add_argument("--capacity", type=parse_size, default=parse_size("1G"), help="tier capacity_bytes")
    ap.add_argument("--root", default=None, help="directory for the tier's files (default: a temporary one)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args()
    if args.slots < args.batch * args.streams:
        ap.error("--slots must be at least --batch x --streams (each call offloads its own slots)")
    started = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
    results: list[dict[str, Any]] = []
    for tier in args.tier or ["fs", "nvme", "obj"]:
        for chunk in (parse_size(c) for c in args.chunk.split(",")):
            one = argparse.Namespace(**{**vars(args), "tier": tier, "chunk": chunk})
            if args.root:  # a scratch directory that does not exist yet is made, not an error
                Path(args.root).mkdir(parents=True, exist_ok=True)
            workdir = Path(tempfile.mkdtemp(prefix="asynctier-mem-", dir=args.root))
            try:
                r = _run_loop(one, workdir)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            results.append(r)
            print(
                f"{r['tier']}: offloaded {r['offloaded_bytes'] / 2**30:.2f} GiB of {format_size(r['chunk_bytes'])} "
                f"chunks at depth {r['depth']} in {r['seconds']:.1f} s ({r['bytes_per_s'] / 1e9:.2f} GB/s) through a "
                f"{format_size(r['primary_bytes'])} primary buffer; RSS {r['baseline_rss_bytes'] / MiB:.0f} MiB -> "
                f"peak {r['peak_rss_bytes'] / MiB:.0f} MiB: growth {r['growth_bytes'] / MiB:.1f} MiB, budget "
                f"{r['budget_bytes'] / MiB:.0f} MiB: {'meets' if r['meets_target'] else 'MISSES'} the target",
                flush=True,
            )
    cmd = " ".join([".venv/bin/python", "bench/bench_memory.py", *sys.argv[1:]])
    ok = all(r["meets_target"] for r in results)
    data: dict[str, Any] = {
        "started": started,
        "command": cmd,
        "machine": benchkit.machine_info(),
        "target": "peak RSS growth <= 64 MiB + depth x chunk size",
        "meets_target": ok,
        "results": results,
    }
    m = data["machine"]
    rows = [
        [
            r["tier"],
            format_size(r["chunk_bytes"]),
            str(r["depth"]),
            f"{r['offloaded_bytes'] / 2**30:.2f} GiB",
            f"{r['bytes_per_s'] / 1e9:.2f}",
            str(r["evictions"]),
            f"{r['baseline_rss_bytes'] / MiB:.0f} MiB",
            f"{r['peak_rss_bytes'] / MiB:.0f} MiB",
            f"{r['growth_bytes'] / MiB:.1f} MiB",
            f"{r['budget_bytes'] / MiB:.0f} MiB",
            "meets" if r["meets_target"] else "MISSES",
        ]
        for r in results
    ]
    cols = ["tier", "chunk", "depth", "offloaded", "GB/s", "evictions", "RSS before", "peak RSS", "growth", "budget"]
    md = "\n".join(
        [
            "# Peak RSS growth while offloading",
            "",
            f"Run {started} on {m['cpus']} CPUs, {m['platform']}, Python {m['python']}:",
            "",
            f"    {cmd}",
            "",
            f"A {args.slots}-chunk primary buffer reused with fresh keys, {args.batch}-chunk calls, {args.streams} "
            f"at a time, capacity_bytes {format_size(args.capacity)} (old chunks evicted as the stream goes on). "
            "Target: growth <= 64 MiB + depth x chunk size.",
            "",
            benchkit.md_table([*cols, "result"], rows),
            "",
            "Baseline: VmRSS once the tier is open and one call has warmed it up; peak: VmHWM (reset after the "
            "baseline) and a 5 ms VmRSS sampler, whichever is higher.",
        ]
    )
    for p in benchkit.write_results(args.out, "memory", data, md):
        print(f"wrote {p}")
    return 0 if ok else 1


def _run_loop(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(run(args, workdir))
    result: dict[str, Any] = uvloop.run(run(args, workdir))
    return result


if __name__ == "__main__":
    sys.exit(main())
