"""The tiers from a primary buffer on huge pages against the same buffer on 4 KiB pages.

    .venv/bin/python bench/bench_huge_pages.py --dir /var/tmp/huge-pages --mib 256 --repeat 3

With O_DIRECT the device gets one segment per physically contiguous piece of the primary
buffer (docs/configuration.md, "Huge pages"), so the buffer's pages can move a tier's speed
by themselves. For each chunk size, each repeat runs every tier twice, once from a buffer of
``asynctier.buffers.allocate_buffer(huge_pages=True)`` and once from one with
``huge_pages=False``, in alternating order: ``--mib`` of chunks offloaded into a fresh tier
(calls of ``--batch``, enough in flight to fill ``--depth``) until ``os.sync()`` returns,
then, with the tier's files dropped from the page cache, loaded back. The figure is the
median over repeats of huge / base GB/s, per tier and operation: above 1, the pages alone
made the tier faster. fio does the same comparison for itself where the kernel holds hugetlb
pages in reserve (``--mem=shmhuge`` against its default ``malloc``; this script reserves
none): the limit moves for every writer.

Writes ``--json`` if given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.buffers import HUGE_PAGE, allocate_buffer, huge_page_bytes
from asynctier.cli import benchkit


def _config(tier: str, d: Path, depth: int, n: int, chunk: int) -> dict[str, Any]:
    if tier == "fs":
        return {"type": "fs", "root": str(d / "fs"), "max_inflight": depth}
    if tier == "nvme":
        room = (n + 64) * (chunk + 4096)
        return {"type": "nvme", "path": str(d / "slab"), "max_inflight": depth, "capacity_bytes": room}
    raise SystemExit(f"--tiers: fs and nvme only (the tiers that use O_DIRECT), got {tier!r}")


async def _run(tier_type: str, d: Path, chunk: int, depth: int, n: int, batch: int, huge: bool) -> dict[str, Any]:
    """One tier, one buffer: offload ``n`` chunks until synced, then load them back cold."""
    slots = max(64, 2 * depth)
    spec = OffloadingSpec(chunk, slots, namespace="bench/huge-pages")
    view = allocate_buffer(spec.total_bytes, huge_pages=huge)
    block = os.urandom(1 << 20)
    for off in range(0, spec.total_bytes, len(block)):
        view[off : off + len(block)] = block[: spec.total_bytes - off]
    share = huge_page_bytes(view)
    tier = SecondaryTierFactory.create_secondary_tier(_config(tier_type, d, depth, n, chunk), view, spec)
    keys = [b"h-%09d" % i for i in range(n)]
    sem = asyncio.Semaphore(max(1, depth // batch) + 1)  # enough calls in flight to fill the depth

    async def one(op: str, i: int) -> None:
        ks = keys[i : i + batch]
        async with sem:
            res = await getattr(tier, op)(ks, [(i + j) % slots for j in range(len(ks))])
        if res.failed:
            raise RuntimeError(f"{op}: {next(iter(res.failed.values()))!r}")

    out: dict[str, Any] = {"huge_page_share": None if share is None else share / spec.total_bytes}
    async with tier:
        for op in ("offload", "load"):
            benchkit.settle(d)
            t0 = time.perf_counter()
            await asyncio.gather(*(one(op, i) for i in range(0, n, batch)))
            if op == "offload":
                os.sync()  # on the medium, as fio's end_fsync
            out[op] = n * chunk / (time.perf_counter() - t0)
            if op == "offload":
                benchkit.drop_tree_cache(d)  # loads from the device, not the page cache
    return out


def _clear(d: Path) -> None:
    """The tier's files, removed between runs (each run starts from an empty tier)."""
    shutil.rmtree(d / "fs", ignore_errors=True)
    for p in d.glob("slab*"):
        p.unlink()


