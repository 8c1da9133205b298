"""Benchmark the nvme tier against fio and a naive loop on the same file system, in one run.

    .venv/bin/python bench/bench_nvme.py --dir /var/tmp/asynctier-bench

Figures (all O_DIRECT, same block size and depth as the tier's chunk size and
``max_inflight``):

* 2 MiB chunks, depth 16 and depth 1: offload and load GB/s vs fio's best of io_uring and
  psync (``write``/``read`` jobs, ``end_fsync=1`` on writes). The tier offloads with
  ``durability="none"`` (then one fdatasync, as fio's end_fsync) and with ``"fsync"``
  (every offload acknowledged durable; group commit).
* 64 KiB chunks at depth 16: chunk operations per second vs fio's IOPS; and the same on a
  memory file system (``--ceiling-dir``, default /dev/shm) where the device is never the
  limit: the rate the tier's per-chunk path allows on these CPUs.
* Each tier figure on the threads engine (``io_engine="threads"``: preadv/pwritev on the
  worker threads), the nvme tier's only one.
* The naive loop (:func:`asynctier.benchkit.naive_aiofiles`, one file per chunk), the floor.
* Reopen with 1M slots indexed: a 1M-entry checkpoint plus a full journal generation
  (``checkpoint_every`` records) to replay.

Every repetition measures fio, the naive loop and each tier configuration back to back;
the report gives medians, and ratios are medians of per-repetition ratios.

Writes ``bench/results/nvme.json`` and ``bench/results/nvme.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import mmap
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.cli import benchkit
from asynctier.cli.benchkit import fio_available, run_fio

ROOT = Path(__file__).resolve().parent.parent

# mypy checks tiers/ as the top-level package "tiers": pyproject's package-dir installs it as
# asynctier.tiers, a mapping mypy cannot follow; the same modules, so the same types
if TYPE_CHECKING:
    from tiers.nvme import Checkpoint, NvmeTier, read_checkpoint, write_checkpoint
    from tiers.nvme.format import PUBLISH as _PUBLISH
    from tiers.nvme.format import pack_record as _pack_record
else:
    from asynctier.tiers.nvme import Checkpoint, NvmeTier, read_checkpoint, write_checkpoint
    from asynctier.tiers.nvme.format import PUBLISH as _PUBLISH
    from asynctier.tiers.nvme.format import pack_record as _pack_record

MiB = 1 << 20


def _tier(
    d: Path, chunk: int, nprimary: int, capacity: int, depth: int, **cfg: Any
) -> tuple[NvmeTier, memoryview, OffloadingSpec]:
    spec = OffloadingSpec(chunk, nprimary, namespace="bench/nvme")
    view = memoryview(mmap.mmap(-1, spec.total_bytes))  # page-aligned, as pinned memory is
    for i in range(0, spec.total_bytes, MiB):
        view[i : i + 16] = os.urandom(16)  # touch the pages; content does not matter
    conf = {"type": "nvme", "path": str(d / "bench.slab"), "capacity_bytes": capacity, "max_inflight": depth, **cfg}
    tier = SecondaryTierFactory.create_secondary_tier(conf, view, spec)
    assert isinstance(tier, NvmeTier)
    return tier, view, spec


async def _stream(
    d: Path, chunk: int, depth: int, total: int, durability: str, nprimary: int = 256, io_engine: str = "threads"
) -> dict[str, float]:
    """Offload then load ``total`` bytes of ``chunk``-sized chunks at ``depth``; bytes/s and ops/s."""
    n = total // chunk
    _clean(d, "bench.slab")
    tier, _view, _spec = _tier(
        d, chunk, nprimary, (n + 64) * (chunk + 4096) + 8192, depth, durability=durability, io_engine=io_engine
    )
    keys = [b"bench-%09d" % i for i in range(n)]
    async with tier:
        assert tier.active_io_engine == io_engine
        # warm the slots once (fallocated extents are written for the first time otherwise,
        # which costs an extent conversion fio's laid-out file does not pay)
        await _offload_all(tier, [b"warm-%09d" % i for i in range(n)], nprimary)
        await tier.remove([b"warm-%09d" % i for i in range(n)])
        t0 = time.perf_counter()
        await _offload_all(tier, keys, nprimary)
        if durability == "none":
            for fd in tier._slabs.fds:  # what fio's end_fsync does
                os.fdatasync(fd)
        t_off = time.perf_counter() - t0
        t0 = time.perf_counter()
        # every call at once: the tier's bound keeps `depth` chunk I/Os running, as fio keeps
        # its queue full (calls awaited in waves left the device idle at each wave's tail)
        calls = [
            tier.load(keys[i : i + nprimary], list(range(len(keys[i : i + nprimary])))) for i in range(0, n, nprimary)
        ]
        results = await asyncio.gather(*calls)
        t_load = time.perf_counter() - t0
        assert all(r.ok for r in results), [r.failed for r in results if not r.ok][:1]
        s = tier.stats()
        assert s.extra.get("bounce_copies", 0) == 0
    return {
        "offload_Bps": n * chunk / t_off,
        "load_Bps": n * chunk / t_load,
        "offload_ops": n / t_off,
        "load_ops": n / t_load,
        "chunks": n,
    }


async def _offload_all(tier: NvmeTier, keys: list[bytes], nprimary: int) -> None:
    res = await asyncio.gather(
        *(
            tier.offload(keys[i : i + nprimary], [j % nprimary for j in range(len(keys[i : i + nprimary]))])
            for i in range(0, len(keys), nprimary)
        )
    )
    assert all(r.ok for r in res), [r.failed for r in res if not r.ok][:1]


async def _reopen(d: Path, nslots: int, replay: int) -> dict[str, float]:
    """Reopen time with ``nslots`` entries in a checkpoint plus ``replay`` journal records."""
    slab = d / "reopen.slab"
    _clean(d, "reopen.slab")
    chunk = 4096
    spec = OffloadingSpec(chunk, 8, namespace="bench/nvme")
    view = memoryview(mmap.mmap(-1, spec.total_bytes))
    cfg = {"type": "nvme", "path": str(slab), "capacity_bytes": 4096 + 8192 * nslots, "preallocate": False}
    tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
    async with tier:
        pass
    ck_path = slab.with_name(slab.name + ".atidx.ckpt")
    ck = read_checkpoint(ck_path)
    assert ck is not None
    entries = [(b"%032x" % i, i) for i in range(nslots)]  # 16-byte prefix hashes, as hex
    ck = Checkpoint.from_lru(ck.slab_id, ck.gen, nslots, entries)
    write_checkpoint(ck_path, ck)
    # a full journal generation of republished keys to replay
    _append_journal(d, b"".join(_pack_record(_PUBLISH, b"%032x" % i, i, 1, 0) for i in range(replay)))
    tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
    t0 = time.perf_counter()
    await tier.open()
    t_open = time.perf_counter() - t0
    n = tier.stats().stored_chunks
    t0 = time.perf_counter()
    await tier.aclose()
    t_close = time.perf_counter() - t0
    assert n == nslots, n
    return {"slots": nslots, "replayed_records": replay, "open_s": t_open, "close_checkpoint_s": t_close}


def _clean(d: Path, name: str) -> None:
    for p in d.glob(name + "*"):
        p.unlink()


def _append_journal(d: Path, data: bytes) -> None:
    journal = sorted(d.glob("reopen.slab.atidx.journal.*"))[-1]
    with open(journal, "ab") as f:
        f.write(data)


def _fio_best(d: Path, rw: str, bs: int, depth: int, size: int) -> dict[str, Any]:
    """fio with each engine; ``best_*`` is the faster engine's figures (the physical limit)."""
    out: dict[str, Any] = {}
    for engine in ("io_uring", "psync"):
        try:
            r = run_fio(d / "fio", rw=rw, bs=bs, iodepth=depth, size=size, ioengine=engine)
        except Exception as e:  # an engine this kernel or fio lacks
            out[engine] = {"error": repr(e)}
            continue
        out[engine] = {"Bps": r.bytes_per_s, "iops": r.iops}
    ok = [(v["Bps"], k) for k, v in out.items() if "Bps" in v]
    best = max(ok) if ok else (0.0, "none")
    out["best_Bps"], out["best_engine"] = best
    out["best_iops"] = out[best[1]]["iops"] if ok else 0.0
    return out


