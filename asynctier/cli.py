"""The ``asynctier`` command line."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from .factory import SecondaryTierFactory, TierInfo, accepted_parameters
from .spec import OffloadingSpec

__all__ = ["main"]


def _run(coro: Any) -> Any:
    """Run on uvloop when installed (what servers use), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)
    return uvloop.run(coro)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="asynctier")
def main() -> None:
    """asynctier: move KV-cache chunks between a primary buffer and storage tiers, from asyncio."""


def _describe(info: TierInfo) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": info.tier_type,
        "class": f"{info.module_path}.{info.class_name}",
        "source": info.source,
    }
    try:
        cls = SecondaryTierFactory.get_tier_class({"type": info.tier_type})
    except Exception as e:  # a tier whose module or client library is missing
        out["error"] = str(e)
        return out
    params = {}
    for name, p in sorted(accepted_parameters(cls).items()):
        params[name] = "required" if p.default is inspect.Parameter.empty else repr(p.default)
    out["parameters"] = params
    out["doc"] = (inspect.getdoc(cls) or "").split("\n")[0]
    return out


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def info(as_json: bool) -> None:
    """List the registered tiers, where each comes from, and its parameters."""
    tiers = [_describe(i) for i in SecondaryTierFactory.registered()]
    if as_json:
        click.echo(json.dumps(tiers, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="asynctier tiers", show_lines=True)
    for col in ("type", "class", "source", "parameters (default)"):
        table.add_column(col, overflow="fold")
    for t in tiers:
        params = t.get("error") or ", ".join(f"{k}={v}" for k, v in t["parameters"].items())
        table.add_row(t["type"], t["class"], t["source"], params)
    Console().print(table)


async def _selfcheck(config: dict[str, Any], chunk_bytes: int, num_chunks: int) -> dict[str, Any]:
    spec = OffloadingSpec(chunk_bytes, num_chunks, namespace="asynctier/selfcheck")
    buf = bytearray(os.urandom(spec.total_bytes))
    original = bytes(buf)
    view = memoryview(buf)
    keys = [f"selfcheck-{os.getpid()}-{i}".encode() for i in range(num_chunks)]
    ids = list(range(num_chunks))
    tier = SecondaryTierFactory.create_secondary_tier(config, view, spec)
    async with tier:
        t0 = time.perf_counter()
        res = await tier.offload(keys, ids)
        t_off = time.perf_counter() - t0
        res.raise_for_failures()
        hits = await tier.lookup(keys)
        if not all(hits):
            raise click.ClickException(f"lookup missed {hits.count(False)} of {len(keys)} stored chunks")
        buf[:] = bytes(len(buf))
        t0 = time.perf_counter()
        res = await tier.load(keys, ids[::-1])
        t_load = time.perf_counter() - t0
        res.raise_for_failures()
        c = chunk_bytes
        for i, slot in enumerate(ids[::-1]):
            if view[slot * c : (slot + 1) * c] != original[i * c : (i + 1) * c]:
                raise click.ClickException(f"chunk {i} came back different")
        await tier.remove(keys)
        stats = tier.stats()
    return {
        "tier": config["type"],
        "chunks": num_chunks,
        "chunk_bytes": chunk_bytes,
        "offload_GBps": spec.total_bytes / t_off / 1e9,
        "load_GBps": spec.total_bytes / t_load / 1e9,
        "peak_in_flight": stats.peak_in_flight,
        "failed": stats.failed,
    }


@main.command()
@click.option("--tier", "tier_type", default="memory", show_default=True, help="Tier type to check.")
@click.option("--chunk-bytes", type=click.IntRange(min=1), default=256 * 1024, show_default=True)
@click.option("--chunks", "num_chunks", type=click.IntRange(min=1), default=256, show_default=True)
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="A tier parameter (repeatable), for example --param root=/mnt/cache; VALUE is read as JSON "
    "when it parses, else as a string.",
)
def selfcheck(tier_type: str, chunk_bytes: int, num_chunks: int, params: tuple[str, ...]) -> None:
    """Round-trip random chunks through a tier and verify every byte."""
    from .errors import TierConfigError
    from .stats import TransferFailedError

    config: dict[str, Any] = {"type": tier_type}
    for item in params:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE; got {item!r}", param_hint="--param")
        try:
            config[key.strip()] = json.loads(raw)
        except ValueError:
            config[key.strip()] = raw
    try:
        report = _run(_selfcheck(config, chunk_bytes, num_chunks))
    except TierConfigError as e:
        raise click.UsageError(f"{e} (tier parameters go in with --param KEY=VALUE)") from None
    except (TransferFailedError, OSError) as e:
        raise click.ClickException(f"selfcheck failed: {e}") from None
    click.echo(
        f"selfcheck ok: {report['chunks']} x {report['chunk_bytes']} B through {report['tier']!r}: "
        f"offload {report['offload_GBps']:.2f} GB/s, load {report['load_GBps']:.2f} GB/s, "
        f"peak in flight {report['peak_in_flight']}, failures {report['failed']}"
    )


