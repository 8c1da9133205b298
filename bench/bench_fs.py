"""Benchmark of the ``fs`` tier against the machine: fio (the physical limit) and a naive loop (the floor).

For each chunk size (256 KiB, 2 MiB) and depth (1, 4, 16), in one run and on one file system:

* **fio**, same block size and depth, O_DIRECT, io_uring, sequential write then read of one
  file (``end_fsync=1`` on the write; the read file dropped from the page cache);
* **fs tier**: one ``offload`` call of every chunk with ``max_inflight=depth``, timed until
  the bytes are on the medium (the call, then ``syncfs`` of the file system: fio's
  ``end_fsync``); then the files are dropped from the page cache and one ``load`` call reads
  every chunk back into *other* slots of the primary buffer (zeroed first), verified;
* **naive**: :func:`asynctier.benchkit.naive_aiofiles`, one file per chunk, ``depth`` at a
  time, synced and dropped the same way;
* **each engine**: the tier again with each ``io_engine`` (native, threads) that the
  default (``"auto"``: the native workers where built, worker threads otherwise) did not
  pick, where it can run;
* **fio files**: fio over one file per block, all in one directory (a reference: what
  file-per-chunk costs here when the files share a directory; on ext4 the tier's shards
  are placed apart, which fio cannot do: docs/tiers/fs.md, "Where the shards live");
* **bare**: the thread engine's system calls from plain threads, no tier around them
  (:func:`asynctier.benchkit.bare_file_per_chunk`, its shards placed as the tier's);
  ``fs x bare`` is what the tier adds to the file system's own cost of its layout;
* **bare C**: the same system calls from C threads (``bench/bare_c.c``, compiled with ``cc``
  at the start; left out where there is none); ``bare x bare C`` is what Python threads
  cost over C ones, and ``bare C x fio`` what the layout itself costs.

Every measurement of a point is repeated ``--repeat`` times, interleaved (fio, tier, naive,
fio, ...), and the median is reported, so drift on a shared machine hits all three alike.
Before each one the device is let settle (:func:`asynctier.benchkit.settle`): the files
deleted for it are discarded on this ``discard``-mounted disk, and that work would
otherwise land on whoever is measured next.
The primary buffer is page-aligned (as a pinned host buffer is), so the tier uses O_DIRECT, and
on transparent huge pages (`--pages base`: 4 KiB pages; docs/configuration.md, "Huge pages").

Run (from the repository root)::

    .venv/bin/python bench/bench_fs.py --dir /var/tmp/asynctier-bench-fs

Writes ``bench/results/fs.json`` and ``bench/results/fs.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asynctier import ChunkTier, OffloadingSpec, SecondaryTierFactory
from asynctier.buffers import allocate_buffer
from asynctier.cli import benchkit
from asynctier.posix_io import spread_subdirs

REPO = Path(__file__).resolve().parent.parent

KiB, MiB = 1 << 10, 1 << 20
_libc = ctypes.CDLL(None, use_errno=True)


def syncfs(path: Path) -> None:
    """Flush the whole file system holding ``path`` (one journal commit), as fio's end_fsync."""
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def drop_tree(path: Path) -> None:
    """Evict every file under ``path`` from the page cache."""
    benchkit.drop_page_cache([str(p) for p in path.rglob("*") if p.is_file()])


