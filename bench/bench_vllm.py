"""vLLM's own fs tier beside asynctier's fs and nvme tiers, inside vLLM's tiering manager.

    .venv/bin/python bench/bench_vllm.py --dir /var/tmp/asynctier-bench

Needs vLLM 0.33 (``python -m pip install --no-deps vllm==0.33.0 -r requirements/vllm.txt``).
Each point builds vLLM's real ``TieringOffloadingManager`` over a ``SharedOffloadRegion``
holding the whole data set, with one secondary tier: vLLM's built-in ``fs`` tier, or
``AsynctierTier`` wrapping asynctier's ``fs`` or ``nvme`` tier, all on the same directory's
disk, same chunk size (256 KiB and 2 MiB by default) and data size. Then, as vLLM's
scheduler would:

* **store (cascade)**: ``prepare_store`` + ``complete_store`` of ``--batch`` chunks per call
  (one cascade job each), engine steps until every cascade is done;
* **load (promotion)**: ``reset_cache()`` empties the primary tier, then requests of
  ``--batch`` chunks each look their chunks up every step until all are HIT (one promotion
  job per request), and every byte is checked against what was stored.

An engine step is ``on_schedule_end`` then a ``--step-ms`` pause, the same for every tier.
GB/s is data / wall time of the phase; ``cpu s/GB`` is the process CPU time of the phase
per GB (less disturbed by other load on the machine than wall time). Every call vLLM makes
into the secondary tier is timed on the scheduler thread (wall and thread CPU, µs).
Repetitions interleave the tiers, each repeat starting one tier later (a tier run right after
the fs tiers pays for the files ext4 is still writing back); the report gives medians.

Writes ``bench/results/vllm.json`` and ``bench/results/vllm.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import gc
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

ROOT = Path(__file__).resolve().parent.parent

KiB = 1 << 10
MiB = 1 << 20
STEP = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())
#: the secondary tier's methods vLLM calls from the scheduler thread
TIMED = ("lookup", "submit_store", "submit_load", "get_finished_jobs", "on_schedule_end", "has_pending_work")


def tier_configs(
    d: Path, chunk: int, nchunks: int, variants: dict[str, dict[str, Any]] | None = None,
    nvme_variants: dict[str, dict[str, Any]] | None = None,
) -> dict[str, dict[str, Any]]:  # fmt: skip
    """The tiers to compare; ``variants``: more asynctier fs tiers, by name suffix, each with
    these fs config keys added (``{"verify": False}``, ...); ``nvme_variants``: the same for
    nvme tiers (``{"io_engine": "threads"}``)."""
    adapter = {"type": "AsynctierTier", "module_path": "asynctier.integrations.vllm"}
    slot = 4096 + -(-chunk // 4096) * 4096
    tiers: dict[str, dict[str, Any]] = {
        "vllm fs": {"type": "fs", "root_dir": str(d / "vllm-fs")},
        "asynctier fs": {**adapter, "tier": {"type": "fs", "root": str(d / "asynctier-fs")}},
        "asynctier nvme": {
            **adapter,
            "tier": {"type": "nvme", "path": str(d / "asynctier-nvme.slab"), "capacity_bytes": 4096 + slot * nchunks},
        },
    }
    for i, (suffix, extra) in enumerate((variants or {}).items()):
        tiers[f"asynctier fs {suffix}"] = {
            **adapter,
            "tier": {"type": "fs", "root": str(d / f"asynctier-fs-v{i}"), **extra},
        }
    for i, (suffix, extra) in enumerate((nvme_variants or {}).items()):
        tiers[f"asynctier nvme {suffix}"] = {
            **adapter,
            "tier": {**tiers["asynctier nvme"]["tier"], "path": str(d / f"asynctier-nvme-v{i}.slab"), **extra},
        }
    return tiers


def offloading_config(
    chunk: int, nchunks: int, secondary_tiers: list[dict[str, Any]], model: str = "bench/model", dtype: str = "bfloat16"
) -> OffloadingConfig:
    """What vLLM builds from an engine config: one KV group, one worker, ``chunk`` bytes a
    chunk, a CPU primary tier of ``nchunks`` (the bridge's tests build theirs here too)."""
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("layer.0",), group_id=0),),
        worker_kv_bytes_per_block=chunk,
        enable_kv_cache_events=False,
        extra_config={"cpu_bytes_to_use": chunk * nchunks, "secondary_tiers": secondary_tiers},
        engine_id=f"asynctier-bench-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name=model, dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds of each thread of this process (the scheduler's count, in ns), by thread
    id, with a name: a Python thread's name (a pool's numbers dropped, so its threads add
    up), else the kernel's (the native workers name themselves)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[int, tuple[str, float]] = {}
    for tid_s in os.listdir("/proc/self/task"):
        tid = int(tid_s)
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                on_cpu_ns = int(f.read().split()[0])
            with open(f"/proc/self/task/{tid}/comm") as f:
                comm = f.read().strip()
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
        name = names.get(tid) or comm
        out[tid] = (re.sub(r"[-_]?\d+$", "", name.removeprefix("Thread-").split(" ")[0]) or name, on_cpu_ns / 1e9)
    return out


