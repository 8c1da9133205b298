"""nvme tier offloads against fio writes, interleaved, with what the device saw.

    .venv/bin/python bench/bench_nvme_writes.py --dir /var/tmp/nvme-writes --mib 512 --repeat 3

For each chunk size and depth, each repeat runs: fio write (best of io_uring and psync,
O_DIRECT, the same block size and depth, ``end_fsync=1``), the tier (once per primary buffer
size in ``--views``), fio again. The tier
writes ``--mib`` of chunks into a fresh slab (created and preallocated untimed, as fio's file
is laid out before its clock starts), then one ``fdatasync`` (fio's ``end_fsync``), driven as
an inference server would: calls of ``--batch`` chunks, enough of them in flight to fill the
tier's ``max_inflight`` (= depth). A ratio divides the tier's bytes/s by the mean of the fio
runs either side of it; the report gives medians over repeats.

Beside each figure: the block device's own statistics over the run (``/sys/dev/block/*/stat``
deltas): mean write request size and mean requests in flight (time-weighted), and the CPU
seconds the process spent per GiB, so the tier's I/O pattern can be set beside fio's.

The primary buffer the chunks come from matters on this machine's virtual disk: fio writes
from ``depth`` buffers of one block, and the tier from the same few MiB wrote about as fast as
fio, from 16 MiB 10-25% slower (so did C threads making the same system calls,
docs/benchmarks-nvme-writes.md). ``--views 64,depth`` measures both.

**bare C** (after each tier run, from a buffer of the same size): ``bench/bare_slab_c.c``,
compiled with ``cc`` (or ``$CC``) at the start, ``depth`` C threads writing the same slab
layout with one ``pwritev`` of a header block and a chunk per slot, no checksum, journal or
index, then one ``fdatasync``: the floor of synchronous writes from threads out of that
buffer, beside fio's. ``--no-bare-c`` leaves it out (as does a machine without a compiler).

Writes ``--json`` if given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

from bench_fs import build_bare_c

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.cli import benchkit

ROOT = Path(__file__).resolve().parent.parent

# mypy checks tiers/ as the top-level package "tiers": pyproject's package-dir installs it as
# asynctier.tiers, a mapping mypy cannot follow; the same modules, so the same types
if TYPE_CHECKING:
    from tiers.nvme import NvmeTier
else:
    from asynctier.tiers.nvme import NvmeTier

GiB = 1 << 30


class Rep(TypedDict):
    """One repeat of a point: fio before and after, the tier's runs by buffer size in chunks,
    and each run's B/s over fio's mean."""

    fio_before: dict[str, Any]
    tiers: dict[int, dict[str, Any]]
    fio_after: dict[str, Any]
    ratios: dict[int, float]
    bare_c: dict[int, float]  # bytes/s, by buffer size (empty without a compiler)
    bare_ratios: dict[int, float]


class DiskStat:
    """Deltas of one block device's ``stat`` file across a measurement."""

    def __init__(self, path: Path) -> None:
        st = os.stat(path)
        p = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}")
        self.file = p / "stat" if (p / "stat").exists() else None

    def read(self) -> list[int]:
        return [int(x) for x in self.file.read_text().split()] if self.file else []

    @staticmethod
    def delta(a: list[int], b: list[int], seconds: float) -> dict[str, float]:
        if not a:
            return {}
        d = [y - x for x, y in zip(a, b)]
        writes, sectors, wait_ms = d[4], d[6], d[7]
        return {
            "dev_writes": writes,
            "dev_write_kib": sectors * 512 / max(writes, 1) / 1024,  # mean request size
            "dev_inflight": d[10] / 1000 / seconds,  # weighted ms in queue / elapsed: mean queue depth
            "dev_write_ms": wait_ms / max(writes, 1),  # mean time of one write request
            "dev_flushes": d[15] if len(d) > 15 else 0,
        }