def _fio(d: Path, rw: str, chunk: int, depth: int, size: int, mem: str | None) -> float | None:
    """fio's bytes/s (io_uring), or None where it cannot run so (hugetlb pages it may not use)."""
    try:
        r = benchkit.run_fio(d / "fio", rw=rw, bs=chunk, iodepth=depth, size=size, mem=mem)
    except subprocess.CalledProcessError:
        return None
    benchkit.settle(d)
    return r.bytes_per_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp/huge-pages")
    ap.add_argument("--tiers", default="fs,nvme")
    ap.add_argument("--sizes-kib", default="64,256,2048")
    ap.add_argument("--depth", type=int, default=16, help="max_inflight")
    ap.add_argument("--batch", type=int, default=32, help="chunks per call")
    ap.add_argument("--mib", type=int, default=256, help="MiB per run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-fio", action="store_true", help="leave out fio's own comparison")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    d = Path(args.dir)
    for t in tiers:
        _config(t, d, args.depth, 1, 4096)  # refuse an unknown tier before anything runs
    d.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    try:
        for kib in (int(x) for x in args.sizes_kib.split(",")):
            chunk = kib << 10
            n = max(2 * args.depth, (args.mib << 20) // chunk)
            fio_ok = not args.no_fio and benchkit.fio_available()
            # fio's depth buffers, rounded up, and its alignment
            fio_huge_ok = fio_ok and benchkit.hugetlb_free_bytes() >= args.depth * chunk + 2 * HUGE_PAGE
            reps: list[dict[str, Any]] = []
            for rep in range(args.repeat):
                order = (True, False) if rep % 2 == 0 else (False, True)
                r: dict[str, Any] = {"order": ["huge" if h else "base" for h in order]}
                for t in tiers:
                    for huge in order:
                        r[f"{t} {'huge' if huge else 'base'}"] = asyncio.run(
                            _run(t, d, chunk, args.depth, n, args.batch, huge)
                        )
                        _clear(d)
                if fio_huge_ok:
                    for rw in ("write", "read"):
                        for mem in ("shmhuge", None) if rep % 2 == 0 else (None, "shmhuge"):
                            r[f"fio {rw} {mem or 'malloc'}"] = _fio(d, rw, chunk, args.depth, n * chunk, mem)
                    if None in (r.get(f"fio {rw} {m}") for rw in ("write", "read") for m in ("shmhuge", "malloc")):
                        print("fio could not run from hugetlb pages: its comparison is left out", flush=True)
                        fio_huge_ok = False
                        for k in [k for k in r if k.startswith("fio ")]:
                            del r[k]
                reps.append(r)
                line = f"{kib} KiB rep {rep}:"
                for t in tiers:
                    h, b = r[f"{t} huge"], r[f"{t} base"]
                    line += (
                        f" {t} offload {h['offload'] / 1e9:.2f}/{b['offload'] / 1e9:.2f} GB/s, "
                        f"load {h['load'] / 1e9:.2f}/{b['load'] / 1e9:.2f} (huge/base);"
                    )
                if fio_huge_ok:
                    line += " fio write {:.2f}/{:.2f}, read {:.2f}/{:.2f} (hugetlb/malloc)".format(
                        *(r[f"fio {rw} {m}"] / 1e9 for rw in ("write", "read") for m in ("shmhuge", "malloc"))
                    )
                print(line, flush=True)
            row: dict[str, Any] = {"chunk": chunk, "depth": args.depth, "chunks": n, "reps": reps, "huge_x_base": {}}
            for t in tiers:
                for op in ("offload", "load"):
                    row["huge_x_base"][f"{t} {op}"] = statistics.median(
                        x[f"{t} huge"][op] / x[f"{t} base"][op] for x in reps
                    )
            paired = [x for x in reps if "fio write shmhuge" in x]
            if paired:
                for rw in ("write", "read"):
                    row["huge_x_base"][f"fio {rw}"] = statistics.median(
                        x[f"fio {rw} shmhuge"] / x[f"fio {rw} malloc"] for x in paired
                    )
            rows.append(row)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print(f"\nhuge pages over 4 KiB pages, median of {args.repeat} interleaved repeats, depth {args.depth}:")
    for row in rows:
        cells = ", ".join(f"{k} {v:.2f}x" for k, v in row["huge_x_base"].items())
        print(f"  {row['chunk'] >> 10} KiB: {cells}")
    if not any("fio write" in row["huge_x_base"] for row in rows) and not args.no_fio:
        print("  (fio: no hugetlb pages in reserve; `echo 64 > /proc/sys/vm/nr_hugepages` as root gives it some)")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"command": " ".join([sys.executable, *sys.argv]), "rows": rows}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
