"""CPU per chunk of the ``chain`` tier against its member tiers alone.

A chain copies each chunk between the caller's buffer and its staging buffer and runs its
member tiers over that staging buffer, with background lanes for write-back. This measures
what that costs in CPU: ``streams`` callers store ``chunks`` chunks in calls of ``batch``,
then load them back, through ``memory`` alone, ``fs`` alone, a chain of memory alone
(``chain-memory``) and chains ``memory -> fs`` written back and written through (and
``lower``: loads that miss memory, so fs serves and promotes), after an untimed warm-up round
of other keys. For each it reports the event-loop thread's CPU (``time.thread_time`` on the
loop thread) and the whole process's CPU (``time.process_time``: every thread, the tiers'
workers and copy threads too) per chunk. A store's figures run until ``drain()`` returns, so
the background write-back is counted. ``copy`` is one ``memcpy`` of a chunk between buffers
larger than the caches, the price of staging each way. Points run interleaved, the median of
the repeats is reported.

Run from the repository root: ``.venv/bin/python bench/bench_chain_cpu.py`` (``--help`` for
options; ``--profile POINT`` prints where the time goes, per thread with yappi on CPU clock if
installed, else the loop thread with cProfile). Only the public API is used, so the same
command measures an older checkout: ``git archive OLD | tar -x -C /tmp/old; ln -s ../tiers
/tmp/old/asynctier/tiers; PYTHONPATH=/tmp/old .venv/bin/python bench/bench_chain_cpu.py``.
On a busy machine CPU time still grows with cache misses and preemption: compare checkouts
run after run in one sitting.
"""

from __future__ import annotations

import argparse
import mmap
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

import anyio
from bench_loop_cpu import stream
from rows_json import write_rows

from asynctier import OffloadingSpec, SecondaryTierFactory

# mypy checks tiers/ as the top-level package "tiers": pyproject's package-dir installs it as
# asynctier.tiers, a mapping mypy cannot follow; the same modules, so the same types
if TYPE_CHECKING:
    from tiers.chain import ChainTier
else:
    from asynctier.tiers.chain import ChainTier

BACKENDS: dict[str, tuple[str, dict[str, Any]]] = {
    "asyncio": ("asyncio", {}),
    "uvloop": ("asyncio", {"use_uvloop": True}),
    "trio": ("trio", {}),
}
#: Point name -> how to build it (``lower``: the chain's memory tier is emptied before the load).
#: --background-batch (None: the chain's default)
BACKGROUND_BATCH: int | None = None
POINTS = ("memory", "fs", "chain-memory", "back", "through", "lower")


def _config(point: str, root: str, depth: int, chunks: int, chunk: int, chain_depth: int) -> dict[str, Any]:
    capacity = (chunks + 64) * (chunk + 4096)
    memory = {"type": "memory", "capacity_bytes": capacity, "max_inflight": depth}
    fs = {"type": "fs", "root": root, "max_inflight": depth}
    if point == "memory":
        return memory
    if point == "fs":
        return fs
    if point == "chain-memory":
        return {"type": "chain", "tiers": [memory], "max_inflight": chain_depth}
    write = "back" if point == "back" else "through"  # lower: fs must hold every chunk
    lanes = {"background_batch": BACKGROUND_BATCH} if BACKGROUND_BATCH else {}
    # a backlog that holds every chunk: a write-back dropped for want of room would cost nothing
    return {"type": "chain", "tiers": [memory, fs], "write": write, "max_inflight": chain_depth,
            "backlog_chunks": chunks, **lanes}  # fmt: skip


def _view(nbytes: int) -> memoryview:
    buf = mmap.mmap(-1, nbytes)  # page-aligned, as pinned memory is
    buf.write(os.urandom(nbytes))
    return memoryview(buf)


