"""The ``asynctier bench`` command: options, the checks made before any byte moves, the plan
and the bar, the tables, the files, and the exit status."""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import click

from ...core import MAX_INFLIGHT
from ...errors import TierConfigError
from ..exits import EXIT_CODES_HELP, CliError, ExitCode
from ..options import csv_callback, import_path_option, listed, positive_int, run_async, size_callback
from ..roots import check_creatable
from ..sizes import parse_size, short_size
from ..tierfile import TierFile, load_tier_file, resolve_tiers, substitute
from .plan import DEFAULT_CHUNK_SIZES, DEFAULT_DATA_BYTES, DEFAULT_DEPTHS, BenchOptions, Plan

__all__ = ["bench"]


def _command_line(ctx: click.Context) -> str:
    """The command as typed (for the report): the real argv when run as ``asynctier``, else
    rebuilt from the options given explicitly (``bench/bench_throughput.py``, tests)."""
    if os.path.basename(sys.argv[0]) == "asynctier" and ctx.info_name in sys.argv[1:]:
        return " ".join(["asynctier", *(shlex.quote(a) for a in sys.argv[1:])])
    parts = ["asynctier", ctx.info_name or "bench"]
    for param in ctx.command.params:
        if not isinstance(param, click.Option) or param.name is None:
            continue
        if ctx.get_parameter_source(param.name) != click.core.ParameterSource.COMMANDLINE:
            continue
        raw = ctx.params[param.name]
        flag = param.opts[0]
        if param.is_flag:
            parts.append(flag if raw else (param.secondary_opts or [flag])[0])
        elif param.multiple:
            parts += [f"{flag} {v}" for v in raw]
        elif param.name == "chunk_sizes":
            parts.append(f"{flag} {','.join(short_size(v) for v in raw)}")
        elif param.name == "depths":
            parts.append(f"{flag} {','.join(map(str, raw))}")
        elif param.name == "data_size":
            parts.append(f"{flag} {short_size(raw)}")
        else:
            parts.append(f"{flag} {raw}")
    return " ".join(parts)


def _sweep(
    tfile: TierFile | None, chunk_sizes: list[int] | None, depths: list[int] | None, data_size: int | None
) -> tuple[list[int], list[int], int]:
    """Chunk sizes, depths and bytes per point: the options, else the tier file's [bench], else defaults."""
    defaults = tfile.bench if tfile else {}
    unknown = sorted(set(defaults) - {"chunk_sizes", "depths", "data_size"})
    if unknown:
        raise click.BadParameter(f"[bench]: unknown keys {unknown}", param_hint="--config")
    sizes = chunk_sizes or listed("chunk_sizes", defaults.get("chunk_sizes", DEFAULT_CHUNK_SIZES), parse_size)
    deps = depths or listed("depths", defaults.get("depths", DEFAULT_DEPTHS), positive_int)
    data = data_size or parse_size(defaults.get("data_size", DEFAULT_DATA_BYTES))
    if max(deps) > MAX_INFLIGHT:  # (a tier refuses it: said now, not as a failed point after the run began)
        raise click.BadParameter(f"depths must be at most {MAX_INFLIGHT} (a tier's max_inflight); got {max(deps)}",
                                 param_hint="--depths")  # fmt: skip
    return sizes, deps, data


def _check_outputs(outputs: dict[str, str | None]) -> None:
    """Every file asked for can be written, and --plot can draw: said now, not after the run."""
    for flag, out in outputs.items():
        if not out:
            continue
        p = Path(out)
        if p.is_dir():
            raise click.BadParameter(f"cannot write {out!r}: it is a directory", param_hint=flag)
        if p.exists():
            if not os.access(p, os.W_OK):
                raise click.BadParameter(f"cannot write {out!r}: no permission", param_hint=flag)
        elif not (p.absolute().parent.is_dir() and os.access(p.absolute().parent, os.W_OK)):
            raise click.BadParameter(f"cannot write {out!r}: {p.parent} is not a writable directory", param_hint=flag)
    if outputs.get("--plot") and importlib.util.find_spec("matplotlib") is None:
        raise click.BadParameter("needs matplotlib: pip install 'asynctier[bench]'", param_hint="--plot")


