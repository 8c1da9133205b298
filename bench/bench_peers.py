"""The project's fs and nvme tiers beside fio and naive file-per-chunk loops, in one run.

For each block (chunk size x depth) and each repeat, two physical limits (bench/peers_fio.py)
are measured *before and after* the block: ``fio`` (one file) and ``fio-files`` (one file per
chunk, each created inside the timed job), both O_DIRECT at the same block size and depth,
best of io_uring/libaio/psync. Between them every contender runs, in an order that rotates
with the repeat, each into an empty directory once the device has gone quiet:

* ``fs-native``, ``fs-threads``: the fs tier on each engine (checksums and capacity on);
* ``nvme``: the nvme slab tier;
* ``aiofiles``: a naive loop, one file per chunk, ``aiofiles`` open/write/close, ``depth``
  at a time;
* ``os-threads``: a naive loop, one file per chunk, plain ``open``/``os.write``/``close``
  (reads: ``os.read``) on a pool of ``depth`` threads.

Each writes ``--mib`` of chunks, then the data is made durable (``syncfs``, as fio's
``end_fsync``), dropped from the page cache, and read back (cold). A figure is bytes/s
divided by the mean of a baseline's before and after (``x fio``, ``x fio-files``); the
median over repeats is printed, with each tier's CPU per chunk (loop thread, whole process)
and how many chunks made their own file (the fs tier's pool of files made ahead was empty).
A tier contender takes knobs of its config to isolate a cost: ``fs-native/tmpfile_pool=0``,
``fs-threads/publish=rename``; ``--fio-engines ''`` runs the tiers alone (profiling).
vLLM's own fs tier is not run here (it is not a dependency); its I/O pattern is described in
docs/benchmarks.md.

Run from the repository root (one command, minutes; use a directory on the disk to test)::

    .venv/bin/python bench/bench_peers.py --dir /mnt/nvme/peers   # 64/256/2048 KiB x depth 1/4/16
    .venv/bin/python bench/bench_peers.py --dir /tmp/peers --sizes-kib 256 --depths 16 --mib 64 --repeat 1

Writes ``--json`` if given. Figures from a machine with other work running are noisy:
compare ratios within one run, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import resource
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from peers_fio import SETTLE_S, Block, measure_baselines, ratio_tables

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.buffers import allocate_buffer
from asynctier.cli import benchkit

CONTENDERS = ("fs-native", "fs-threads", "nvme", "aiofiles", "os-threads")


#: every contender's primary buffer on transparent huge pages (--pages huge, the default: as
#: asynctier.buffers.allocate_buffer makes it), or on 4 KiB pages (--pages base)
HUGE_PAGES = True


def _view(nbytes: int) -> memoryview:
    view = allocate_buffer(nbytes, huge_pages=HUGE_PAGES)  # page-aligned, as pinned memory is
    block = os.urandom(min(nbytes, 1 << 20))
    for off in range(0, nbytes, len(block)):
        view[off : off + len(block)] = block[: nbytes - off]
    return view


def _durable_and_cold(directory: Path) -> None:
    benchkit.sync_tree(directory)
    benchkit.drop_tree_cache(directory)


def _process_cpu() -> float:
    """User + system CPU seconds of this process, every thread (the C workers too)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def inode_cost_us(directory: Path, files: int = 200) -> float:
    """CPU (kernel) microseconds per new inode made here now: ``O_TMPFILE`` files, made and closed.

    A file per chunk pays one; its cost varies with the file system's state (on ext4 without a
    journal the allocator skips inodes freed in the last minutes one by one, so it grows
    with recent deletions, the bench's own included): printed per block, beside the ratios.
    """
    directory.mkdir(parents=True, exist_ok=True)
    dfd = os.open(directory, os.O_RDONLY)
    fds: list[int] = []
    try:
        t = time.thread_time()
        for _ in range(files):
            fds.append(os.open(".", getattr(os, "O_TMPFILE", 0) | os.O_WRONLY, 0o600, dir_fd=dfd))
        return (time.thread_time() - t) / files * 1e6
    except OSError:
        return float("nan")  # no O_TMPFILE here
    finally:
        for fd in fds:
            os.close(fd)
        os.close(dfd)