def _csv(
    kind: str, parse: Callable[[str], int]
) -> Callable[[click.Context, click.Parameter, str | None], list[int] | None]:
    """A click callback parsing a comma-separated list of positive ints (sizes or depths)."""

    def cb(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
        if value is None:
            return None
        try:
            out = [parse(v) for v in value.split(",") if v.strip()]
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
        if not out or any(v <= 0 for v in out):
            raise click.BadParameter(f"expected a comma-separated list of positive {kind}")
        return out

    return cb


def _int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError(f"not an int: {v!r}")
    return int(v)


def _listed(key: str, value: Any, parse: Callable[[Any], int]) -> list[int]:
    """A ``[bench]`` list (or comma-separated string) of positive ints, checked as its option is."""
    items = [v for v in value.split(",") if v.strip()] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"[bench] {key} must be a list or a comma-separated string; got {value!r}")
    try:
        out = [parse(v) for v in items]
    except (ValueError, TypeError) as e:
        raise ValueError(f"[bench] {key}: {e}") from None
    if not out or any(v <= 0 for v in out):
        raise ValueError(f"[bench] {key} must hold positive values; got {value!r}")
    return out


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    from .bench import parse_size

    try:
        return parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def _parse_size(v: str) -> int:
    from .bench import parse_size

    return parse_size(v)


def _command_line(ctx: click.Context) -> str:
    """The command as typed (for the report): the real argv when run as ``asynctier``, else
    rebuilt from the options given explicitly (``bench/bench_throughput.py``, tests)."""
    if os.path.basename(sys.argv[0]) == "asynctier" and ctx.info_name in sys.argv[1:]:
        import shlex

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
        else:
            original = raw
            if param.name in ("chunk_sizes",):
                from .bench import format_size

                original = ",".join(format_size(v).replace(" ", "").replace("iB", "") for v in raw)
            elif param.name == "depths":
                original = ",".join(map(str, raw))
            elif param.name == "data_size":
                from .bench import format_size

                original = format_size(raw).replace(" ", "").replace("iB", "")
            parts.append(f"{flag} {original}")
    return " ".join(parts)


@main.command()
@click.option(
    "--tier",
    "tier_names",
    multiple=True,
    metavar="NAME",
    help="Tier to run (repeatable): a [tiers.NAME] of --config, or a tier type "
    "(fs, nvme, obj, memory, an entry point). Default: every tier of --config, else fs, nvme and obj.",
)
@click.option(
    "--root",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory for the tiers' files, fio and the naive loop. Default: a temporary directory.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="TOML tier file: [tiers.NAME] tables ('{dir}' = a fresh directory per point), optional [bench].",
)
@click.option(
    "--chunk-sizes",
    callback=_csv("sizes", _parse_size),
    default=None,
    metavar="LIST",
    help="Chunk sizes to sweep.  [default: 256K,2M,16M]",
)
@click.option(
    "--depths",
    callback=_csv("ints", int),
    default=None,
    metavar="LIST",
    help="Depths (chunk I/Os in flight) to sweep.  [default: 1,4,16]",
)
@click.option(
    "--data-size",
    callback=_size,
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
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="Write every figure as JSON.")
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write a PNG plot (needs matplotlib: the 'bench' extra).",
)
@click.option(
    "--markdown",
    "md_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the results as markdown (command line, machine, tables).",
)
@click.option("-q", "--quiet", is_flag=True, help="No live progress.")
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
    json_path: str | None,
    plot_path: str | None,
    md_path: str | None,
    quiet: bool,
) -> None:
    """Offload, look up, load back and verify chunks through each tier; compare with fio and a naive loop.

    With no arguments: an fs tier and an nvme slab in a temporary directory and an obj tier
    on file://, 256K/2M/16M chunks at depths 1, 4 and 16. Exits non-zero when a chunk failed
    or came back different, or when no tier could run.
    """
    from . import bench as B

    ctx = click.get_current_context()
    try:
        tfile = B.load_tier_file(config_path) if config_path else None
        defaults = tfile.bench if tfile else {}
        unknown = sorted(set(defaults) - {"chunk_sizes", "depths", "data_size"})
        if unknown:
            raise click.BadParameter(f"[bench]: unknown keys {unknown}", param_hint="--config")
        sizes = chunk_sizes or _listed("chunk_sizes", defaults.get("chunk_sizes", B.DEFAULT_CHUNK_SIZES), B.parse_size)
        deps = depths or _listed("depths", defaults.get("depths", B.DEFAULT_DEPTHS), _int)
        data = data_size or B.parse_size(defaults.get("data_size", B.DEFAULT_DATA_BYTES))
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    for what, out in (("--json", json_path), ("--markdown", md_path), ("--plot", plot_path)):
        # checked before a run of minutes, not after it
        parent = Path(out).parent if out else None
        if parent is not None and not (parent.is_dir() and os.access(parent, os.W_OK)):
            raise click.BadParameter(f"cannot write {out!r}: {parent} is not a writable directory", param_hint=what)
    opts = B.BenchOptions(
        tiers=B.resolve_tiers(tier_names, tfile),
        chunk_sizes=sizes,
        depths=deps,
        data_bytes=data,
        root=root,
        fio=use_fio,
        fio_engines=[e.strip() for e in fio_engines.split(",") if e.strip()],
        naive=naive,
        repeat=repeat,
        command=_command_line(ctx),
    )
    from rich.console import Console

    console = Console()
    if not console.is_terminal:  # a file or a pipe: do not squeeze the table into 80 columns
        console = Console(width=200)
    report = _run(_bench_with_progress(B, opts, quiet))
    for r in B.render_tables(report):
        console.print(r)
    if json_path:
        Path(json_path).write_text(json.dumps(report.as_dict(), indent=2) + "\n")
        click.echo(f"wrote {json_path}")
    if md_path:
        Path(md_path).write_text(B.render_markdown(report))
        click.echo(f"wrote {md_path}")
    if plot_path:
        try:
            B.write_plot(report, plot_path)
        except ImportError:
            click.echo("--plot needs matplotlib: pip install 'asynctier[bench]'", err=True)
            sys.exit(1)
        click.echo(f"wrote {plot_path}")
    if not report.points:
        click.echo("no tier ran (see the skipped tiers above)", err=True)
        sys.exit(1)
    if not report.ok:
        sys.exit(1)