def _copy_us(chunk: int) -> float:
    """One chunk's memcpy between buffers larger than the CPU's caches (as staging and the
    caller's buffer are): the price of staging, each way."""
    n = max(8, (64 << 20) // chunk)
    src, dst = _view(chunk * n), memoryview(bytearray(chunk * n))
    dst[:] = src  # touch every page first
    t0 = time.thread_time()
    for j in range(n):
        dst[j * chunk : (j + 1) * chunk] = src[j * chunk : (j + 1) * chunk]
    return (time.thread_time() - t0) / n * 1e6


async def measure(point: str, root: str, chunk: int, chunks: int, batch: int, streams: int, depth: int,
                  chain_depth: int, profile: bool = False) -> dict[str, Any]:  # fmt: skip
    slots = batch * streams
    spec = OffloadingSpec(chunk, slots, namespace="bench/chain-cpu")
    view = _view(spec.total_bytes)
    tier = SecondaryTierFactory.create_secondary_tier(
        _config(point, root, depth, chunks, chunk, chain_depth), view, spec
    )
    keys = [b"chain-cpu-%d" % i for i in range(chunks)]
    loop_thread = threading.get_ident()
    out: dict[str, Any] = {}
    async with tier:
        # a warm-up round of other keys, untimed: a server's chain runs with its staging pages
        # (and the tiers' memory) touched long ago, so first-touch page faults are not its cost
        warm = [b"chain-cpu-warm-%d" % i for i in range(chunks)]
        for op in ("offload", "load"):
            await stream(tier, op, warm, slots, batch, streams)
        await tier.drain()
        await tier.remove(warm)
        for op in ("offload", "load"):
            if op == "load" and point == "lower":  # memory misses: fs serves, memory is promoted into
                assert isinstance(tier, ChainTier)
                await tier.member("memory").tier.remove(keys)
            profiler = _start_profile() if profile else None
            loop0, cpu0, t0 = time.thread_time(), time.process_time(), time.perf_counter()
            await stream(tier, op, keys, slots, batch, streams)
            await tier.drain()
            loop, cpu = time.thread_time() - loop0, time.process_time() - cpu0
            wall = time.perf_counter() - t0
            assert threading.get_ident() == loop_thread
            if profiler is not None:
                out[f"{op}_profile"] = _stop_profile(profiler)
            gbps = chunks * chunk / wall / 1e9
            out[op] = {"loop_us": loop / chunks * 1e6, "cpu_us": cpu / chunks * 1e6, "gbps": gbps}
        if point in ("back", "through", "lower"):
            extra = tier.stats().extra
            out["drops"] = extra["background_drops"]  # 0, or the figures undercount the chain
    return out


def _start_profile() -> Any:
    try:
        import yappi
    except ImportError:
        import cProfile

        prof = cProfile.Profile(time.thread_time)
        prof.enable()
        return prof
    yappi.set_clock_type("cpu")
    yappi.clear_stats()
    yappi.start(builtins=True)
    return yappi


def _stop_profile(prof: Any) -> str:
    import io

    buf = io.StringIO()
    if hasattr(prof, "get_func_stats"):  # yappi: every thread, CPU clock
        prof.stop()
        columns = {0: ("name", 80), 1: ("ncall", 9), 2: ("tsub", 8), 3: ("ttot", 8)}
        for title, stats in (("event-loop thread", prof.get_func_stats(filter={"ctx_id": 0})),
                             ("all threads", prof.get_func_stats())):  # fmt: skip
            one = io.StringIO()
            stats.sort("tsub").print_all(out=one, columns=columns)
            buf.write(f"-- {title}\n" + "\n".join(one.getvalue().splitlines()[:40]) + "\n")
        prof.get_thread_stats().print_all(out=buf)
        return buf.getvalue()
    import pstats

    prof.disable()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(35)
    return buf.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", default="memory,fs,chain-memory,back,through,lower", help=f"of {', '.join(POINTS)}")
    ap.add_argument("--chunk-kib", default="64,256", help="chunk sizes in KiB, comma-separated")
    ap.add_argument("--chunks", type=int, default=1024, help="chunks stored, then loaded, per run")
    ap.add_argument("--depth", type=int, default=16, help="max_inflight of every tier and of the chain")
    ap.add_argument("--chain-depth", type=int, default=None,
                    help="max_inflight of the chain (its staging slots for calls); default: --depth")  # fmt: skip
    ap.add_argument("--background-batch", type=int, default=None, help="the chains' background_batch")
    ap.add_argument("--batch", type=int, default=32, help="chunks per call")
    ap.add_argument("--streams", type=int, default=4, help="concurrent callers")
    ap.add_argument("--repeat", type=int, default=3, help="runs per point, interleaved; the median is reported")
    ap.add_argument("--backend", default="asyncio", choices=sorted(BACKENDS))
    ap.add_argument("--root", default=None, help="directory for the fs tier's files (default: a temporary one)")
    ap.add_argument("--profile", default=None, metavar="POINT", help="profile one point (e.g. back) once and print it")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    if args.root is not None:
        os.makedirs(args.root, exist_ok=True)
    name, options = BACKENDS[args.backend]
    chain_depth = args.chain_depth or args.depth
    global BACKGROUND_BATCH
    BACKGROUND_BATCH = args.background_batch
    kibs = [int(k) for k in args.chunk_kib.split(",")]
    if args.profile is not None:
        root = tempfile.mkdtemp(prefix="asynctier-chaincpu-", dir=args.root)
        try:
            r = anyio.run(measure, args.profile, root, kibs[0] << 10, args.chunks, args.batch, args.streams,
                          args.depth, chain_depth, True, backend=name, backend_options=options)  # fmt: skip
        finally:
            shutil.rmtree(root, ignore_errors=True)
        for op in ("offload", "load"):
            print(f"== {args.profile} {op}: loop {r[op]['loop_us']:.1f} us/chunk, all threads {r[op]['cpu_us']:.1f}")
            print(r[f"{op}_profile"])
        return 0
    points = [(p, kib) for kib in kibs for p in args.points.split(",")]
    for p, _ in points:
        if p not in POINTS:
            ap.error(f"unknown point {p!r}; accepted: {', '.join(POINTS)}")
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {p: [] for p in points}
    for rep in range(args.repeat):
        for point, kib in points:
            root = tempfile.mkdtemp(prefix="asynctier-chaincpu-", dir=args.root)
            try:
                r = anyio.run(measure, point, root, kib << 10, args.chunks, args.batch, args.streams, args.depth,
                              chain_depth, backend=name, backend_options=options)  # fmt: skip
            finally:
                shutil.rmtree(root, ignore_errors=True)
            runs[(point, kib)].append(r)
            drops = f"  DROPS {r['drops']}" if r.get("drops") else ""
            print(f"[{rep + 1}/{args.repeat}] {point:12} {kib:4} KiB  store loop {r['offload']['loop_us']:7.1f} "
                  f"all {r['offload']['cpu_us']:7.1f} | load loop {r['load']['loop_us']:7.1f} "
                  f"all {r['load']['cpu_us']:7.1f} us/chunk{drops}",
                  flush=True)  # fmt: skip
    rows = []
    for point, kib in points:
        done = runs[(point, kib)]
        row: dict[str, Any] = {"point": point, "chunk_kib": kib, "copy_us": _copy_us(kib << 10)}
        for op in ("offload", "load"):
            for fig in ("loop_us", "cpu_us", "gbps"):
                vals = sorted(r[op][fig] for r in done)
                row[f"{op}_{fig}"] = vals[len(vals) // 2]
        rows.append(row)
    print(f"\nCPU per chunk (us; median of {args.repeat}), {args.backend}, batch {args.batch} x {args.streams} callers")
    print(f"{'point':12} {'KiB':>4} {'copy':>6} | {'store loop':>10} {'all':>7} {'GB/s':>6} | "
          f"{'load loop':>9} {'all':>7} {'GB/s':>6}")  # fmt: skip
    for row in rows:
        print(f"{row['point']:12} {row['chunk_kib']:4} {row['copy_us']:6.1f} | {row['offload_loop_us']:10.1f} "
              f"{row['offload_cpu_us']:7.1f} {row['offload_gbps']:6.2f} | {row['load_loop_us']:9.1f} "
              f"{row['load_cpu_us']:7.1f} {row['load_gbps']:6.2f}")  # fmt: skip
    write_rows(args.json, args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