async def _tier_run(
    kind: str, knobs: dict[str, Any], workdir: Path, chunk: int, depth: int, n: int
) -> dict[str, float]:
    slots = max(4 * depth, 64)
    spec = OffloadingSpec(chunk, slots, namespace="bench/peers")
    view = _view(spec.total_bytes)
    config: dict[str, Any] = {"max_inflight": depth, "capacity_bytes": (n + slots) * (chunk + 4096)}
    if kind.startswith("fs"):
        config.update(type="fs", root=str(workdir), io_engine=kind.split("-")[1])
    else:
        config.update(type="nvme", path=str(workdir / "slab"))
    config.update(knobs)
    tier = SecondaryTierFactory.create_secondary_tier(config, view, spec)
    keys = [b"peer-%d" % i for i in range(n)]
    batch = max(1, min(32, depth * 2))
    out: dict[str, float] = {}
    async with tier:

        async def stream(op: str) -> None:
            sem = asyncio.Semaphore(max(1, depth // batch) + 1)  # enough calls in flight to fill the depth

            async def one(i: int) -> None:
                ks = keys[i : i + batch]
                async with sem:
                    res = await getattr(tier, op)(ks, [(i + j) % slots for j in range(len(ks))])
                if res.failed:
                    raise RuntimeError(f"{kind} {op}: {next(iter(res.failed.values()))!r}")

            await asyncio.gather(*(one(i) for i in range(0, n, batch)))

        # the namespace's 256 shard directories, made at open, reach the disk before the clock
        # starts: else the timed syncfs writes them, a one-time cost of a new namespace
        await asyncio.to_thread(benchkit.sync_tree, workdir)
        cpu0, proc0, t0 = time.thread_time(), _process_cpu(), time.perf_counter()
        await stream("offload")
        t_sync = time.perf_counter()
        await asyncio.to_thread(benchkit.sync_tree, workdir)
        out["write"] = n * chunk / (time.perf_counter() - t0)
        # syncfs flushes the whole file system: others' dirty data too, on a shared machine
        out["write_sync_share"] = (time.perf_counter() - t_sync) / (time.perf_counter() - t0)
        out["write_loop_us"] = (time.thread_time() - cpu0) / n * 1e6
        out["write_cpu_us"] = (_process_cpu() - proc0) / n * 1e6
        # chunks that made their own file (not one made ahead by the tier's pool)
        out["pool_empty"] = float(tier.stats().extra.get("tmpfile_pool_empty", 0))
        await asyncio.to_thread(benchkit.drop_tree_cache, workdir)
        cpu0, proc0, t0 = time.thread_time(), _process_cpu(), time.perf_counter()
        await stream("load")
        out["read"] = n * chunk / (time.perf_counter() - t0)
        out["read_loop_us"] = (time.thread_time() - cpu0) / n * 1e6
        out["read_cpu_us"] = (_process_cpu() - proc0) / n * 1e6
    return out


def _os_threads(workdir: Path, chunk: int, depth: int, n: int) -> dict[str, float]:
    """One file per chunk with plain os calls on ``depth`` threads (no header, no checksum)."""
    view = _view(max(4 * depth, 64) * chunk)
    slots = view.nbytes // chunk
    workdir.mkdir(parents=True, exist_ok=True)

    def write(i: int) -> None:
        fd = os.open(workdir / f"naive-{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, view[(i % slots) * chunk : (i % slots + 1) * chunk])
        finally:
            os.close(fd)

    def read(i: int) -> None:
        fd = os.open(workdir / f"naive-{i}", os.O_RDONLY)
        try:
            data = os.read(fd, chunk)
        finally:
            os.close(fd)
        view[(i % slots) * chunk : (i % slots) * chunk + len(data)] = data

    out: dict[str, float] = {}
    with ThreadPoolExecutor(depth) as pool:
        t0 = time.perf_counter()
        list(pool.map(write, range(n)))
        benchkit.sync_tree(workdir)
        out["write"] = n * chunk / (time.perf_counter() - t0)
        benchkit.drop_tree_cache(workdir)
        t0 = time.perf_counter()
        list(pool.map(read, range(n)))
        out["read"] = n * chunk / (time.perf_counter() - t0)
    return out


async def _aiofiles(workdir: Path, chunk: int, depth: int, n: int) -> dict[str, float]:
    view = _view(max(4 * depth, 64) * chunk)
    t0 = time.perf_counter()
    await benchkit.naive_aiofiles(workdir, view, chunk, n, depth=depth, mode="write", sync="none")
    await asyncio.to_thread(benchkit.sync_tree, workdir)
    out = {"write": n * chunk / (time.perf_counter() - t0)}
    await asyncio.to_thread(benchkit.drop_tree_cache, workdir)
    out["read"] = await benchkit.naive_aiofiles(workdir, view, chunk, n, depth=depth, mode="read")
    return out


def run_contender(
    spec: str, workdir: Path, chunk: int, depth: int, n: int, settle_s: float = SETTLE_S
) -> dict[str, float]:
    name, knobs = parse_contender(spec)
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    # the previous contenders' garbage freed now, not by a collection inside this one's timed
    # phases (collections that freed earlier contenders' 128 MiB buffers took 22-108 ms of the
    # loop thread in nvme's 2 MiB writes; docs/benchmarks-issue-28.md, twenty-first pass)
    gc.collect()
    benchkit.settle(workdir, limit_s=settle_s)  # the previous contender's deletions land first
    try:
        if name == "os-threads":
            return _os_threads(workdir, chunk, depth, n)
        if name == "aiofiles":
            return asyncio.run(_aiofiles(workdir, chunk, depth, n))
        return asyncio.run(_tier_run(name, knobs, workdir, chunk, depth, n))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def parse_contender(spec: str) -> tuple[str, dict[str, Any]]:
    """``"fs-native/verify=false/tmpfile_pool=0"`` -> ("fs-native", {"verify": False, "tmpfile_pool": 0}):
    a tier contender with knobs of its config changed, to isolate where its time goes."""
    name, *knobs = spec.split("/")
    if name not in CONTENDERS:
        raise ValueError(f"unknown contender {name!r}; accepted: {', '.join(CONTENDERS)}")
    if knobs and name not in ("fs-native", "fs-threads", "nvme"):
        raise ValueError(f"{name!r} takes no knobs (only the tiers do); got {spec!r}")
    config: dict[str, Any] = {}
    for knob in knobs:
        key, sep, text = knob.partition("=")
        if not sep or not key:
            raise ValueError(f"a knob is key=value; got {knob!r} in {spec!r}")
        value: Any = {"true": True, "false": False, "none": None}.get(text.lower(), text)
        config[key] = int(text) if text.lstrip("-").isdigit() else value
    return name, config


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="scratch directory on the disk to measure (emptied)")
    ap.add_argument("--sizes-kib", default="64,256,2048")
    ap.add_argument("--depths", default="1,4,16")
    ap.add_argument("--mib", type=int, default=64, help="data written (then read) per contender per run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help="comma-separated; a tier takes knobs of its config: fs-native/verify=false/tmpfile_pool=0",
    )
    ap.add_argument("--fio-engines", default="io_uring,libaio,psync", help="'' for no fio (profiling a tier)")
    ap.add_argument(
        "--settle-s",
        type=float,
        default=SETTLE_S,
        help="longest wait for the device to go quiet before each timed write (0: only sync)",
    )
    ap.add_argument(
        "--pages",
        choices=("huge", "base"),
        default="huge",
        help="the contenders' primary buffer on transparent huge pages or on 4 KiB pages (docs/configuration.md)",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    global HUGE_PAGES
    HUGE_PAGES = args.pages == "huge"
    base = Path(args.dir)
    contenders = args.contenders.split(",")
    for spec in contenders:
        try:
            parse_contender(spec)
        except ValueError as e:
            ap.error(str(e))
    fio = [e for e in args.fio_engines.split(",") if e] if benchkit.fio_available() else []
    if not fio:
        print("no fio (not found, or --fio-engines ''): GB/s only, no ratios", flush=True)
    blocks: list[Block] = []
    for kib in (int(k) for k in args.sizes_kib.split(",")):
        chunk = kib << 10
        n = max(1, (args.mib << 20) // chunk)
        for depth in (int(d) for d in args.depths.split(",")):
            blk = Block(kib, depth)
            for rep in range(args.repeat):
                before = measure_baselines(base / "fio", fio, chunk, depth, n * chunk, args.settle_s) if fio else {}
                blk.note("inode_us", inode_cost_us(base / "inode-probe"))
                order = contenders[rep % len(contenders) :] + contenders[: rep % len(contenders)]
                got = {
                    c: run_contender(c, base / f"c{contenders.index(c)}", chunk, depth, n, args.settle_s) for c in order
                }
                after = measure_baselines(base / "fio", fio, chunk, depth, n * chunk, args.settle_s) if fio else {}
                blk.add_fio(before)
                blk.add_fio(after)
                for c, r in got.items():
                    blk.add(c, r, before, after)
                if fio:
                    unit = "write x fio-files"
                    last = "  ".join(
                        f"{c} {blk.ratios.get((c, 'write', 'fio-files'), [0])[-1]:.2f}" for c in contenders
                    )
                else:
                    unit = "write GB/s"
                    last = "  ".join(f"{c} {got[c]['write'] / 1e9:.2f}" for c in contenders)
                print(f"[{kib} KiB depth {depth} rep {rep + 1}] {unit}: {last}", flush=True)
            blocks.append(blk)
    print("\n".join(ratio_tables(blocks, contenders, args.repeat)))
    tiers = [c for c in contenders if c.startswith(("fs-", "nvme"))]
    cpu_tables(blocks, tiers)
    if args.json:
        with open(args.json, "w") as fh:
            results = {f"{b.kib}KiB-d{b.depth}": b.as_json() for b in blocks}
            json.dump({"args": vars(args), "results": results, "machine": benchkit.machine_info()}, fh, indent=1)
    return 0


def cpu_tables(blocks: list[Block], tiers: list[str]) -> None:
    """Where the tiers' CPU goes, per chunk, medians of the repeats."""

    def med(blk: Block, key: str) -> float:
        values = blk.extra.get(key)
        return statistics.median(values) if values else 0.0

    print()
    print("loop-thread CPU per chunk (us), write / read")
    for b in blocks:
        cells = " | ".join(
            f"{c} {med(b, f'{c} write_loop_us'):5.1f} / {med(b, f'{c} read_loop_us'):5.1f}" for c in tiers
        )
        print(f"{b.kib:5} {b.depth:5} | {cells}")
    print()
    print("process CPU per chunk (us, every thread), write / read; chunks not served by the pool of files made ahead;")
    print("kernel CPU per new inode here (us)")
    for b in blocks:
        cells = " | ".join(
            f"{c} {med(b, f'{c} write_cpu_us'):6.1f} / {med(b, f'{c} read_cpu_us'):5.1f} "
            f"({med(b, f'{c} pool_empty'):.0f})"
            for c in tiers
        )
        print(f"{b.kib:5} {b.depth:5} | {cells} | inode {med(b, 'inode_us'):6.1f}")


if __name__ == "__main__":
    sys.exit(main())
