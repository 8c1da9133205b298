"""CPU the event-loop thread spends per chunk while a tier streams, per event loop.

The library lives inside a server: every microsecond its calls take on the loop thread is a
microsecond the server's own requests wait. This runs ``streams`` callers that offload, then
load, ``chunks`` chunks in calls of ``batch`` through one tier (default: fs on each engine and
nvme, at 64 KiB and 256 KiB, ``max_inflight`` 16, into a tier with room for all of them), on
asyncio, uvloop and trio (anyio), and reports the loop thread's CPU time (``time.thread_time``
on the thread running the loop) divided by the chunks moved, beside the wall-clock GB/s and,
where the tier reports it (``stats().extra["loop_wakeups"]``), the times its workers woke the
loop per chunk. Worker threads are not counted: that is the point. Points run interleaved
(each repeat goes over every point once), and the median of the repeats is reported (for an
even count, the higher of the middle two: one run's figures, whole). With
``--steady``, as many new keys are then offloaded into the tier it filled (each store
evicts: a cache's steady state), reported as "full tier". ``--steady-passes N`` first streams N
untimed passes of new keys into the full tier, so that "full tier" is a tier that has lived
at capacity a while (the nvme tier's first pass over a full slab cost less than its later
ones until its slots stopped drifting apart: docs/tiers/nvme.md), and adds "full-tier load":
loading the keys stored last, wherever they landed.

Run from the repository root: ``.venv/bin/python bench/bench_loop_cpu.py`` (``--help`` for
options); prints a table and, with ``--json``, writes the figures. Only the public API is
used, so the same script measures an older checkout (``PYTHONPATH=that/checkout``). On a
machine with other work running, thread CPU time still grows with cache misses and
preemption: compare checkouts in one sitting, run after run. Each timed phase starts from a
collected heap, so the garbage collector's runs inside it (``gc_us_per_chunk``, part of the
figure) are those its own allocations make due, in the same place every run.

``CPU`` is the loop thread's share of one CPU while the stream ran (its CPU time over the
wall time), and ``nap`` how long each of its sleeps lasted on average (ms: the wall time it
was not running over its voluntary sleeps, so time it was preempted counts too). The same calls
cost the loop more CPU a chunk when the stream runs slower, at the same bytecodes and
wake-ups, while this share falls far less than the chunks a second: each burst of work after
the loop slept runs slower the longer it slept (docs/benchmarks-issue-28.md, thirty-second
pass); ``bench_wake_cost.py`` measures that on its own, with none of the library.

Each run first times ``bench_wake_cost.py``'s fixed piece of Python on its loop thread, right
after other work and after 5 ms asleep (``machine_ref`` in the JSON, its median printed under
the table): the machine's state when the run was made, which moves the figures by up to 2x
from one hour to the next (docs/benchmarks-issue-28.md, thirty-fourth pass).

``sleeps`` is how often the loop thread gave up its CPU of its own accord per chunk (waiting
for the workers, or for the GIL). Where the CPUs are virtual, a CPU left idle may be halted and handed to the
host, and the thread it wakes for runs slower for a while (cold caches): ``--awake both`` runs
every point also beside one busy process per CPU at the lowest priority (nice 19), which keeps
the CPUs from idling while taking almost no time from the stream, and reports both, so the
library's own cost can be told from the machine's (docs/benchmarks-issue-28.md, twenty-fifth pass).
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import anyio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_wake_cost as wake_cost
from rows_json import write_rows

from asynctier import OffloadingSpec, SecondaryTierFactory

BACKENDS: dict[str, tuple[str, dict[str, Any]]] = {
    "asyncio": ("asyncio", {}),
    "uvloop": ("asyncio", {"use_uvloop": True}),
    "trio": ("trio", {}),
}


#: the primary buffer on transparent huge pages (--pages huge, the default, as
#: asynctier.buffers.allocate_buffer makes it) or on 4 KiB pages (--pages base)
HUGE_PAGES = True


def _aligned_view(nbytes: int) -> memoryview:
    from asynctier.buffers import allocate_buffer

    view = allocate_buffer(nbytes, huge_pages=HUGE_PAGES)  # page-aligned, as pinned memory is: O_DIRECT
    block = os.urandom(min(nbytes, 1 << 20))
    for off in range(0, nbytes - len(block) + 1, len(block)):
        view[off : off + len(block)] = block
    return view


class GcWatch:
    """The garbage collector's runs on this thread while in the ``with`` block: how many of
    each generation, and their CPU time."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.cpu = 0.0
        self._thread = threading.get_ident()
        self._start = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if threading.get_ident() != self._thread:
            return
        if phase == "start":
            self._start = time.thread_time()
        else:
            self.cpu += time.thread_time() - self._start
            self.collections[info["generation"]] += 1

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


