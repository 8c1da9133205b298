"""nvme tier offloads against fio writes, interleaved, with what the device saw.

    .venv/bin/python bench/bench_nvme_writes.py --dir /var/tmp/nvme-writes --mib 512 --repeat 3

For each chunk size and depth, each repeat runs: fio write (best of io_uring and psync,
O_DIRECT, the same block size and depth, ``end_fsync=1``), the tier (once per primary buffer
size in ``--views`` and page size in ``--pages``), fio again. The tier
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

So do the buffer's pages: ``--pages base,huge`` runs each buffer on ordinary 4 KiB pages and
on transparent huge pages (``asynctier.buffers.allocate_buffer``). O_DIRECT hands the device
one segment per physically contiguous piece, and a request takes at most the device's
``max_segments`` of them (254 on this virtual disk: about 1 MiB on 4 KiB pages, where huge
pages allow up to ``max_sectors_kb``). fio writes from ordinary pages. Where the kernel holds
hugetlb pages in reserve (``/proc/sys/vm/nr_hugepages``), each repeat also runs fio on them
(``--mem=shmhuge``, the best of ``--fio-engines`` as for its own buffers), "fio huge": the
same limit for fio, so the tier on huge pages can be set
beside fio on huge pages too. This script reserves none itself; ``--no-fio-huge`` skips it.

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
from asynctier.buffers import HUGE_PAGE, allocate_buffer, huge_page_bytes
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
    """One repeat of a point: fio before and after, the tier's runs by buffer ("64": 64 chunks
    on ordinary pages, "64 huge": on huge pages), and each run's B/s over fio's mean."""

    fio_before: dict[str, Any]
    tiers: dict[str, dict[str, Any]]
    fio_after: dict[str, Any]
    ratios: dict[str, float]
    bare_c: dict[str, float]  # bytes/s, by buffer (empty without a compiler)
    bare_ratios: dict[str, float]
    fio_huge: float | None  # fio's bytes/s from hugetlb pages (None: none reserved)


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
    d: Path, chunk: int, depth: int, n: int, batch: int, disk: DiskStat, cfg: dict[str, Any], view_chunks: int = 64,
    huge: bool = False,
) -> dict[str, Any]:  # fmt: skip
    slots = view_chunks
    spec = OffloadingSpec(chunk, slots, namespace="bench/nvme-writes")
    view = allocate_buffer(spec.total_bytes, huge_pages=huge)  # page-aligned, as pinned memory is
    block = os.urandom(1 << 20)
    for off in range(0, spec.total_bytes, len(block)):
        view[off : off + len(block)] = block[: spec.total_bytes - off]
    huge_bytes = huge_page_bytes(view)
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
        out["huge_page_share"] = None if huge_bytes is None else huge_bytes / spec.total_bytes
        out["stats"] = {k: v for k, v in tier.stats().extra.items() if isinstance(v, (int, float))}
    return out


def _bare_c(exe: Path, d: Path, chunk: int, n: int, depth: int, view_chunks: int, huge: bool = False) -> float:
    """bytes/s of ``bare_slab_c`` writing ``n`` chunks at ``depth`` from ``view_chunks`` chunks
    (on huge pages with ``huge``)."""
    benchkit.settle(d)
    cmd = [str(exe), str(d / "slab-bare"), str(chunk), str(n), str(depth), str(view_chunks), "4096"]
    cmd += ["huge"] if huge else []
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"bare_slab_c failed: {r.stderr.strip()}")
    return n * chunk / float(r.stdout)


def _buffer_name(label: str) -> str:
    """ "64 huge" -> "64-chunk buffer, huge pages"."""
    v, _, huge = label.partition(" ")
    return f"{v}-chunk buffer{', huge pages' if huge else ''}"


def _fio_huge(d: Path, chunk: int, depth: int, size: int, engines: list[str]) -> float | None:
    """fio's write bytes/s from hugetlb pages (``--mem=shmhuge``), the best of ``engines`` as
    for its own buffers; None where the kernel holds too few free for its buffers (each job
    of a synchronous engine maps its own) or fio refuses them."""
    best = None
    for engine in engines:
        sync = engine in ("psync", "sync", "pvsync", "pvsync2")
        jobs, per_job = (depth, chunk) if sync else (1, depth * chunk)
        need = jobs * (-(-per_job // HUGE_PAGE) + 1) * HUGE_PAGE  # rounded up, and its alignment
        if benchkit.hugetlb_free_bytes() < need:
            continue
        try:
            r = benchkit.run_fio(
                d / "fio", rw="write", bs=chunk, iodepth=depth, size=size, ioengine=engine, mem="shmhuge"
            )
        except subprocess.CalledProcessError:
            continue
        benchkit.settle(d)
        best = r.bytes_per_s if best is None else max(best, r.bytes_per_s)
    return best


def _huge_ratios(reps: list[Rep], buffers: dict[str, tuple[int, bool]]) -> dict[str, float]:
    """Median over the repeats of each huge-page buffer's tier run over fio's on hugetlb pages."""
    out: dict[str, float] = {}
    for label, (_, huge) in buffers.items():
        each = [r["tiers"][label]["Bps"] / r["fio_huge"] for r in reps if r["fio_huge"]]
        if huge and each:
            out[label] = statistics.median(each)
    return out


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
    ap.add_argument(
        "--pages",
        default="base,huge",
        help="the primary buffer's pages, each a tier run per buffer size: base (4 KiB), huge (transparent huge pages)",
    )
    ap.add_argument("--no-fio-huge", action="store_true", help="no fio run from hugetlb pages, even where reserved")
    ap.add_argument("--fio-engines", default="io_uring,psync")
    ap.add_argument("--tier-config", default="{}", help="JSON merged into the tier's config")
    ap.add_argument("--no-bare-c", action="store_true", help="leave out the C threads' reference")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    pages = [p.strip() for p in args.pages.split(",") if p.strip()]
    if not pages or set(pages) - {"base", "huge"}:
        ap.error(f"--pages takes base and/or huge, comma-separated; got {args.pages!r}")
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
                buffers = {f"{v}{' huge' if p == 'huge' else ''}": (v, p == "huge") for v in views for p in pages}
                reps: list[Rep] = []
                for rep in range(args.repeat):
                    before = _fio(d, chunk, depth, n * chunk, disk, engines)
                    runs: dict[str, dict[str, Any]] = {}
                    bare_bps: dict[str, float] = {}
                    for label, (v, huge) in buffers.items():
                        runs[label] = asyncio.run(
                            _tier(d, chunk, depth, n, args.batch, disk, cfg, view_chunks=v, huge=huge)
                        )
                        for p in d.glob("slab*"):
                            p.unlink()
                        benchkit.settle(d)
                        if bare is not None:
                            bare_bps[label] = _bare_c(bare, d, chunk, n, depth, v, huge)
                    fio_huge = None if args.no_fio_huge else _fio_huge(d, chunk, depth, n * chunk, engines)
                    after = _fio(d, chunk, depth, n * chunk, disk, engines)
                    fio_bps = (before["Bps"] + after["Bps"]) / 2
                    ratios = {v: t["Bps"] / fio_bps for v, t in runs.items()}
                    bare_ratios = {v: b / fio_bps for v, b in bare_bps.items()}
                    reps.append({"fio_before": before, "tiers": runs, "fio_after": after, "ratios": ratios,
                                 "bare_c": bare_bps, "bare_ratios": bare_ratios, "fio_huge": fio_huge})  # fmt: skip
                    fb = before[before["best"]]
                    line = (
                        f"{kib} KiB d{depth} rep {rep}: fio {before['Bps'] / 1e9:.2f}/{after['Bps'] / 1e9:.2f} GB/s "
                        f"({before['best']}, {fb.get('dev_write_kib', 0):.0f} KiB req, "
                        f"{fb.get('dev_inflight', 0):.1f} in flight)"
                    )
                    for label, t in runs.items():
                        line += (
                            f"; tier, {_buffer_name(label)}: {t['Bps'] / 1e9:.2f} GB/s "
                            f"({t.get('dev_write_kib', 0):.0f} KiB req, {t.get('dev_inflight', 0):.1f} in flight, "
                            f"{t['cpu_s_per_gib']:.2f} CPU s/GiB) {ratios[label]:.2f}x"
                        )
                        if label in bare_bps:
                            line += f"; bare C: {bare_bps[label] / 1e9:.2f} GB/s {bare_ratios[label]:.2f}x"
                    if fio_huge is not None:
                        line += f"; fio huge: {fio_huge / 1e9:.2f} GB/s {fio_huge / fio_bps:.2f}x"
                    print(line, flush=True)
                rows.append(
                    {
                        "chunk": chunk,
                        "depth": depth,
                        "ratio": {v: statistics.median(r["ratios"][v] for r in reps) for v in buffers},
                        "bare_ratio": {
                            v: statistics.median(r["bare_ratios"][v] for r in reps) for v in buffers if bare is not None
                        },
                        # the tier on huge pages over fio on huge pages, where fio could run on them
                        "huge_ratio": _huge_ratios(reps, buffers),
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
            print(f"  {kib} KiB depth {r['depth']}, {_buffer_name(v)}: {med:.2f}x  (per repeat: {each})")
            pad = " " * (len(str(kib)) + 15 + len(str(r["depth"])))
            if v in r["bare_ratio"]:
                each = ", ".join(format(x["bare_ratios"][v], ".2f") for x in r["reps"])
                print(f"  {pad}bare C, the same buffer: {r['bare_ratio'][v]:.2f}x  (per repeat: {each})")
            if v in r["huge_ratio"]:
                print(f"  {pad}over fio on huge pages: {r['huge_ratio'][v]:.2f}x")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"command": " ".join([sys.executable, *sys.argv]), "rows": rows}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