async def _naive(d: Path, chunk: int, depth: int, total: int, nprimary: int) -> dict[str, float]:
    """The floor: :func:`benchkit.naive_aiofiles`, one file per chunk (a bytes() copy each),
    synced at the end and read back cold, as ``asynctier bench`` measures it."""
    nd = d / "naive"
    shutil.rmtree(nd, ignore_errors=True)
    n = total // chunk
    view = memoryview(mmap.mmap(-1, chunk * nprimary))
    t0 = time.perf_counter()
    await benchkit.naive_aiofiles(nd, view, chunk, n, depth=depth, mode="write", sync="none")
    benchkit.sync_tree(nd)
    t_w = time.perf_counter() - t0
    benchkit.drop_tree_cache(nd)
    t0 = time.perf_counter()
    await benchkit.naive_aiofiles(nd, view, chunk, n, depth=depth, mode="read")
    t_r = time.perf_counter() - t0
    shutil.rmtree(nd, ignore_errors=True)
    benchkit.settle(d)  # the deleted files' discards land before the next contender
    return {"offload_Bps": n * chunk / t_w, "load_Bps": n * chunk / t_r}


def _o_direct_ok(d: Path) -> bool:
    """Whether ``d`` exists and accepts O_DIRECT opens (tmpfs does from Linux 6.6)."""
    if not d.is_dir():
        return False
    p = d / ".asynctier-odirect-probe"
    try:
        fd = os.open(p, os.O_RDWR | os.O_CREAT | getattr(os, "O_DIRECT", 0), 0o600)
    except OSError:
        return False
    os.close(fd)
    p.unlink()
    return hasattr(os, "O_DIRECT")


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _summarise(reps: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Medians over repetitions; ratios are medians of per-repetition ratios (each tier run
    divided by the fio and naive runs measured next to it), so drift hits both sides."""
    out: dict[str, Any] = {}
    for m in ("offload_Bps", "load_Bps", "offload_ops", "load_ops"):
        out[m] = _median([r[key][m] for r in reps])
        out[m + "_all"] = [r[key][m] for r in reps]
    for m, job in (("offload", "fio_write"), ("load", "fio_read")):
        out[f"{m}_x_fio"] = _median([r[key][f"{m}_Bps"] / r[job]["best_Bps"] for r in reps if r[job]["best_Bps"]])
        out[f"{m}_x_naive"] = _median(
            [r[key][f"{m}_Bps"] / r["naive"][f"{m}_Bps"] for r in reps if r.get("naive", {}).get(f"{m}_Bps")]
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp/asynctier-bench", help="scratch directory (the file system tested)")
    ap.add_argument("--gib", type=float, default=1.0, help="GiB moved per 2 MiB depth-16 run (depth 1: a quarter)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions, each: fio, naive, then the tier")
    ap.add_argument("--small-ops", type=int, default=20000, help="64 KiB chunks per small-chunk run")
    ap.add_argument("--slots", type=int, default=1 << 20, help="slots indexed for the reopen figure")
    ap.add_argument(
        "--ceiling-dir",
        default="/dev/shm",
        help="a memory file system for the 64 KiB CPU-ceiling point ('' to skip; needs O_DIRECT there)",
    )
    ap.add_argument("--no-naive", action="store_true", help="skip the naive aiofiles baseline")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    total = int(args.gib * (1 << 30))
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release(), "python": platform.python_version()},
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "dir": str(d),
        "fio": fio_available(),
        "reps": args.reps,
        "command": " ".join([sys.executable, *sys.argv]),
    }
    runs: list[dict[str, Any]] = []
    small = 64 * 1024
    configs = [(2 * MiB, 16, total, 64), (2 * MiB, 1, total // 4, 64), (small, 16, args.small_ops * small, 256)]
    engines = ["threads"]
    for chunk, depth, size, nprimary in configs:
        # The disk is shared and noisy: each repetition measures fio, the naive loop and every
        # tier configuration back to back; ratios pair each tier run with its neighbours.
        reps: list[dict[str, Any]] = []
        for rep in range(args.reps):
            r: dict[str, Any] = {
                "fio_write": _fio_best(d, "write", chunk, depth, size),
                "fio_read": _fio_best(d, "read", chunk, depth, size),
            }
            if not args.no_naive:
                r["naive"] = asyncio.run(_naive(d, chunk, depth, size, nprimary))
            for durability in ("none", "fsync"):
                for engine in engines:
                    t = asyncio.run(_stream(d, chunk, depth, size, durability, nprimary=nprimary, io_engine=engine))
                    r[f"{durability}/{engine}"] = t
                    print(f"rep {rep}: {chunk >> 10} KiB depth {depth} {durability} {engine}: {t}", flush=True)
            reps.append(r)
        for durability in ("none", "fsync"):
            for engine in engines:
                runs.append(
                    {
                        "chunk": chunk,
                        "depth": depth,
                        "durability": durability,
                        "io_engine": engine,
                        **_summarise(reps, f"{durability}/{engine}"),
                        "fio_write_Bps": _median([r["fio_write"]["best_Bps"] for r in reps]),
                        "fio_read_Bps": _median([r["fio_read"]["best_Bps"] for r in reps]),
                        "fio_write_iops": _median([r["fio_write"]["best_iops"] for r in reps]),
                        "fio_write_all": [r["fio_write"] for r in reps],
                        "fio_read_all": [r["fio_read"] for r in reps],
                        "naive_all": [r.get("naive") for r in reps],
                    }
                )
    results["runs"] = runs
    ceiling = Path(args.ceiling_dir) / "asynctier-bench-nvme" if args.ceiling_dir else None
    if ceiling is not None and _o_direct_ok(ceiling.parent):
        # A device that is never the limit: what the tier's per-chunk path itself allows.
        ceiling.mkdir(exist_ok=True)
        try:
            pts = []
            for _ in range(args.reps):
                fio = _fio_best(ceiling, "write", small, 16, args.small_ops * small)
                t = asyncio.run(_stream(ceiling, small, 16, args.small_ops * small, "none", nprimary=256))
                pts.append({"fio": fio, "tier": t})
                shutil.rmtree(ceiling / "fio", ignore_errors=True)
            results["ceiling"] = {
                "dir": str(ceiling.parent),
                "offload_ops": _median([p["tier"]["offload_ops"] for p in pts]),
                "load_ops": _median([p["tier"]["load_ops"] for p in pts]),
                "fio_write_iops": _median([p["fio"]["best_iops"] for p in pts]),
                "all": pts,
            }
        finally:
            shutil.rmtree(ceiling, ignore_errors=True)
    reopens = [asyncio.run(_reopen(d, args.slots, 1 << 16)) for _ in range(args.reps)]
    results["reopen"] = min(reopens, key=lambda r: r["open_s"])
    results["reopen"]["open_s_all"] = [r["open_s"] for r in reopens]
    shutil.rmtree(d / "fio", ignore_errors=True)
    for p in d.glob("*.slab*"):
        p.unlink()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "nvme.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "nvme.md").write_text(_markdown(results))
    print(_markdown(results))


def _markdown(r: dict[str, Any]) -> str:
    g = 1e9

    def x(v: float) -> str:
        return f"{v:.2f}x" if v else "-"

    lines = [
        f"# nvme tier vs fio and a naive loop — {r.get('date', '')}",
        "",
        f"Directory `{r['dir']}`, {r['machine']['cpus']} CPUs, kernel {r['machine']['kernel']}, "
        f"Python {r['machine']['python']}. Command: `{r['command']}`",
        "",
        f"Medians of {r['reps']} repetitions; each repetition runs fio (io_uring and psync: `fio` is the "
        "faster of the two, O_DIRECT, same block size and depth), the naive loop and every tier "
        "configuration back to back, and a ratio divides a tier run by the fio (or naive) run of its "
        "own repetition, so the disk's drift hits both sides. Tier engine (`io_engine`): `threads` = "
        "preadv/pwritev on the worker threads.",
        "",
        "| chunk | depth | durability | tier engine | offload GB/s | fio write GB/s | **x fio** | x naive | "
        "load GB/s | fio read GB/s | **x fio** | x naive | offload ops/s | load ops/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in r["runs"]:
        kb = t["chunk"] // 1024
        size = f"{kb // 1024} MiB" if kb >= 1024 else f"{kb} KiB"
        lines.append(
            f"| {size} | {t['depth']} | {t['durability']} | {t['io_engine']} | {t['offload_Bps'] / g:.2f} | "
            f"{t['fio_write_Bps'] / g:.2f} | **{x(t['offload_x_fio'])}** | {x(t['offload_x_naive'])} | "
            f"{t['load_Bps'] / g:.2f} | {t['fio_read_Bps'] / g:.2f} | **{x(t['load_x_fio'])}** | "
            f"{x(t['load_x_naive'])} | {t['offload_ops']:,.0f} | {t['load_ops']:,.0f} |"
        )
    lines += ["", "fio per engine, GB/s, each repetition:", "", "| chunk | depth | job | io_uring | psync |"]
    lines.append("| --- | --- | --- | --- | --- |")
    seen = set()
    for t in r["runs"]:
        for job in ("fio_write", "fio_read"):
            k = (t["chunk"], t["depth"], job)
            if k in seen:
                continue
            seen.add(k)
            cells = [
                ", ".join(f"{f[e]['Bps'] / g:.2f}" if "Bps" in f[e] else "n/a" for f in t[job + "_all"])
                for e in ("io_uring", "psync")
            ]
            lines.append(f"| {t['chunk'] // 1024} KiB | {t['depth']} | {job[4:]} | {cells[0]} | {cells[1]} |")
    lines += [
        "",
        "Notes: offload with `durability=none` ends with one fdatasync of the slab (as fio's `end_fsync=1`); "
        "`fsync` acknowledges every chunk durable (slab then journal fdatasync, group commit). Every load "
        "verifies the slot header and the payload's xxh3. 64 KiB calls are coalesced (16 chunks per job, "
        "one pwritev/preadv per run of adjacent slots). The naive loop is "
        "`benchkit.naive_aiofiles` (one file per chunk, a bytes() copy per write, synced at the end, read "
        "cold).",
    ]
    c = r.get("ceiling")
    if c:
        lines += [
            "",
            f"CPU ceiling (64 KiB, depth 16, threads, `durability=none`, slab on `{c['dir']}`, a memory file "
            "system that O_DIRECT copies to: the device is never the limit, so this is what the tier's "
            f"per-chunk path allows on these CPUs): **{c['offload_ops']:,.0f} offloads/s**, "
            f"{c['load_ops']:,.0f} loads/s; fio on the same file system: {c['fio_write_iops']:,.0f} writes/s.",
        ]
    ro = r["reopen"]
    lines += [
        "",
        f"Reopen with {ro['slots']:,} slots indexed (checkpoint) + {ro['replayed_records']:,} journal records "
        f"replayed: **{ro['open_s']:.2f} s** (best of {len(ro['open_s_all'])}: "
        f"{', '.join(f'{v:.2f}' for v in ro['open_s_all'])}); the closing checkpoint of that index took "
        f"{ro['close_checkpoint_s']:.2f} s.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