async def stream(tier: Any, op: str, keys: list[bytes], slots: int, batch: int, streams: int) -> None:
    """``op`` over ``keys`` in calls of ``batch`` from ``streams`` concurrent callers, each on
    its own slots (bench_chain_cpu.py streams the same way)."""
    calls = [keys[i : i + batch] for i in range(0, len(keys), batch)]

    async def caller(n: int) -> None:
        # each caller's chunks, made once: a server has its block ids at hand, so building
        # them per call (about 12 bytecodes a chunk) is not counted as the tier's
        own = [(n * batch + i) % slots for i in range(batch)]
        for j in range(n, len(calls), streams):
            ks = calls[j]
            ids = own if len(ks) == batch else own[: len(ks)]
            res = await getattr(tier, op)(ks, ids)
            if res.failed:
                raise RuntimeError(f"{op} failed: {next(iter(res.failed.values()))!r}")

    async with anyio.create_task_group() as tg:
        for n in range(streams):
            tg.start_soon(caller, n)


async def measure(
    config: dict[str, Any], chunk: int, chunks: int, batch: int, streams: int, steady: bool = False, passes: int = 0
) -> dict[str, Any]:
    slots = max(batch * streams, 64)
    spec = OffloadingSpec(chunk, slots, namespace="bench/loop-cpu")
    view = _aligned_view(spec.total_bytes)
    tier = SecondaryTierFactory.create_secondary_tier(config, view, spec)
    out: dict[str, Any] = {}

    async def timed(name: str, op: str, ks: list[bytes]) -> None:
        st0 = tier.stats()
        wakes0 = st0.extra.get("loop_wakeups")
        gc_watch = GcWatch()
        # from a collected heap: a collection the phase before made due (the collector
        # counts allocations across phases) is not this phase's; its own are
        gc.collect()
        ru0 = resource.getrusage(resource.RUSAGE_THREAD)
        cpu0, t0 = time.thread_time(), time.perf_counter()
        with gc_watch:
            await stream(tier, op, ks, slots, batch, streams)
        cpu, wall = time.thread_time() - cpu0, time.perf_counter() - t0
        ru1 = resource.getrusage(resource.RUSAGE_THREAD)
        sleeps = ru1.ru_nvcsw - ru0.ru_nvcsw
        st1 = tier.stats()
        wakes1 = st1.extra.get("loop_wakeups")
        out[name] = {
            "us_per_chunk": cpu / chunks * 1e6,
            # the share of one CPU the loop thread took while streaming: where it falls less than
            # the chunks a second as the stream slows, the work a chunk is not all of us_per_chunk
            "loop_share": cpu / wall,
            "gbps": chunks * chunk / wall / 1e9,
            "wakeups_per_chunk": None if wakes0 is None or wakes1 is None else (wakes1 - wakes0) / chunks,
            "sleeps_per_chunk": sleeps / chunks,
            # the times the loop thread was descheduled while it could run (another thread
            # took its CPU): counted in ms_per_sleep's wall time, not in its CPU
            "preempted_per_chunk": (ru1.ru_nivcsw - ru0.ru_nivcsw) / chunks,
            # how long the loop thread slept each time, on average: the longer, the more its
            # next burst costs on some machines (bench_wake_cost.py)
            "ms_per_sleep": (wall - cpu) / sleeps * 1e3 if sleeps else 0.0,
            "evictions_per_chunk": (st1.evictions - st0.evictions) / chunks,
            # (part of us_per_chunk) the garbage collector's runs on the loop thread: a full
            # collection walks every object of the process, and lands in one phase or another
            "gc_us_per_chunk": gc_watch.cpu / chunks * 1e6,
            "gc_collections": gc_watch.collections,
        }

    # the machine's state at this run: a fixed piece of Python with none of the library, right
    # after other work and after 5 ms asleep (bench_wake_cost.py); it moves from hour to hour
    ref = await wake_cost.measure([0.0, 0.005], 15)
    out["machine_ref"] = {"cpu_us": statistics.median(ref[0.0]), "after_5ms_us": statistics.median(ref[0.005])}
    async with tier:
        keys = [b"loop-cpu-%d" % i for i in range(chunks)]
        await timed("offload", "offload", keys)
        await timed("load", "load", keys)
        if steady:  # as many new keys into the tier now full: each store evicts
            evicted = tier.stats().evictions
            for r in range(passes):  # untimed: the tier's state after a while at capacity
                await stream(tier, "offload", [b"loop-cpu-pass-%d-%d" % (r, i) for i in range(chunks)],
                             slots, batch, streams)  # fmt: skip
            if passes:
                out["passes"] = {"count": passes, "evictions_per_chunk": (tier.stats().evictions - evicted) / chunks}
            new = [b"loop-cpu-new-%d" % i for i in range(chunks)]
            await timed("steady", "offload", new)
            if passes:
                await timed("steady_load", "load", new)
        out["io_engine"] = getattr(tier, "active_io_engine", None)
    return out