def cpu_by_thread(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds spent between two :func:`thread_cpu` readings, summed by thread name."""
    spent: dict[str, float] = {}
    for tid, (name, cpu) in after.items():
        d = cpu - before.get(tid, (name, 0.0))[1]
        if d > 0:
            spent[name] = spent.get(name, 0.0) + d
    return dict(sorted(spent.items(), key=lambda kv: -kv[1]))


def _timed(fn: Callable[..., Any], wall: list[int], cpu: list[int]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            wall.append(time.perf_counter_ns() - w0)
            cpu.append(time.thread_time_ns() - c0)

    return call


def run_point(name: str, config: dict[str, Any], chunk: int, nchunks: int, args: argparse.Namespace) -> dict[str, Any]:
    spec = TieringOffloadingSpec(offloading_config(chunk, nchunks, [config]))
    mgr = spec.get_manager()
    assert isinstance(mgr, TieringOffloadingManager)
    (tier,) = mgr.secondary_tiers
    wall: dict[str, list[int]] = {m: [] for m in TIMED}
    cpu: dict[str, list[int]] = {m: [] for m in TIMED}
    for m in TIMED:  # instance attributes shadow the methods the manager calls
        setattr(tier, m, _timed(getattr(tier, m), wall[m], cpu[m]))
    # when promotion jobs went in and came back (perf_counter), for the load phase's timeline
    submitted: list[float] = []
    finished: list[float] = []
    submit_load, get_finished_jobs = tier.submit_load, tier.get_finished_jobs

    def submit_load_noted(job: Any) -> None:
        submitted.append(time.perf_counter())
        submit_load(job)

    def get_finished_jobs_noted() -> Any:
        done = list(get_finished_jobs())
        now = time.perf_counter()
        finished.extend(now for _ in done)
        return done

    tier.submit_load, tier.get_finished_jobs = submit_load_noted, get_finished_jobs_noted
    rows = np.asarray(mgr.primary_tier.get_kv_memoryview())
    gap = args.step_ms / 1000

    step_ends: list[float] = []  # perf_counter at each engine step's end

    def step() -> None:
        with mgr.lock:
            mgr.on_schedule_end(STEP)
        step_ends.append(time.perf_counter())
        time.sleep(gap)

    rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
    data = rng.integers(-128, 128, size=(nchunks, chunk), dtype=np.int8)
    keys = [make_offload_key(os.urandom(16), 0) for _ in range(nchunks)]
    batches = [keys[i : i + args.batch] for i in range(0, nchunks, args.batch)]
    index = {k: i for i, k in enumerate(keys)}
    # as vLLM's engine does after start-up (freeze_gc_heap): without it a full collection of
    # the heap vLLM's imports left lands in a random phase of a random tier (0.3 s here)
    gc.collect()
    gc.freeze()
    try:
        req = ReqContext(req_id="store")
        with mgr.lock:
            mgr.on_new_request(req)
        c0, t0 = time.process_time(), time.perf_counter()
        for batch in batches:
            with mgr.lock:
                out = mgr.prepare_store(batch, req)
            assert out is not None, "primary tier full"
            for key, cid in zip(out.keys_to_store, out.store_spec.chunk_ids):
                rows[cid] = data[index[key]]
            with mgr.lock:
                mgr.complete_store(out.keys_to_store, req)
        while mgr.has_pending_work():
            step()
        store_s, store_cpu = time.perf_counter() - t0, time.process_time() - c0
        with mgr.lock:
            mgr.on_request_finished(req)
            mgr.reset_cache()  # the primary tier forgets everything: loads come from the tier
            mgr.on_reset_flushed()

        reqs = [ReqContext(req_id=f"load-{i}") for i in range(len(batches))]
        with mgr.lock:
            for r in reqs:
                mgr.on_new_request(r)
        finished.clear()
        step_ends.clear()
        threads0 = thread_cpu()
        c0, t0 = time.process_time(), time.perf_counter()
        pending = list(zip(reqs, batches))
        while pending:
            still = []
            with mgr.lock:
                for r, batch in pending:
                    results = [mgr.lookup(k, r) for k in batch]
                    if any(res is LookupResult.MISS for res in results):
                        raise AssertionError(f"{name}: a stored chunk is a MISS")
                    if not all(res is LookupResult.HIT for res in results):
                        still.append((r, batch))
            pending = still
            if pending:
                step()
        load_s, load_cpu = time.perf_counter() - t0, time.process_time() - c0
        load_threads = cpu_by_thread(threads0, thread_cpu())
        load_timeline = {
            "first_submit_ms": (submitted[0] - t0) * 1e3,
            "last_submit_ms": (submitted[-1] - t0) * 1e3,
            "first_done_ms": (min(finished) - t0) * 1e3,
            "last_done_ms": (max(finished) - t0) * 1e3,
            "steps": len(step_ends),
            "steps_before_submit": sum(1 for t in step_ends if t < submitted[0]),
        }
        for r, batch in zip(reqs, batches):
            with mgr.lock:
                ids = mgr.prepare_load(batch, r).chunk_ids
            for key, cid in zip(batch, ids):
                if not np.array_equal(rows[cid], data[index[key]]):
                    raise AssertionError(f"{name}: chunk {index[key]} came back different")
            with mgr.lock:
                mgr.complete_load(batch, r)
                mgr.on_request_finished(r)
    finally:
        del rows, data  # vLLM unmaps the region at shutdown only if no view of it is left
        mgr.shutdown()
        gc.unfreeze()
    gb = nchunks * chunk / 1e9

    def summary(m: str) -> dict[str, float]:
        w, c = wall[m], cpu[m]
        if not w:
            return {"calls": 0}
        w_sorted = sorted(w)
        return {
            "calls": len(w),
            "p50_us": statistics.median(w) / 1e3,
            "p99_us": w_sorted[min(len(w) - 1, int(len(w) * 0.99))] / 1e3,
            "max_us": w_sorted[-1] / 1e3,
            "cpu_p50_us": statistics.median(c) / 1e3,
            "cpu_mean_us": statistics.fmean(c) / 1e3,
        }

    return {
        "tier": name,
        "chunk_kib": chunk // KiB,
        "store_gbps": gb / store_s,
        "load_gbps": gb / load_s,
        "store_cpu_s_per_gb": store_cpu / gb,
        "load_cpu_s_per_gb": load_cpu / gb,
        "calls": {m: summary(m) for m in TIMED},
        "load_jobs": len(submitted),
        "load_timeline": load_timeline,
        "load_thread_cpu_s_per_gb": {name: s / gb for name, s in load_threads.items()},
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    base = Path(args.dir)
    points: list[dict[str, Any]] = []
    for chunk_kib in args.sizes_kib:
        chunk = chunk_kib * KiB
        nchunks = max(args.batch, args.mib * MiB // chunk)
        runs: dict[str, list[dict[str, Any]]] = {}
        for rep in range(args.repeat):
            tiers = [
                (name, config)
                for name, config in tier_configs(
                    base / f"rep{rep}", chunk, nchunks, args.fs_variant, args.nvme_variant
                ).items()
                if not args.tiers or name in args.tiers
            ]
            # each repeat starts one tier later: a tier right after the fs tiers pays for the
            # files ext4 is still writing back, so no tier is always the one that follows them
            shift = rep % max(1, len(tiers))
            for name, config in tiers[shift:] + tiers[:shift]:
                d = base / f"rep{rep}"
                shutil.rmtree(d, ignore_errors=True)
                d.mkdir(parents=True)
                try:
                    runs.setdefault(name, []).append(run_point(name, config, chunk, nchunks, args))
                finally:
                    shutil.rmtree(d, ignore_errors=True)
        for reps in runs.values():
            point = dict(reps[0])
            for field in ("store_gbps", "load_gbps", "store_cpu_s_per_gb", "load_cpu_s_per_gb"):
                point[field] = statistics.median(r[field] for r in reps)
            for m in TIMED:
                for field in ("p50_us", "p99_us", "max_us", "cpu_p50_us", "cpu_mean_us"):
                    if field in point["calls"][m]:
                        point["calls"][m][field] = statistics.median(r["calls"][m][field] for r in reps)
            for field in (
                "first_submit_ms",
                "last_submit_ms",
                "first_done_ms",
                "last_done_ms",
                "steps",
                "steps_before_submit",
            ):
                point["load_timeline"][field] = statistics.median(r["load_timeline"][field] for r in reps)
            names = {n for r in reps for n in r["load_thread_cpu_s_per_gb"]}
            point["load_thread_cpu_s_per_gb"] = {
                n: statistics.median(r["load_thread_cpu_s_per_gb"].get(n, 0.0) for r in reps) for n in sorted(names)
            }
            base_reps = runs.get("vllm fs")
            if base_reps is not None and len(base_reps) == len(reps):
                # ratios within each repeat (same minutes of the same disk), then their median
                for kind in ("load", "store"):
                    ratios = [r[f"{kind}_gbps"] / b[f"{kind}_gbps"] for r, b in zip(reps, base_reps)]
                    point[f"{kind}_vs_vllm_fs"] = statistics.median(ratios)
                    point[f"{kind}_vs_vllm_fs_each"] = ratios
            point["repeats"] = len(reps)
            point["mib"] = nchunks * chunk // MiB
            points.append(point)
    return {
        "meta": {
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "dir": str(base),
            "batch": args.batch,
            "step_ms": args.step_ms,
            "repeat": args.repeat,
            "command": shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        },
        "points": points,
    }


def markdown(report: dict[str, Any]) -> str:
    meta = report["meta"]
    lines = [
        "# vLLM's tiering manager: vLLM's fs tier vs asynctier's fs and nvme tiers",
        "",
        f"{meta['date']}, {meta['cpus']} CPUs, dir `{meta['dir']}`, {meta['batch']} chunks a job, "
        f"engine step {meta['step_ms']} ms, median of {meta['repeat']}. `{meta['command']}`",
        "",
        "| tier | chunk | data | store GB/s | load GB/s | load / vllm fs | store cpu s/GB | load cpu s/GB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in report["points"]:
        ratio = p.get("load_vs_vllm_fs")
        each = " ".join(f"{r:.2f}" for r in p.get("load_vs_vllm_fs_each", ()))
        lines.append(
            f"| {p['tier']} | {p['chunk_kib']} KiB | {p['mib']} MiB | {p['store_gbps']:.2f} | {p['load_gbps']:.2f} "
            f"| {'-' if ratio is None else f'{ratio:.2f}x ({each})'} "
            f"| {p['store_cpu_s_per_gb']:.2f} | {p['load_cpu_s_per_gb']:.2f} |"
        )
    lines += [
        "",
        "`load / vllm fs`: the ratio of load GB/s to vLLM's fs tier's in the same repeat, median (each repeat's).",
        "",
        "Load phase: when the promotion jobs were submitted and reported done (ms from the phase's start), "
        "and CPU s/GB by thread:",
        "",
        "| tier | chunk | jobs | steps (before submit) | submitted | first done | last done | CPU s/GB by thread |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in report["points"]:
        t = p["load_timeline"]
        threads = ", ".join(f"{n} {v:.2f}" for n, v in p["load_thread_cpu_s_per_gb"].items() if v >= 0.05)
        lines.append(
            f"| {p['tier']} | {p['chunk_kib']} KiB | {p['load_jobs']} "
            f"| {t['steps']:.0f} ({t['steps_before_submit']:.0f}) "
            f"| {t['first_submit_ms']:.0f}-{t['last_submit_ms']:.0f} "
            f"| {t['first_done_ms']:.0f} | {t['last_done_ms']:.0f} | {threads} |"
        )
    lines += [
        "",
        "Scheduler-thread time per call into the secondary tier (µs: wall p50 / p99, thread CPU p50):",
        "",
        "| tier | chunk | " + " | ".join(TIMED) + " |",
        "| --- | --- | " + " | ".join("---" for _ in TIMED) + " |",
    ]
    for p in report["points"]:
        cells = []
        for m in TIMED:
            c = p["calls"][m]
            cells.append(f"{c['p50_us']:.1f} / {c['p99_us']:.0f} / {c['cpu_p50_us']:.1f}" if c.get("calls") else "-")
        lines.append(f"| {p['tier']} | {p['chunk_kib']} KiB | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _variant(text: str) -> tuple[str, dict[str, Any]]:
    name, sep, config = text.partition("=")
    extra = json.loads(config) if sep else None
    if not name or not isinstance(extra, dict):
        raise argparse.ArgumentTypeError(
            f"expected NAME=JSON object, as verify-off='{{\"verify\": false}}'; got {text!r}"
        )
    return name, extra


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp/asynctier-bench-vllm", help="scratch directory on the disk to test")
    ap.add_argument("--sizes-kib", type=int, nargs="+", default=[256, 2048], help="chunk sizes in KiB")
    ap.add_argument("--mib", type=int, default=256, help="data per point in MiB")
    ap.add_argument("--batch", type=int, default=16, help="chunks per cascade / promotion job")
    ap.add_argument("--step-ms", type=float, default=1.0, help="pause between engine steps")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tiers", nargs="*", help="only these tiers ('vllm fs', 'asynctier fs', 'asynctier nvme')")
    ap.add_argument(
        "--fs-variant",
        action="append",
        type=_variant,
        default=[],
        metavar="NAME=JSON",
        help='one more asynctier fs tier, named "asynctier fs NAME", with these fs config keys: '
        "verify-off='{\"verify\": false}' (repeatable)",
    )
    ap.add_argument(
        "--nvme-variant",
        action="append",
        type=_variant,
        default=[],
        metavar="NAME=JSON",
        help='one more asynctier nvme tier, named "asynctier nvme NAME", with these nvme config keys: '
        'threads=\'{"io_engine": "threads"}\' (repeatable)',
    )
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"), help="directory for vllm.json and vllm.md")
    args = ap.parse_args(argv)
    args.fs_variant = dict(args.fs_variant)
    args.nvme_variant = dict(args.nvme_variant)
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "vllm.json").write_text(json.dumps(report, indent=2) + "\n")
    md = markdown(report)
    (out / "vllm.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