def _check_tiers(opts: BenchOptions, named: tuple[str, ...], tfile: TierFile | None, plan: Plan) -> None:
    """Tiers named with --tier must resolve; every tier that resolves must accept its config.

    Tiers run by default (all of --config, or fs, nvme and obj) that cannot be imported are
    skipped and reported instead: a default run works on an install without the extras.
    """
    from ...factory import SecondaryTierFactory
    from ...posix_io import aligned_buffer
    from ...spec import OffloadingSpec
    from .point import capacity_for

    for name in named:
        if name in plan.skipped:
            where = (
                f"neither a [tiers.{name}] of {tfile.path} nor a tier type" if tfile and name not in tfile.tiers else ""
            )
            raise click.BadParameter(
                f"{name!r}: {where + ': ' if where else ''}{plan.skipped[name]}", param_hint="--tier"
            )
    chunk, depth = min(opts.chunk_sizes), min(opts.depths)
    chunks = opts.chunks_for(chunk, depth)
    spec = OffloadingSpec(chunk, 1, namespace="asynctier/bench/check")
    for name in plan.tiers:  # a constructor does no I/O (the contract): this builds and drops
        cfg = substitute(
            opts.tiers[name],
            {"dir": Path(opts.root or "/nonexistent") / "check", "capacity": capacity_for(chunks, chunk)},
        )
        try:
            SecondaryTierFactory.create_secondary_tier(cfg, aligned_buffer(chunk), spec)
            # a root given as it is (not under --root) is made only where its parent exists
            check_creatable(f"[tiers.{name}]", opts.tiers[name], placeholders=True)
        except TierConfigError as e:
            raise click.BadParameter(f"{name!r}: {e}", param_hint="--tier" if name in named else "--config") from None
        except Exception:  # anything else shows at the tier's first point, as a failed point
            pass
    need, have = opts.max_point_bytes(), _memory_bytes()
    if have and need > have:
        raise click.BadParameter(
            f"a point needs a primary buffer of {need} bytes, more than this machine's memory ({have}); "
            "use a smaller --data-size",
            param_hint="--data-size",
        )