def _spinners() -> list[subprocess.Popen[bytes]]:
    """One busy process per CPU at nice 19: CPUs never idle, and the stream's threads (nice 0,
    weight 1024 against 15) lose about 1.5 % of a CPU to each. Each ends with this process,
    killed or not (it is then another's child)."""
    code = "import os; os.nice(19); parent = os.getppid()\nwhile os.getppid() == parent: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(os.cpu_count() or 1)]


def _config(
    tier: str, engine: str | None, root: str, depth: int, chunks: int, chunk: int, steady: bool = False,
    slab_chunks: int = 0,
) -> dict[str, Any]:  # fmt: skip
    config: dict[str, Any] = {"type": tier, "max_inflight": depth}
    if tier == "fs":
        config["root"] = root
        if steady:  # room for the chunks (and their header blocks), so the next ones evict
            config["capacity_bytes"] = (chunks + 64) * (chunk + 4096)
        if engine is not None:
            config["io_engine"] = engine
    elif tier == "nvme":
        # a full slab keeps up to 64 slots free ahead of its stores (evict_batch 16, "Evicting
        # ahead" in docs/tiers/nvme.md): room for those too, so the last chunks stored stay
        room = slab_chunks or chunks + 128
        config.update(path=os.path.join(root, "slab"), capacity_bytes=room * (chunk + 4096))
        if engine is not None:
            config["io_engine"] = engine
    return config


def _cell(row: dict[str, Any], op: str) -> str:
    r = row.get(op)
    if r is None:
        return f"{'-':>7} {'-':>6} {'-':>6} {'-':>5} {'-':>5} {'-':>6}"
    w = "-" if r["wakeups_per_chunk"] is None else f"{r['wakeups_per_chunk']:.2f}"
    share = f"{100 * r['loop_share']:4.0f}%" if "loop_share" in r else "-"
    nap = f"{r['ms_per_sleep']:5.1f}" if "ms_per_sleep" in r else "-"
    return f"{r['us_per_chunk']:7.1f} {w:>6} {r.get('sleeps_per_chunk', 0):6.2f} {nap:>5} {share:>5} {r['gbps']:6.2f}"