async def _bench_with_progress(B: Any, opts: Any, quiet: bool) -> Any:
    if quiet:
        return await B.run_bench(opts)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("starting", total=B.total_steps(opts))

        def step(desc: str, done: bool) -> None:
            if done:
                progress.advance(task)
            else:
                progress.update(task, description=desc)

        return await B.run_bench(opts, step)


@main.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    required=True,
    help="TOML tier file: [spec] (chunk_bytes, namespace) and the tier(s) to check.",
)
@click.option("--tier", "tier_names", multiple=True, metavar="NAME", help="Check only these [tiers.NAME] (repeatable).")
@click.option("--chunk-bytes", callback=_size, default=None, metavar="SIZE", help="Override [spec] chunk_bytes.")
@click.option("--namespace", default=None, help="Override [spec] namespace.")
@click.option("--remove", is_flag=True, help="Delete the chunks that fail verification.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def fsck(
    config_path: str,
    tier_names: tuple[str, ...],
    chunk_bytes: int | None,
    namespace: str | None,
    remove: bool,
    as_json: bool,
) -> None:
    """Verify every stored chunk of a tier (header, length, layout, checksum); report or remove bad ones.

    Exit status: 0 when every chunk is good (or every bad one was removed), 1 when bad chunks
    remain or chunks could not be read, 2 for a usage or configuration error.
    """
    from . import bench as B
    from .errors import TierConfigError

    try:
        tfile = B.load_tier_file(config_path)
        table = dict(tfile.spec)
        if chunk_bytes is not None:
            table["chunk_bytes"] = chunk_bytes
        if namespace is not None:
            table["namespace"] = namespace
        spec = B.spec_from_table(table)
        missing = [n for n in tier_names if n not in tfile.tiers]
        if missing:
            raise TierConfigError(f"no [tiers.{missing[0]}] in {config_path}; it has: {', '.join(tfile.tiers)}")
        selected = {n: tfile.tiers[n] for n in (tier_names or tfile.tiers)}
        for n, cfg in selected.items():
            if B.uses_placeholders(cfg):
                raise TierConfigError(
                    f"[tiers.{n}] uses bench placeholders ({{dir}}, {{capacity}}): fsck needs real paths"
                )
    except (TierConfigError, ValueError) as e:
        raise click.UsageError(str(e)) from None

    async def check_all() -> list[Any]:
        out = []
        for n, cfg in selected.items():
            out.append(await B.fsck(n, cfg, spec, remove=remove))
        return out

    try:
        reports = _run(check_all())
    except TierConfigError as e:
        raise click.UsageError(str(e)) from None
    except OSError as e:  # a root that is a file, no permission, a failing disk: said, not a traceback
        raise click.ClickException(f"cannot check: {e}") from None
    clean = all(r.clean for r in reports)
    if as_json:
        click.echo(json.dumps([{**asdict(r), "clean": r.clean} for r in reports], indent=2))
    else:
        for r in reports:
            state = "clean" if r.clean else "NOT CLEAN"
            click.echo(
                f"{r.tier}: {r.checked} chunks checked, {r.ok} good, {len(r.bad)} bad"
                f"{f', {r.removed} removed' if r.removed else ''}"
                f"{f' ({r.dropped_by_tier} already dropped by the tier itself)' if r.dropped_by_tier else ''}"
                f"{f', {r.vanished} vanished while checking' if r.vanished else ''}"
                f"{f', {len(r.errors)} unreadable' if r.errors else ''}: {state}"
            )
            for k, why in r.bad.items():
                click.echo(f"  bad {k}: {why}{' (removed)' if remove else ''}")
            for k, why in r.errors.items():
                click.echo(f"  unreadable {k}: {why}")
            if not r.checked:
                click.echo(f"{r.tier}: no chunks stored under this layout (chunk_bytes, namespace)", err=True)
        if not clean and any(r.bad and not r.removed for r in reports):
            click.echo("run again with --remove to delete the bad chunks", err=True)
    sys.exit(0 if clean else 1)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