def _cpu(who: int = resource.RUSAGE_SELF) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _fio(d: Path, chunk: int, depth: int, size: int, disk: DiskStat, engines: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for engine in engines:
        a, c0 = disk.read(), _cpu(resource.RUSAGE_CHILDREN)
        try:
            r = benchkit.run_fio(d / "fio", rw="write", bs=chunk, iodepth=depth, size=size, ioengine=engine)
        except subprocess.CalledProcessError:  # an engine this kernel or fio lacks
            continue
        # the device's in-flight time over fio's own clock (its file's layout writes no data)
        out[engine] = {"Bps": r.bytes_per_s, **DiskStat.delta(a, disk.read(), size / r.bytes_per_s)}
        out[engine]["cpu_s_per_gib"] = (_cpu(resource.RUSAGE_CHILDREN) - c0) / (size / GiB)
        benchkit.settle(d)
    if not out:
        raise RuntimeError(f"fio failed with every engine of {engines}")
    best = max(out, key=lambda e: out[e]["Bps"])
    out["best"] = best
    out["Bps"] = out[best]["Bps"]
    return out


async def _tier(
    d: Path, chunk: int, depth: int, n: int, batch: int, disk: DiskStat, cfg: dict[str, Any], view_chunks: int = 64
) -> dict[str, Any]:
    slots = view_chunks
    spec = OffloadingSpec(chunk, slots, namespace="bench/nvme-writes")
    buf = mmap.mmap(-1, spec.total_bytes)  # page-aligned, as pinned memory is
    block = os.urandom(1 << 20)
    for off in range(0, spec.total_bytes, len(block)):
        buf[off : off + len(block)] = block[: spec.total_bytes - off]
    view = memoryview(buf)
    conf = {
        "type": "nvme",
        "path": str(d / "slab"),
        "max_inflight": depth,
        "capacity_bytes": (n + slots) * (chunk + 4096) + (1 << 20),
        **cfg,
    }
    tier = SecondaryTierFactory.create_secondary_tier(conf, view, spec)
    assert isinstance(tier, NvmeTier)  # its slab files are synced below
    keys = [b"w-%09d" % i for i in range(n)]
    async with tier:
        sem = asyncio.Semaphore(max(1, depth // batch) + 1)  # enough calls in flight to fill the depth

        async def one(i: int) -> None:
            ks = keys[i : i + batch]
            async with sem:
                res = await tier.offload(ks, [(i + j) % slots for j in range(len(ks))])
            if res.failed:
                raise RuntimeError(f"offload: {next(iter(res.failed.values()))!r}")

        benchkit.settle(d)
        a, c0, t0 = disk.read(), _cpu(), time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(0, n, batch)))
        for fd in tier._slabs.fds:  # what fio's end_fsync does
            os.fdatasync(fd)
        dt = time.perf_counter() - t0
        out: dict[str, Any] = {"Bps": n * chunk / dt, "cpu_s_per_gib": (_cpu() - c0) / (n * chunk / GiB)}
        out.update(DiskStat.delta(a, disk.read(), dt))
        out["stats"] = {k: v for k, v in tier.stats().extra.items() if isinstance(v, (int, float))}
    return out


def _bare_c(exe: Path, d: Path, chunk: int, n: int, depth: int, view_chunks: int) -> float:
    """bytes/s of ``bare_slab_c`` writing ``n`` chunks at ``depth`` from ``view_chunks`` chunks."""
    benchkit.settle(d)
    cmd = [str(exe), str(d / "slab-bare"), str(chunk), str(n), str(depth), str(view_chunks), "4096"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"bare_slab_c failed: {r.stderr.strip()}")
    return n * chunk / float(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp/nvme-writes")
    ap.add_argument("--mib", type=int, default=512, help="MiB written per run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes-kib", default="256,2048")
    ap.add_argument("--depths", default="16")
    ap.add_argument("--batch", type=int, default=32, help="chunks per offload call")
    ap.add_argument(
        "--views",
        default="64,depth",
        help="primary buffer sizes in chunks, each a tier run per repeat ('depth': as many as the depth, "
        "the bytes fio writes from)",
    )
    ap.add_argument("--fio-engines", default="io_uring,psync")
    ap.add_argument("--tier-config", default="{}", help="JSON merged into the tier's config")
    ap.add_argument("--no-bare-c", action="store_true", help="leave out the C threads' reference")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    disk = DiskStat(d)
    engines = args.fio_engines.split(",")
    cfg = json.loads(args.tier_config)
    size = args.mib << 20
    rows: list[dict[str, Any]] = []
    try:
        bare = None if args.no_bare_c else build_bare_c(d / "bin", "bare_slab_c", "bench_nvme_writes")
        for kib in (int(x) for x in args.sizes_kib.split(",")):
            chunk = kib << 10
            for depth in (int(x) for x in args.depths.split(",")):
                n = size // chunk
                views = [depth if v == "depth" else int(v) for v in args.views.split(",")]
                reps: list[Rep] = []
                for rep in range(args.repeat):
                    before = _fio(d, chunk, depth, n * chunk, disk, engines)
                    runs: dict[int, dict[str, Any]] = {}
                    bare_bps: dict[int, float] = {}
                    for v in views:
                        runs[v] = asyncio.run(_tier(d, chunk, depth, n, args.batch, disk, cfg, view_chunks=v))
                        for p in d.glob("slab*"):
                            p.unlink()
                        benchkit.settle(d)
                        if bare is not None:
                            bare_bps[v] = _bare_c(bare, d, chunk, n, depth, v)
                    after = _fio(d, chunk, depth, n * chunk, disk, engines)
                    fio_bps = (before["Bps"] + after["Bps"]) / 2
                    ratios = {v: t["Bps"] / fio_bps for v, t in runs.items()}
                    bare_ratios = {v: b / fio_bps for v, b in bare_bps.items()}
                    reps.append({"fio_before": before, "tiers": runs, "fio_after": after, "ratios": ratios,
                                 "bare_c": bare_bps, "bare_ratios": bare_ratios})  # fmt: skip
                    fb = before[before["best"]]
                    line = (
                        f"{kib} KiB d{depth} rep {rep}: fio {before['Bps'] / 1e9:.2f}/{after['Bps'] / 1e9:.2f} GB/s "
                        f"({before['best']}, {fb.get('dev_write_kib', 0):.0f} KiB req, "
                        f"{fb.get('dev_inflight', 0):.1f} in flight)"
                    )
                    for v, t in runs.items():
                        line += (
                            f"; tier, {v}-chunk buffer: {t['Bps'] / 1e9:.2f} GB/s ({t.get('dev_write_kib', 0):.0f} KiB "
                            f"req, {t.get('dev_inflight', 0):.1f} in flight, {t['cpu_s_per_gib']:.2f} CPU s/GiB) "
                            f"{ratios[v]:.2f}x"
                        )
                        if v in bare_bps:
                            line += f"; bare C: {bare_bps[v] / 1e9:.2f} GB/s {bare_ratios[v]:.2f}x"
                    print(line, flush=True)
                rows.append(
                    {
                        "chunk": chunk,
                        "depth": depth,
                        "ratio": {v: statistics.median(r["ratios"][v] for r in reps) for v in views},
                        "bare_ratio": {
                            v: statistics.median(r["bare_ratios"][v] for r in reps) for v in views if bare is not None
                        },
                        "reps": reps,
                    }
                )
    finally:
        shutil.rmtree(d, ignore_errors=True)
    print(f"\nnvme offload x fio write, median of {args.repeat} (fio before and after each tier run), {args.mib} MiB:")
    for r in rows:
        kib = r["chunk"] >> 10
        for v, med in r["ratio"].items():
            each = ", ".join(format(x["ratios"][v], ".2f") for x in r["reps"])
            print(f"  {kib} KiB depth {r['depth']}, {v}-chunk buffer: {med:.2f}x  (per repeat: {each})")
            if v in r["bare_ratio"]:
                each = ", ".join(format(x["bare_ratios"][v], ".2f") for x in r["reps"])
                print(f"  {'':>{len(str(kib)) + 15 + len(str(r['depth']))}}bare C, the same buffer: "
                      f"{r['bare_ratio'][v]:.2f}x  (per repeat: {each})")  # fmt: skip
    if args.json:
        Path(args.json).write_text(
            json.dumps({"command": " ".join([sys.executable, *sys.argv]), "rows": rows}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