def fresh(path: Path, spread: bool = False) -> Path:
    """An empty ``path``, after the device has finished with what was deleted (discards, journal).
    ``spread``: flagged as the tier flags its namespace directory (ext4 places the directories
    made in it apart: ``posix_io.spread_subdirs``), for bare_c's shards."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    if spread:
        spread_subdirs(path)
    benchkit.settle(path)
    return path


def fill_random(view: memoryview) -> None:
    """Random bytes, generated once in 64 MiB pieces (not compressible, not all equal)."""
    step = 64 * MiB
    block = os.urandom(min(step, view.nbytes))
    for off in range(0, view.nbytes, step):
        n = min(step, view.nbytes - off)
        view[off : off + n] = block[:n]
        block = block[1:] + block[:1]  # shift so pieces differ


async def tier_point(
    root: Path, view: memoryview, chunk: int, n: int, depth: int, config: dict[str, Any]
) -> tuple[float, float, dict[str, Any]]:
    """One offload + one cold load of ``n`` chunks; returns (write B/s, read B/s, stats extra)."""
    spec = OffloadingSpec(chunk, 2 * n, namespace=f"bench/{chunk}")
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "fs", "root": str(root), "max_inflight": depth, **config}, view, spec
    )
    keys = _keys("bench", chunk, n)
    async with tier:
        wbps = await _timed_offload(tier, root, view, chunk, n, "bench", spot_check=False)  # all are read below
        await asyncio.to_thread(drop_tree, root)
        dst = view[n * chunk : 2 * n * chunk]
        dst[:] = bytes(dst.nbytes)  # zero the target slots
        t0 = time.perf_counter()
        res = await tier.load(keys, list(range(n, 2 * n)))
        rbps = n * chunk / (time.perf_counter() - t0)
        if not res.ok:
            raise RuntimeError(f"load failed: {list(res.failed.items())[:2]}")
        if view[: n * chunk] != view[n * chunk : 2 * n * chunk]:
            raise RuntimeError("loaded bytes differ from offloaded bytes")
        extra: dict[str, Any] = dict(tier.stats().extra)
        extra["io_engine"] = getattr(tier, "active_io_engine", None)
    return wbps, rbps, extra


def _keys(tag: str, chunk: int, n: int) -> list[bytes]:
    return [f"{tag}-{chunk}-{i}".encode() for i in range(n)]


async def _timed_offload(
    tier: Any, root: Path, view: memoryview, chunk: int, n: int, tag: str, *, spot_check: bool = True
) -> float:
    """One offload call of chunks 0..n-1 under keys ``_keys(tag, chunk, n)``, timed until
    syncfs returns; B/s. ``spot_check``: the last four are loaded back (into slots n..n+3)
    and compared."""
    keys = _keys(tag, chunk, n)
    t0 = time.perf_counter()
    res = await tier.offload(keys, list(range(n)))
    await asyncio.to_thread(syncfs, root)
    wbps = n * chunk / (time.perf_counter() - t0)
    if not res.ok:
        raise RuntimeError(f"offload failed: {list(res.failed.items())[:2]}")
    if not spot_check:
        return wbps
    res = await tier.load(keys[-4:], list(range(n, n + 4)))
    if not res.ok or view[(n - 4) * chunk : n * chunk] != view[n * chunk : (n + 4) * chunk]:
        raise RuntimeError(f"a chunk stored ({tag}) did not load back exact")
    return wbps


async def full_point(
    root: Path, view: memoryview, chunk: int, n: int, depth: int, config: dict[str, Any]
) -> tuple[float, dict[str, Any]]:
    """Offload into a full tier: ``n`` chunks stored first (not timed, as fio lays out its
    file before it times), then ``n`` new ones, each evicting one; timed until syncfs
    returns. Returns (write B/s, stats extra)."""
    spec = OffloadingSpec(chunk, 2 * n, namespace=f"bench/{chunk}")
    cfg = {"type": "fs", "root": str(root), "max_inflight": depth, **config}
    tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
    assert isinstance(tier, ChunkTier)  # its stored_size(): a chunk's bytes on disk, header and rounding in
    tier = SecondaryTierFactory.create_secondary_tier({**cfg, "capacity_bytes": n * tier.stored_size()}, view, spec)
    async with tier:
        res = await tier.offload([f"old-{chunk}-{i}".encode() for i in range(n)], list(range(n)))
        if not res.ok:
            raise RuntimeError(f"offload failed: {list(res.failed.items())[:2]}")
        await asyncio.to_thread(benchkit.settle, root)
        wbps = await _timed_offload(tier, root, view, chunk, n, "new")
        if tier.stats().evictions != n:
            raise RuntimeError(f"expected {n} evictions, got {tier.stats().evictions}")
        extra: dict[str, Any] = dict(tier.stats().extra)
    return wbps, extra


async def idle_point(
    root: Path, view: memoryview, chunk: int, n: int, depth: int, config: dict[str, Any]
) -> tuple[float, dict[str, Any]]:
    """Offload into an empty tier after an idle spell: the default engine with ``tmpfile_pool=n``,
    timed once the pool holds a file for every chunk and the file system has settled (a
    burst of as many chunks as a pool sized for it holds). Returns (write B/s, stats extra)."""
    spec = OffloadingSpec(chunk, 2 * n, namespace=f"bench/{chunk}")
    cfg = {"type": "fs", "root": str(root), "max_inflight": depth, "tmpfile_pool": n}
    tier = SecondaryTierFactory.create_secondary_tier({**cfg, **config}, view, spec)
    async with tier:
        deadline = time.monotonic() + 120
        while tier.stats().extra.get("tmpfile_pool_ready", 0) < n:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the pool made {tier.stats().extra.get('tmpfile_pool_ready')} of {n} files")
            await asyncio.sleep(0.05)
        await asyncio.to_thread(syncfs, root)
        await asyncio.to_thread(benchkit.settle, root)
        wbps = await _timed_offload(tier, root, view, chunk, n, "idle")
        extra: dict[str, Any] = dict(tier.stats().extra)
    return wbps, extra


async def naive_point(root: Path, view: memoryview, chunk: int, n: int, depth: int) -> tuple[float, float]:
    """The naive aiofiles loop, synced at the end and read back cold."""
    t0 = time.perf_counter()
    await benchkit.naive_aiofiles(root, view, chunk, n, depth=depth, mode="write", sync="none")
    await asyncio.to_thread(syncfs, root)
    wbps = n * chunk / (time.perf_counter() - t0)
    await asyncio.to_thread(drop_tree, root)
    rbps = await benchkit.naive_aiofiles(root, view[n * chunk :], chunk, n, depth=depth, mode="read")
    return wbps, rbps


async def bare_point(root: Path, view: memoryview, chunk: int, n: int, depth: int) -> tuple[float, float]:
    """The tier's system calls from plain threads (benchkit.bare_file_per_chunk): synced at
    the end, read back cold, as the tier is measured."""
    half = n * chunk
    t0 = time.perf_counter()
    await asyncio.to_thread(benchkit.bare_file_per_chunk, root, view[:half], chunk, n, depth=depth, mode="write")
    await asyncio.to_thread(syncfs, root)
    wbps = half / (time.perf_counter() - t0)
    await asyncio.to_thread(drop_tree, root)
    rbps = await asyncio.to_thread(
        benchkit.bare_file_per_chunk, root, view[half : 2 * half], chunk, n, depth=depth, mode="read"
    )
    if view[:half] != view[half : 2 * half]:
        raise RuntimeError("bare: read back bytes differ")
    return wbps, rbps


def build_bare_c(scratch: Path, name: str = "bare_c", who: str = "bench_fs") -> Path | None:
    """Compile ``bench/<name>.c`` (bare system calls from C threads: ``bare_c`` here,
    ``bare_slab_c`` for bench_nvme_writes.py) into directory ``scratch``; None, with a note,
    where no C compiler is at hand."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        print(f"{who}: no C compiler (cc): the 'bare C' column is left out", file=sys.stderr)
        return None
    scratch.mkdir(parents=True, exist_ok=True)
    exe = scratch / name
    r = subprocess.run(
        [cc, "-O2", "-pthread", "-o", str(exe), str(REPO / "bench" / f"{name}.c")], capture_output=True, text=True
    )
    if r.returncode != 0:
        print(f"{who}: building {name} failed, the 'bare C' column is left out:\n{r.stderr}", file=sys.stderr)
        return None
    return exe