def _head(name: str) -> str:
    return f" | {name:>10} {'wakes':>6} {'sleeps':>6} {'nap':>5} {'CPU':>5} {'GB/s':>6}"


def print_table(rows: list[dict[str, Any]]) -> None:
    print()
    steady = any("steady" in row for row in rows)
    settled = any("steady_load" in row for row in rows)
    print("loop-thread CPU per chunk (us), loop wake-ups by the workers and sleeps of the loop thread per chunk, "
          "the ms each sleep lasted (nap), the loop thread's share of one CPU while streaming, GB/s "
          "(median of repeats)")  # fmt: skip
    head = f"{'tier':5} {'engine':8} {'KiB':>5} {'loop':8} {'CPUs':6}" + _head("offload us") + _head("load us")
    head += _head("full tier") if steady else ""
    print(head + (_head("full load") if settled else ""))
    for row in rows:
        label = f"{row['tier']:5} {row['engine'] or '-':8} {row['chunk_kib']:5} {row['backend']:8} "
        label += "awake " if row.get("awake") else "-     "
        if row.get("error"):
            print(f"{label} | did not run: {row['error']}")
            continue
        line = f"{label} |    {_cell(row, 'offload')} |    {_cell(row, 'load')}"
        line += f" |    {_cell(row, 'steady')}" if steady else ""
        print(line + (f" |    {_cell(row, 'steady_load')}" if settled else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiers", default="fs,nvme", help="tier types (fs, nvme, memory, ...)")
    ap.add_argument(
        "--engines", default="native,threads", help="io_engine values to try on fs and nvme; '-' for the default"
    )
    ap.add_argument("--chunk-kib", default="64,256", help="chunk sizes in KiB, comma-separated")
    ap.add_argument("--chunks", type=int, default=2048, help="chunks offloaded, then loaded, per run")
    ap.add_argument("--depth", type=int, default=16, help="max_inflight")
    ap.add_argument("--batch", type=int, default=32, help="chunks per call")
    ap.add_argument("--streams", type=int, default=4, help="concurrent callers")
    ap.add_argument("--repeat", type=int, default=3, help="runs per point, interleaved; the median is reported")
    ap.add_argument("--backends", default="asyncio,uvloop,trio")
    ap.add_argument("--root", default=None, help="directory for the tier's files (default: a temporary one)")
    ap.add_argument(
        "--awake",
        choices=("off", "on", "both"),
        default="off",
        help="run beside one busy nice-19 process per CPU, which keeps virtual CPUs from idling (see above); "
        "both: each point without and with, interleaved",
    )
    ap.add_argument("--json", default=None, help="write the figures here")
    ap.add_argument(
        "--steady",
        action="store_true",
        help="also offload as many new keys into the tier then full (each store evicts): a cache's steady state",
    )
    ap.add_argument(
        "--steady-passes",
        type=int,
        default=0,
        help="with --steady: untimed passes of new keys into the full tier first; then also time loading the last keys",
    )
    ap.add_argument(
        "--slab-chunks",
        type=int,
        default=0,
        help="nvme: the slab's room in chunks (default: the chunks and 128); a server's slab is far larger than "
        "one run's chunks, and its free list with it (not with --steady)",
    )
    ap.add_argument(
        "--pages",
        choices=("huge", "base"),
        default="huge",
        help="the primary buffer on transparent huge pages or on 4 KiB pages (docs/configuration.md, 'Huge pages')",
    )
    args = ap.parse_args()
    global HUGE_PAGES
    HUGE_PAGES = args.pages == "huge"
    if args.slab_chunks and (args.steady or args.slab_chunks < args.chunks + 128):
        ap.error("--slab-chunks: at least --chunks + 128, and not with --steady (which needs the tier full)")
    engines = [None] if args.engines == "-" else args.engines.split(",")
    awake = {"off": [False], "on": [True], "both": [False, True]}[args.awake]
    points: list[tuple[str, str | None, int, str, bool]] = []
    for tier in args.tiers.split(","):
        for kib in (int(k) for k in args.chunk_kib.split(",")):
            for engine in engines if tier in ("fs", "nvme") else [None]:
                for backend in args.backends.split(","):
                    points += [(tier, engine, kib, backend, a) for a in awake]
    runs: dict[tuple[str, str | None, int, str, bool], list[dict[str, Any]]] = {p: [] for p in points}
    errors: dict[tuple[str, str | None, int, str, bool], str] = {}
    if args.root is not None:
        os.makedirs(args.root, exist_ok=True)
    for rep in range(args.repeat):
        for point in points:
            if point in errors:
                continue
            tier, engine, kib, backend, busy = point
            chunk = kib << 10
            root = tempfile.mkdtemp(prefix="asynctier-loopcpu-", dir=args.root)
            name, options = BACKENDS[backend]
            config = _config(tier, engine, root, args.depth, args.chunks, chunk, args.steady, args.slab_chunks)
            spinners = _spinners() if busy else []
            try:
                r = anyio.run(measure, config, chunk, args.chunks, args.batch, args.streams, args.steady,
                              args.steady_passes, backend=name, backend_options=options)  # fmt: skip
            except Exception as e:  # an older checkout may not run on every loop
                errors[point] = f"{type(e).__name__}: {e}"[:120]
                continue
            finally:
                for p in spinners:
                    p.kill()
                    p.wait()
                shutil.rmtree(root, ignore_errors=True)
            runs[point].append(r)
            off, load = r["offload"]["us_per_chunk"], r["load"]["us_per_chunk"]
            full = f", full tier {r['steady']['us_per_chunk']:6.1f} us/chunk" if "steady" in r else ""
            full += f", full-tier load {r['steady_load']['us_per_chunk']:6.1f} us/chunk" if "steady_load" in r else ""
            gcs = ", ".join(f"{op} {v['gc_us_per_chunk']:.1f}" for op, v in r.items()
                            if isinstance(v, dict) and v.get("gc_collections", [0, 0, 0])[2])  # fmt: skip
            full += f" (of which full collections of the garbage collector: {gcs})" if gcs else ""
            print(f"[{rep + 1}/{args.repeat}] {tier:5} {engine or '-':8} {kib:4} KiB {backend:8} "
                  f"{'awake ' if busy else ''}offload {off:6.1f} us/chunk, load {load:6.1f} us/chunk{full}",
                  flush=True)  # fmt: skip
    rows = []
    for point in points:
        tier, engine, kib, backend, busy = point
        row: dict[str, Any] = {"tier": tier, "engine": engine, "chunk_kib": kib, "backend": backend,
                               "awake": busy, "error": errors.get(point)}  # fmt: skip
        done = runs[point]
        if done and point not in errors:
            for op in ("offload", "load", "steady", "steady_load"):
                if op in done[0]:
                    row[op] = sorted(done, key=lambda r: r[op]["us_per_chunk"])[len(done) // 2][op]
            row["active_io_engine"] = done[0]["io_engine"]
            row["machine_ref"] = [r["machine_ref"] for r in done]  # each run's, in order
            if "passes" in done[0]:
                row["passes"] = done[0]["passes"]
        rows.append(row)
    print_table(rows)
    refs = [m for r in rows for m in r.get("machine_ref", [])]
    if refs:
        print(f"machine reference (bench_wake_cost.py's piece on the loop thread before each run, median of runs): "
              f"{statistics.median(m['cpu_us'] for m in refs):.1f} us right after other work, "
              f"{statistics.median(m['after_5ms_us'] for m in refs):.1f} us after 5 ms asleep")  # fmt: skip
    write_rows(args.json, args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
