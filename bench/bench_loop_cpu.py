"""CPU the event-loop thread spends per chunk while a tier streams, per event loop.

The library lives inside a server: every microsecond its calls take on the loop thread is a
microsecond the server's own requests wait. This runs ``streams`` callers that offload, then
load, ``chunks`` chunks in calls of ``batch`` through one tier (default: fs at 256 KiB,
``max_inflight`` 16, into a tier with room for all of them), on asyncio, uvloop and trio
(anyio), and reports the loop thread's CPU time (``time.thread_time`` on the thread running
the loop) divided by the chunks moved, beside the wall-clock GB/s. Worker threads are not
counted: that is the point.

Run from the repository root: ``.venv/bin/python bench/bench_loop_cpu.py`` (``--help`` for
options); prints a table and, with ``--json``, writes the figures. Only the public API is
used, so the same script measures an older checkout (``PYTHONPATH=that/checkout``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import anyio

from asynctier import OffloadingSpec, SecondaryTierFactory

BACKENDS: dict[str, tuple[str, dict[str, Any]]] = {
    "asyncio": ("asyncio", {}),
    "uvloop": ("asyncio", {"use_uvloop": True}),
    "trio": ("trio", {}),
}


def _aligned_view(nbytes: int) -> memoryview:
    import mmap

    buf = mmap.mmap(-1, nbytes)  # page-aligned, as pinned memory is: the tiers' O_DIRECT path
    buf.write(os.urandom(min(nbytes, 1 << 20)) * (nbytes // min(nbytes, 1 << 20)))
    return memoryview(buf)


async def _stream(tier: Any, op: str, keys: list[bytes], slots: int, batch: int, streams: int) -> None:
    calls = [keys[i : i + batch] for i in range(0, len(keys), batch)]

    async def caller(n: int) -> None:
        for j in range(n, len(calls), streams):
            ks = calls[j]
            ids = [(j * batch + i) % slots for i in range(len(ks))]
            if op == "load":  # distinct slots within one load
                ids = [(i + j * batch) % slots for i in range(len(ks))]
            res = await getattr(tier, op)(ks, ids)
            if res.failed:
                raise RuntimeError(f"{op} failed: {next(iter(res.failed.values()))!r}")

    async with anyio.create_task_group() as tg:
        for n in range(streams):
            tg.start_soon(caller, n)


async def measure(config: dict[str, Any], chunk: int, chunks: int, batch: int, streams: int) -> dict[str, Any]:
    slots = max(batch * streams, 64)
    spec = OffloadingSpec(chunk, slots, namespace="bench/loop-cpu")
    view = _aligned_view(spec.total_bytes)
    tier = SecondaryTierFactory.create_secondary_tier(config, view, spec)
    out: dict[str, Any] = {}
    async with tier:
        keys = [b"loop-cpu-%d" % i for i in range(chunks)]
        for op in ("offload", "load"):
            cpu0, t0 = time.thread_time(), time.perf_counter()
            await _stream(tier, op, keys, slots, batch, streams)
            cpu, wall = time.thread_time() - cpu0, time.perf_counter() - t0
            out[op] = {"us_per_chunk": cpu / chunks * 1e6, "gbps": chunks * chunk / wall / 1e9}
        out["io_engine"] = getattr(tier, "active_io_engine", None)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tier", default="fs", help="tier type (fs, nvme, memory, ...)")
    ap.add_argument("--engines", default="native,threads", help="io_engine values to try (fs); '-' for none")
    ap.add_argument("--chunk-kib", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=2048, help="chunks offloaded, then loaded, per run")
    ap.add_argument("--depth", type=int, default=16, help="max_inflight")
    ap.add_argument("--batch", type=int, default=32, help="chunks per call")
    ap.add_argument("--streams", type=int, default=4, help="concurrent callers")
    ap.add_argument("--repeat", type=int, default=3, help="runs per point; the median is reported")
    ap.add_argument("--backends", default="asyncio,uvloop,trio")
    ap.add_argument("--root", default=None, help="directory for the tier's files (default: a temporary one)")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    chunk = args.chunk_kib << 10
    engines = [None] if args.engines == "-" else args.engines.split(",")
    rows = []
    for engine in engines:
        for backend in args.backends.split(","):
            runs: list[dict[str, Any]] = []
            error = None
            for _ in range(args.repeat):
                root = tempfile.mkdtemp(prefix="asynctier-loopcpu-", dir=args.root)
                config: dict[str, Any] = {"type": args.tier, "max_inflight": args.depth}
                if args.tier == "fs":
                    config["root"] = root
                elif args.tier == "nvme":
                    config.update(path=os.path.join(root, "slab"), capacity_bytes=(args.chunks + 64) * (chunk + 4096))
                if engine is not None:
                    config["io_engine"] = engine
                name, options = BACKENDS[backend]
                point = (config, chunk, args.chunks, args.batch, args.streams)
                try:
                    runs.append(anyio.run(measure, *point, backend=name, backend_options=options))
                except Exception as e:  # an older checkout may not run on every loop
                    error = f"{type(e).__name__}: {e}"[:120]
                    break
                finally:
                    shutil.rmtree(root, ignore_errors=True)
            row: dict[str, Any] = {"tier": args.tier, "engine": engine, "backend": backend, "error": error}
            for op in ("offload", "load"):
                if runs and error is None:
                    row[op] = sorted(runs, key=lambda r: r[op]["us_per_chunk"])[len(runs) // 2][op]
            if runs and error is None:
                row["active_io_engine"] = runs[0]["io_engine"]
            rows.append(row)
            cells = (
                f"offload {row['offload']['us_per_chunk']:6.1f} us/chunk {row['offload']['gbps']:5.2f} GB/s | "
                f"load {row['load']['us_per_chunk']:6.1f} us/chunk {row['load']['gbps']:5.2f} GB/s"
                if error is None
                else f"did not run: {error}"
            )
            print(f"{args.tier:5} {engine or '-':8} {backend:8} {cells}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "python": sys.version.split()[0]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