def _bare_c(exe: Path, root: Path, mode: str, chunk: int, n: int, depth: int) -> float:
    """One phase of ``bare_c``; the seconds it took (a write phase includes its syncfs)."""
    # the layout of benchkit.bare_file_per_chunk: 256 shards, a 4 KiB header block, O_DIRECT
    cmd = [str(exe), str(root), mode, str(chunk), str(n), str(depth), "256", "4096", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"bare_c {mode} failed: {r.stderr.strip()}")
    return float(r.stdout)


async def bare_c_point(exe: Path, root: Path, chunk: int, n: int, depth: int) -> tuple[float, float]:
    """``bare_point`` from C threads (``bench/bare_c.c``): the same calls with no interpreter
    around them, synced at the end, read back cold."""
    w = await asyncio.to_thread(_bare_c, exe, root, "write", chunk, n, depth)
    await asyncio.to_thread(drop_tree, root)
    r = await asyncio.to_thread(_bare_c, exe, root, "read", chunk, n, depth)
    return n * chunk / w, n * chunk / r


def fio_point(root: Path, chunk: int, depth: int, size: int, file_per_block: bool = False) -> tuple[float, float]:
    w = benchkit.run_fio(root, rw="write", bs=chunk, iodepth=depth, size=size, file_per_block=file_per_block)
    r = benchkit.run_fio(root, rw="read", bs=chunk, iodepth=depth, size=size, file_per_block=file_per_block)
    return w.bytes_per_s, r.bytes_per_s