def _memory_bytes() -> int:
    """This machine's memory in bytes (0: unknown)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def _write_outputs(report: Any, outputs: dict[str, str | None], said: list[str]) -> list[str]:
    """Write every file asked for; returns one line per file that could not be written (said
    on stderr at once); ``said`` gets the lines for stdout (the files written)."""
    from .outputs import write_json, write_markdown, write_plot

    writers: dict[str, Callable[[Any, str], None]] = {
        "--json": write_json,
        "--markdown": write_markdown,
        "--plot": write_plot,
    }
    failed: list[str] = []
    for flag, path in outputs.items():
        if not path:
            continue
        try:
            writers[flag](report, path)
        except (OSError, ValueError, ImportError) as e:
            failed.append(f"could not write {flag} {path}: {e}")
            click.echo(failed[-1], err=True)
        else:
            said.append(f"wrote {path}")
    return failed


def _run(opts: BenchOptions, plan: Plan, quiet: bool) -> Any:
    """The plan on stderr, the run under a progress bar (neither with ``quiet``), the report."""
    from ..console import progress_console
    from .progress import BarProgress
    from .runner import run_bench

    bar: BarProgress | None = None
    if not quiet:
        err = progress_console()
        for line in plan.describe():
            err.print(line, markup=False, highlight=False)
        bar = BarProgress(plan.total_bytes, err)
    try:
        with bar or nullcontext():
            return run_async(run_bench(opts, bar, plan))
    except OSError as e:  # the root vanished, the disk filled up outside a tier's own calls
        raise CliError(f"bench could not go on: {e}", ExitCode.CANNOT_RUN) from None


@click.command(epilog=EXIT_CODES_HELP)
@click.option(
    "--tier",
    "tier_names",
    multiple=True,
    metavar="NAME",
    help="Tier to run (repeatable): a [tiers.NAME] of --config, or a tier type (fs, nvme, obj, memory, chain: "
    "memory in front of fs, an entry point); checked before anything runs. Default: every tier of --config, else "
    "fs, nvme and obj (a default tier that cannot be imported is skipped).",
)
@click.option(
    "--root",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory for the tiers' files, fio and the naive loop; created only when its parent exists. "
    "Default: a temporary directory.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="TOML tier file: [tiers.NAME] tables ('{dir}' = a fresh directory per point), optional [bench]; "
    'sizes may be written as sizes (capacity_bytes = "64MiB").',
)
@click.option(
    "--chunk-sizes",
    callback=csv_callback("sizes", parse_size),
    default=None,
    metavar="LIST",
    help="Chunk sizes to sweep.  [default: 256K,2M,16M]",
)
@click.option(
    "--depths",
    callback=csv_callback("ints", int),
    default=None,
    metavar="LIST",
    help="Depths (chunk I/Os in flight) to sweep.  [default: 1,4,16]",
)
@click.option(
    "--data-size",
    callback=size_callback,
    default=None,
    metavar="SIZE",
    help="Bytes moved per tier, chunk size and depth (at least 2 chunks per unit of depth).  [default: 128M]",
)
@click.option("--fio/--no-fio", "use_fio", default=True, help="Measure fio (when installed) in the same run.")
@click.option(
    "--fio-engines",
    default="io_uring,psync",
    show_default=True,
    help="fio engines to try; each ratio is to the best of them.",
)
@click.option("--naive/--no-naive", default=True, help="Measure the naive aiofiles loop in the same run.")
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Measure every point this many times, interleaved, and report each phase's median run.",
)
@click.option(
    "--steady",
    is_flag=True,
    help="Also offload into a full tier (half the point's chunks fill it, the other half each evict one): "
    "the steady state of a cache, beside the empty-tier figure.",
)
@click.option(
    "--steady-passes",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="With --steady: offload this many untimed passes of new keys into the full tier first, so that the "
    "timed pass sees a tier that has lived at capacity (a tier's first pass over a full tier may cost less "
    "than its later ones).",
)
@click.option(
    "--huge-pages/--no-huge-pages",
    default=True,
    show_default=True,
    help="Put the primary buffer on transparent huge pages where the system has them, as "
    "asynctier.buffers.allocate_buffer does (an O_DIRECT transfer then hands the device one segment "
    "per chunk, not one per 4 KiB page); --no-huge-pages: ordinary 4 KiB pages.",
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write every figure as JSON.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a PNG plot (needs matplotlib: pip install 'asynctier[bench]').",
)
@click.option(
    "--markdown",
    "md_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the results as markdown (command line, machine, tables).",
)
@click.option("-q", "--quiet", is_flag=True, help="No plan and no progress bar (the results still print).")
@import_path_option
def bench(
    tier_names: tuple[str, ...],
    root: str | None,
    config_path: str | None,
    chunk_sizes: list[int] | None,
    depths: list[int] | None,
    data_size: int | None,
    use_fio: bool,
    fio_engines: str,
    naive: bool,
    repeat: int,
    steady: bool,
    steady_passes: int,
    huge_pages: bool,
    json_path: str | None,
    plot_path: str | None,
    md_path: str | None,
    quiet: bool,
) -> None:  # long: the signature names the 17 options; the body is checks, run, files, exit status
    """Offload, look up, load back and verify chunks through each tier; compare with fio and a naive loop.

    With no arguments: an fs tier and an nvme slab in a temporary directory and an obj tier
    on file://, 256K/2M/16M chunks at depths 1, 4 and 16.
    Before anything runs, the options, the tiers, --root and every output file are checked,
    and the plan is shown (points, bytes to move, a rough time); then a progress bar with an
    ETA. Tables fit the terminal (COLUMNS when piped); --json and --markdown hold every column.
    """
    from ..roots import usable_directory
    from .runner import make_plan

    outputs = {"--json": json_path, "--markdown": md_path, "--plot": plot_path}
    try:
        tfile = load_tier_file(config_path) if config_path else None
        sizes, deps, data = _sweep(tfile, chunk_sizes, depths, data_size)
        if steady_passes and not steady:
            raise click.BadParameter(
                f"{steady_passes} passes into a full tier need --steady (which times one)", param_hint="--steady-passes"
            )
        _check_outputs(outputs)
        opts = BenchOptions(
            tiers=resolve_tiers(tier_names, tfile),
            chunk_sizes=sizes,
            depths=deps,
            data_bytes=data,
            root=root,
            fio=use_fio,
            fio_engines=[e.strip() for e in fio_engines.split(",") if e.strip()],
            naive=naive,
            repeat=repeat,
            steady=steady,
            steady_passes=steady_passes,
            huge_pages=huge_pages,
            command=_command_line(click.get_current_context()),
        )
        from ..valkey_server import with_local_valkey

        opts.tiers = with_local_valkey(opts.tiers, opts.max_point_bytes(), click.get_current_context().call_on_close)
        plan = make_plan(opts)
        _check_tiers(opts, tier_names, tfile, plan)
        if root is not None:  # last: the one check that may create something (the root itself)
            try:
                usable_directory(root)
            except TierConfigError as e:
                raise click.BadParameter(str(e), param_hint="--root") from None
    except (TierConfigError, ValueError) as e:  # BadParameter is a UsageError, not a ValueError: it passes
        raise click.UsageError(str(e)) from None
    report = _run(opts, plan, quiet)
    from ..console import output_console
    from .tables import render_tables

    said: list[str] = []
    failed_outputs = _write_outputs(report, outputs, said)  # first: a reader may close stdout early
    out = output_console()
    for renderable in render_tables(report, out.width):
        out.print(renderable)
    for line in said:
        click.echo(line)
    if not report.points:
        raise CliError("no tier ran (see the skipped tiers above)", ExitCode.CANNOT_RUN)
    if not report.ok:
        bad = [p for p in report.points if not p.ok]
        if all(p.failed_at_open for p in bad):  # nothing moved: the medium would not open
            raise CliError(
                f"{len(bad)} of {len(report.points)} points: the tier could not be built or opened (see FAILED above)",
                ExitCode.CANNOT_RUN,
            )
        raise CliError(
            f"{len(bad)} of {len(report.points)} points did not verify (see FAILED above)", ExitCode.NOT_VERIFIED
        )
    if failed_outputs:
        raise CliError(f"{len(failed_outputs)} output file(s) could not be written", ExitCode.OUTPUT_FAILED)
