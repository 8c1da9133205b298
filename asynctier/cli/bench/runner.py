"""The sweep: every tier at every point, references first, repeats interleaved; the report."""

from __future__ import annotations

import asyncio
import datetime as _dt
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import TierConfigError
from ...factory import SecondaryTierFactory
from .. import benchkit
from ..tierfile import nested_configs, redact
from .plan import CHUNKS_PER_DEPTH, BenchOptions, Plan
from .point import PointRun
from .primary import PrimaryBuffer
from .progress import NoProgress, Progress
from .references import FioState, run_references
from .results import BenchReport, PointResult, RefResult, median_point, median_ratios, median_ref, ratios, summarize

__all__ = ["check_tiers", "make_plan", "run_bench"]


def check_tiers(tiers: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Which tiers can run: a missing module or client library means 'skipped', not a crash."""
    status: dict[str, dict[str, Any]] = {}
    for name, cfg in tiers.items():
        entry: dict[str, Any] = {"config": redact(cfg)}
        try:
            cls = SecondaryTierFactory.get_tier_class(cfg)
            for inner in nested_configs(cfg)[1:]:  # a chain runs only when each of its tiers can
                SecondaryTierFactory.get_tier_class(inner)
        except (TierConfigError, ImportError) as e:
            entry.update(status="skipped", reason=str(e))
        else:
            entry.update(status="ok", cls=f"{cls.__module__}.{cls.__qualname__}")
        status[name] = entry
    return status


def make_plan(opts: BenchOptions, status: Mapping[str, Mapping[str, Any]] | None = None) -> Plan:
    """The plan of a run of ``opts``: the tiers that can run, those skipped, the fio engines."""
    status = check_tiers(opts.tiers) if status is None else status
    return Plan(
        opts=opts,
        tiers=[n for n, s in status.items() if s["status"] == "ok"],
        skipped={n: str(s.get("reason")) for n, s in status.items() if s["status"] != "ok"},
        fio_engines=list(opts.fio_engines) if opts.fio and benchkit.fio_available() else [],
    )


def _fs_type(path: Path) -> str:
    """The file system type holding ``path`` (longest mount prefix in /proc/mounts)."""
    best, fstype = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                    best, fstype = parts[1], parts[2]
    except OSError:
        pass
    return fstype


def _loop_name() -> str:
    loop = asyncio.get_running_loop()
    mod = type(loop).__module__.split(".")[0]
    if mod == "uvloop":
        import uvloop

        return f"uvloop {getattr(uvloop, '__version__', '?')}"
    return f"asyncio ({type(loop).__name__})"


def _new_report(
    opts: BenchOptions, status: dict[str, dict[str, Any]], root: Path, primary: PrimaryBuffer
) -> BenchReport:
    return BenchReport(
        started=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        command=opts.command,
        machine={
            **benchkit.machine_info(),
            "event_loop": _loop_name(),
            "primary_buffer": primary.kind,
            "primary_buffer_huge_share": primary.huge_share,
            "root": str(root),
            "root_fs": _fs_type(root),
        },
        options={
            "chunk_sizes": list(opts.chunk_sizes),
            "depths": list(opts.depths),
            "huge_pages": opts.huge_pages,
            "data_bytes_per_point": opts.data_bytes,
            "chunks_per_depth_min": CHUNKS_PER_DEPTH,
            "fio": opts.fio and benchkit.fio_available(),
            "fio_engines": list(opts.fio_engines),
            "naive": opts.naive,
            "repeat": opts.repeat,
            "steady": opts.steady,
            "steady_passes": opts.steady_passes,
        },
        tiers=status,
    )


async def _sweep_point(
    plan: Plan, report: BenchReport, primary: PrimaryBuffer, point: tuple[int, int], ctx: dict[str, Any]
) -> None:
    """Every tier (and the references) at one (chunk size, depth), ``repeat`` times, interleaved
    (references, then each tier, again) so that drift hits them all alike."""
    opts, (chunk, depth) = plan.opts, point
    chunks, probe = opts.chunks_for(chunk, depth), opts.probe_chunks(chunk, depth)
    fio: FioState | None = ctx["fio"]
    ref_runs: list[RefResult] = []
    tier_runs: dict[str, list[PointResult]] = {n: [] for n in plan.tiers}
    for _ in range(opts.repeat):
        if opts.fio or opts.naive:
            ref_runs.append(
                await run_references(
                    primary, chunk, depth, chunks, ctx["workdir"], fio, opts.naive, ctx["progress"], opts.steady
                )
            )
        for name in plan.tiers:
            run = PointRun(
                name,
                opts.tiers[name],
                primary,
                (chunk, depth, chunks, probe),
                ctx["workdir"],
                ctx["run_id"],
                ctx["progress"],
                steady=opts.steady,
                steady_passes=opts.steady_passes,
            )
            tier_runs[name].append(await run.run())
    ref = median_ref(ref_runs) if ref_runs else None
    if ref is not None:
        report.references.append(ref)
    for name in plan.tiers:
        pr = median_point(tier_runs[name])
        if ref is not None:  # each repetition's ratio to its own references, then their median
            pr.ratios = median_ratios(list(zip(tier_runs[name], ref_runs))) if pr.ok else ratios(pr, ref)
        report.points.append(pr)


async def run_bench(opts: BenchOptions, progress: Progress | None = None, plan: Plan | None = None) -> BenchReport:
    """Run the sweep described by ``opts`` and return every figure.

    Tiers that cannot be imported are reported as skipped; a tier that fails at a point has
    that point marked failed (``ok=False`` with the error) and the run goes on. ``progress``
    hears of each phase and of the bytes done (the plan's :attr:`~.plan.Plan.total_bytes` in
    all). An ``OSError`` outside the tiers' own calls (the root, the buffer) is raised.
    """
    t_start = time.perf_counter()
    status = check_tiers(opts.tiers)
    plan = plan or make_plan(opts, status)
    own_root = opts.root is None
    root = Path(tempfile.mkdtemp(prefix="asynctier-bench-")) if own_root else Path(opts.root or ".")
    root.mkdir(exist_ok=True)  # a missing --root is made only when its parent exists
    run_id = f"{os.getpid()}-{int(time.time() * 1000)}"
    workdir = Path(tempfile.mkdtemp(prefix=f"run-{run_id}-", dir=root))
    prog = progress or NoProgress()
    fio = FioState(plan.fio_engines) if opts.fio else None
    try:
        prog.phase("allocating and filling the primary buffer")
        primary = await asyncio.to_thread(PrimaryBuffer, opts.max_point_bytes(), opts.huge_pages)
        report = _new_report(opts, status, root, primary)
        ctx = {"fio": fio, "workdir": workdir, "run_id": run_id, "progress": prog}
        for point in opts.points():
            await _sweep_point(plan, report, primary, point, ctx)
    except BaseException:  # interrupted: what runs on threads ends now, not at the process's exit
        benchkit.stop_settling()
        raise
    finally:
        if fio is not None:  # (an interrupted run: its fio job must not outlive the directory)
            await asyncio.to_thread(fio.stop)
        await asyncio.to_thread(shutil.rmtree, workdir, True)
        if own_root:
            await asyncio.to_thread(shutil.rmtree, root, True)
    notes = ["fio is not installed: no fio ratios"] if opts.fio and not benchkit.fio_available() else []
    notes += fio.notes if fio else []
    report.summary = summarize(report, notes)
    report.wall_s = time.perf_counter() - t_start
    return report