def fs_type(path: Path) -> str:
    """File system type and device of the mount holding ``path`` (from /proc/mounts)."""
    best, kind = "", "?"
    target = str(path.resolve())
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                if (target == mnt or target.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                    best, kind = mnt, f"{fstype} ({dev} on {mnt})"
    except OSError:
        pass
    return kind


def machine(base: Path) -> dict[str, Any]:
    """What the figures were measured on (load average: the machine may be shared)."""
    return {
        "kernel": platform.release(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "fs_type": fs_type(base),
        "dir": str(base),
        "fio": subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip(),
        "loadavg_at_end": os.getloadavg(),
    }


def med(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


async def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(args.dir)
    sizes = [int(s) * KiB for s in args.sizes_kib.split(",")]
    depths = [int(d) for d in args.depths.split(",")]
    total = args.mib * MiB
    # offload from the first half, load into the second; page-aligned, as pinned memory is
    view = allocate_buffer(2 * total, huge_pages=args.pages == "huge")
    fill_random(view[:total])
    points: list[dict[str, Any]] = []
    # "fs" is the default configuration (io_engine="auto"); "fs <engine>" is each other
    # engine that can run here, measured beside it (the one "fs" resolved to is not repeated)
    from asynctier.engines import native as nativeio

    base_cfg: dict[str, Any] = {} if args.engine == "auto" else {"io_engine": args.engine}
    if args.worker_nice is not None:
        base_cfg["worker_nice"] = args.worker_nice
    variants: dict[str, dict[str, Any]] = {"fs": {}}
    why_not = {"native": nativeio.problem(), "threads": None}
    engines_here = [e for e, why in why_not.items() if why is None]
    for engine in engines_here:
        variants[f"fs {engine}"] = {"io_engine": engine}
    everywhere = {"fs", *(f"fs {e}" for e in engines_here)}
    if args.variants:
        variants["fs publish=rename"] = {"publish": "rename"}
        variants["fs lru_times=False"] = {"lru_times": False}
        variants["fs buffered"] = {"direct_io": False}
    load_at_start = os.getloadavg()
    bare_c = None if args.no_bare_c else build_bare_c(base / "bin")
    for chunk in sizes:
        n = total // chunk
        for depth in depths:
            m: dict[str, list[float]] = {}

            def add(name: str, value: float, m: dict[str, list[float]] = m) -> None:
                m.setdefault(name, []).append(value)

            extra: dict[str, Any] = {}
            full_extra: dict[str, Any] = {}
            for _ in range(args.repeat):
                fw, fr = fio_point(fresh(base / "fio"), chunk, depth, total)
                add("fio_write", fw)
                add("fio_read", fr)
                if not args.no_fio_files:
                    fw, fr = fio_point(fresh(base / "fio"), chunk, depth, total, file_per_block=True)
                    add("fio files_write", fw)
                    add("fio files_read", fr)
                for name, cfg in variants.items():
                    if name not in everywhere and not (chunk == sizes[0] and depth == depths[-1]):
                        continue  # variants only at the small-chunk, deep point
                    if cfg.get("io_engine") == extra.get("io_engine") and name != "fs":
                        continue  # what "fs" resolved to: measured already
                    tw, tr, extra_v = await tier_point(fresh(base / "tier"), view, chunk, n, depth, {**base_cfg, **cfg})
                    add(f"{name}_write", tw)
                    add(f"{name}_read", tr)
                    if name == "fs":
                        extra = extra_v
                if not args.no_full:
                    for name, cfg in (("full", {}), ("full recycle=False", {"recycle": False})):
                        fw, extra_f = await full_point(fresh(base / "tier"), view, chunk, n, depth, {**base_cfg, **cfg})
                        add(f"{name}_write", fw)
                        if name == "full":
                            full_extra = extra_f
                if not args.no_idle:
                    iw, _ = await idle_point(fresh(base / "tier"), view, chunk, n, depth, base_cfg)
                    add("after idle_write", iw)
                if not args.no_naive:
                    nw, nr = await naive_point(fresh(base / "naive"), view, chunk, n, depth)
                    add("naive_write", nw)
                    add("naive_read", nr)
                if not args.no_bare:
                    bw, br = await bare_point(fresh(base / "bare"), view, chunk, n, depth)
                    add("bare_write", bw)
                    add("bare_read", br)
                if bare_c is not None:
                    cw, cr = await bare_c_point(bare_c, fresh(base / "bare", spread=True), chunk, n, depth)
                    add("bare C_write", cw)
                    add("bare C_read", cr)
            point: dict[str, Any] = {"chunk_bytes": chunk, "depth": depth, "chunks": n}
            point.update({k: med(v) for k, v in m.items()})
            point["samples"] = m
            point["loadavg_1min"] = os.getloadavg()[0]  # the machine may be shared: say how busy it was
            point["tier_extra"] = extra
            point["full_extra"] = full_extra
            point["io_engine"] = extra.pop("io_engine", None)
            for side in ("write", "read"):
                refs = m[f"fio_{side}"]
                for name in [
                    *variants,
                    "naive",
                    "fio files",
                    "full",
                    "full recycle=False",
                    "after idle",
                    "bare",
                    "bare C",
                ]:
                    if f"{name}_{side}" in point:
                        # paired: each repeat's figure over the fio figure measured next to it
                        pairs = [v / r for v, r in zip(m[f"{name}_{side}"], refs) if r]
                        point[f"{name}_{side}_x_fio"] = med(pairs) if pairs else None
                if f"bare_{side}" in point:
                    pairs = [v / r for v, r in zip(m[f"fs_{side}"], m[f"bare_{side}"]) if r]
                    point[f"fs_{side}_x_bare"] = med(pairs) if pairs else None
                if f"bare_{side}" in point and f"bare C_{side}" in point:
                    pairs = [v / r for v, r in zip(m[f"bare_{side}"], m[f"bare C_{side}"]) if r]
                    point[f"bare_{side}_x_bare C"] = med(pairs) if pairs else None
            points.append(point)
            print(
                f"{chunk // KiB:>5} KiB d={depth:<2}  write {point['fs_write'] / 1e9:.2f} GB/s "
                f"({point['fs_write_x_fio']:.2f}x fio)  read {point['fs_read'] / 1e9:.2f} GB/s "
                f"({point['fs_read_x_fio']:.2f}x fio)",
                flush=True,
            )
    shutil.rmtree(base / "fio", ignore_errors=True)
    shutil.rmtree(base / "tier", ignore_errors=True)
    shutil.rmtree(base / "naive", ignore_errors=True)
    shutil.rmtree(base / "bare", ignore_errors=True)
    shutil.rmtree(base / "bin", ignore_errors=True)
    return {
        "bench": "fs tier",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([".venv/bin/python", "bench/bench_fs.py", *sys.argv[1:]]),
        "machine": {**machine(base), "loadavg_at_start": load_at_start},
        "method": {
            "bytes_per_point": total,
            "primary_buffer_pages": args.pages,
            "repeat": args.repeat,
            "statistic": "median of the repeats; ratios: median of per-repeat ratios (each figure over the "
            "fio figure measured beside it)",
            "tier": "one offload call of all chunks, max_inflight=depth, durability='none', direct_io='auto', "
            "verify=True; timed until syncfs returns; load from a cold page cache",
            "fio": "io_uring, O_DIRECT, sequential, one file, end_fsync=1",
            "full": "offload into a tier at capacity: as many chunks stored first (not timed), then the "
            "same number of new ones, each evicting one (recycling its file by default); timed until "
            "syncfs returns",
            "fio files": "the same, over one file per block (nrfiles, filesize=bs, openfiles=depth; a write "
            "creates each file at its open, create_on_open, inside the timed job): what a file-per-chunk "
            "layout costs here",
            "after idle": "offload into an empty tier with the default engine and tmpfile_pool = chunks "
            "in the point, timed once the pool holds a file per chunk and the disk settled (a burst after "
            "an idle spell, with a pool sized for it); timed until syncfs returns",
            "naive": "benchkit.naive_aiofiles, sync at the end (syncfs), cold read",
            "bare": "benchkit.bare_file_per_chunk: the thread engine's system calls (O_TMPFILE, pwritev of "
            "header block + chunk, linkat, close; open, preadv, close) from depth plain threads over 256 "
            "shards placed apart as the tier's are (FS_TOPDIR_FL on ext4), no tier around them; synced at the "
            "end, cold read. fs x bare: what the tier adds",
            "bare C": "bench/bare_c.c: the same system calls over the same layout from depth C threads (no "
            "interpreter); bare x bare C: what Python threads cost over C ones",
        },
        "points": points,
    }


def markdown(report: dict[str, Any]) -> str:
    def gb(v: float | None) -> str:
        return f"{v / 1e9:.2f}" if v else "-"

    def x(v: float | None) -> str:
        return f"{v:.2f}x" if v is not None else "-"

    lines = [
        f"# fs tier vs fio and a naive loop — {report['date']}",
        "",
        f"`{report['command']}` — {report['machine']['fs_type']} at {report['machine']['dir']}, "
        f"{report['machine']['cpus']} CPUs, kernel {report['machine']['kernel']}, {report['machine']['fio']}; "
        f"median of {report['method']['repeat']} interleaved runs (ratios: median of paired ratios), "
        f"{report['method']['bytes_per_point'] // MiB} MiB per point.",
        "",
        '`fs` is the default configuration (`io_engine="auto"`; the engine it took is in the '
        "third column); `native` and `threads` are the tier with that engine, measured "
        "beside it (`= fs` where it is the one `fs` took). `full`: offloads "
        "into a tier at capacity, each new chunk evicting one (the steady state of a cache), with "
        "evicted files recycled (the default) and with `recycle=False` (new file + unlink). "
        "`after idle`: offloads into an empty tier (default engine) once a pool of files made ahead "
        "holds one per chunk (`tmpfile_pool` = chunks in the point): a burst after an idle spell.",
        "",
    ]
    for side in ("write", "read"):
        full_head = " **full x fio** | full, recycle=False x fio | after idle x fio |" if side == "write" else ""
        lines += [
            f"| chunk | depth | engine | fs {side} GB/s | fio {side} GB/s | **fs x fio** | native x fio "
            "| threads x fio "
            f"| fio files x fio | bare C x fio | bare x fio | bare x bare C | fs x bare | naive x fio |{full_head} "
            "load avg |",
            "| --- " * (15 + (3 if full_head else 0)) + "|",
        ]
        for p in report["points"]:
            engine_cells = " | ".join(
                "= fs" if p.get("io_engine") == e else x(p.get(f"fs {e}_{side}_x_fio")) for e in ("native", "threads")
            )
            lines.append(
                f"| {p['chunk_bytes'] // KiB} KiB | {p['depth']} | {p.get('io_engine')} | {gb(p['fs_' + side])} "
                f"| {gb(p['fio_' + side])} | **{x(p['fs_' + side + '_x_fio'])}** "
                f"| {engine_cells} "
                f"| {x(p.get('fio files_' + side + '_x_fio'))} | {x(p.get('bare C_' + side + '_x_fio'))} "
                f"| {x(p.get('bare_' + side + '_x_fio'))} | {x(p.get('bare_' + side + '_x_bare C'))} "
                f"| {x(p.get('fs_' + side + '_x_bare'))} | {x(p.get('naive_' + side + '_x_fio'))} "
                + (
                    f"| **{x(p.get('full_write_x_fio'))}** | {x(p.get('full recycle=False_write_x_fio'))} "
                    f"| {x(p.get('after idle_write_x_fio'))} "
                    if full_head
                    else ""
                )
                + f"| {p.get('loadavg_1min', 0):.1f} |"
            )
        lines.append("")
    extra = [p for p in report["points"] if any(k.startswith(("fs publish", "fs lru", "fs buffered")) for k in p)]
    if extra:
        lines += ["", "Variants at the small-chunk, deepest point (same run):", ""]
        lines += ["| variant | write x fio | read x fio |", "| --- | --- | --- |"]
        for p in extra:
            names = {k.rsplit("_", 1)[0] for k in p if k.startswith("fs") and k.endswith("_write")}
            for name in sorted(names):
                lines.append(f"| {name} | {x(p.get(f'{name}_write_x_fio'))} | {x(p.get(f'{name}_read_x_fio'))} |")
    lines += [
        "",
        f"Method: tier — {report['method']['tier']}. fio — {report['method']['fio']}. "
        f"naive — {report['method']['naive']}. bare — {report['method']['bare']}. "
        f"bare C — {report['method']['bare C']}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp/asynctier-bench-fs", help="scratch directory on the file system to test")
    ap.add_argument("--sizes-kib", default="256,2048", help="chunk sizes in KiB, comma-separated")
    ap.add_argument("--depths", default="1,4,16", help="depths (max_inflight, fio iodepth), comma-separated")
    ap.add_argument("--mib", type=int, default=256, help="MiB moved per measurement")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved repetitions per point (median reported)")
    ap.add_argument("--variants", action="store_true", help="also measure publish=rename, lru_times=False, buffered")
    ap.add_argument("--no-naive", action="store_true", help="skip the naive aiofiles loop")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare system-call reference")
    ap.add_argument("--no-bare-c", action="store_true", help="skip the bare system calls from C threads")
    ap.add_argument("--no-fio-files", action="store_true", help="skip fio over one file per block")
    ap.add_argument("--no-full", action="store_true", help="skip offloads into a full tier (evicting)")
    ap.add_argument("--no-idle", action="store_true", help="skip offloads after an idle spell (a pool made ahead)")
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    ap.add_argument(
        "--pages",
        choices=("huge", "base"),
        default="huge",
        help="the primary buffer on transparent huge pages (asynctier.buffers.allocate_buffer) or on 4 KiB pages",
    )
    ap.add_argument(
        "--engine",
        choices=("auto", "threads", "native"),
        default="auto",
        help="io_engine of the `fs`, `full` and `after idle` columns (default: the tier's own, 'auto')",
    )
    ap.add_argument(
        "--worker-nice", type=int, default=None, help="worker_nice of every fs tier (default: the tier's own)"
    )
    ap.add_argument("--out", default=str(REPO / "bench" / "results"), help="directory for fs.json and fs.md")
    ap.add_argument("--name", default="fs", help="base name of the result files")
    args = ap.parse_args(argv)
    if not benchkit.fio_available():
        sys.exit("fio is not installed: the figures are ratios of fio")
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    runner: Callable[..., dict[str, Any]] = asyncio.run
    if args.loop == "uvloop":
        import uvloop

        runner = uvloop.run
    report = runner(run(args))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(report, indent=1) + "\n")
    (out / f"{args.name}.md").write_text(markdown(report))
    print(markdown(report))


if __name__ == "__main__":
    main()
