"""``asynctier fsck``: verify every chunk a tier holds (header, length, layout, checksum) and
report or remove the bad ones."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click

from ..errors import ChunkError, TierConfigError, TierStateError
from ..factory import SecondaryTierFactory, accepted_parameters
from ..spec import OffloadingSpec
from .exits import EXIT_CODES_HELP, CliError, ExitCode
from .fsck_targets import NOT_PERSISTENT, CheckTarget, check_targets, require_chunk_tier
from .options import import_path_option, run_async, size_callback
from .roots import check_exists
from .tierfile import load_tier_file, spec_from_table, uses_placeholders

__all__ = ["FsckReport", "fsck", "fsck_tier"]


@dataclass
class FsckReport:
    """What ``asynctier fsck`` found in one tier (a ``[tiers.NAME]`` table or a member of a chain)."""

    tier: str
    #: For a member of a chain: the chain's name for it (``tier`` is then ``kv.tiers[1]``).
    member: str | None = None
    #: Why this member was not checked (one in process memory), else None.
    skipped: str | None = None
    checked: int = 0
    ok: int = 0
    bad: dict[str, str] = field(default_factory=dict)  # key (hex) -> why
    removed: int = 0
    #: Bad chunks the tier dropped by itself when they failed verification (without ``remove``).
    dropped_by_tier: int = 0
    vanished: int = 0
    errors: dict[str, str] = field(default_factory=dict)  # key (hex) -> I/O error
    #: Chunk files of the wrong size (truncated) that the tier's own scan removed as it opened:
    #: the fs tier never serves one, and fsck cannot open it without that scan.
    removed_at_open: int = 0
    #: Temporary files of dead writers (unpublished stores, a recycled file caught mid-way)
    #: that the tier's own scan removed as it opened: no chunk was lost, so it stays clean.
    temporaries_removed_at_open: int = 0
    #: Whether removal was asked for (then those count as bad chunks removed).
    remove: bool = False
    #: Why the tier could not be opened for checking though it is there: damage found at open
    #: that loses chunks (a damaged or truncated slab, a lost index), said and left as it is.
    damaged: str | None = None
    #: Why the tier could not be checked (its medium could not be opened or listed: a server
    #: down, no permission); the other tiers of the run are still checked and reported.
    cannot_check: str | None = None
    #: ``cannot_check`` is the tier refusing its config at open (a medium of another layout)
    refused_config: bool = False

    @property
    def clean(self) -> bool:
        """No bad chunk left behind, none removed unasked, and no chunk unreadable."""
        return (
            (not self.bad or self.removed == len(self.bad))
            and not self.errors
            and (self.remove or not self.removed_at_open)
            and self.damaged is None
            and self.cannot_check is None
        )


def _check_layout_exists(where: str, tier: Any, spec: OffloadingSpec) -> None:
    """A tier that keeps a directory per layout (fs) has one for ``spec``, else the spec is
    not the one the chunks were written with (opening would make an empty one)."""
    layout_dir = getattr(tier, "dir", None)
    if isinstance(layout_dir, Path) and layout_dir.parent.exists() and not layout_dir.parent.is_dir():
        raise TierConfigError(f"{where}: {str(layout_dir.parent)!r} is not a directory: no tier there")
    if isinstance(layout_dir, Path) and not layout_dir.exists():
        parent = layout_dir.parent
        there = sorted(d.name for d in parent.iterdir() if d.is_dir()) if parent.is_dir() else []
        raise TierConfigError(
            f"{where}: nothing stored with this layout (chunk_bytes {spec.chunk_bytes}, namespace "
            f"{spec.namespace!r}) under {parent}: no {layout_dir.name}; layouts there: {there or 'none'}"
        )


def _build_for_check(name: str, where: str, config: Mapping[str, Any], spec: OffloadingSpec) -> Any:
    """The tier, built to list and verify everything it holds (checksums on, no background scan)."""
    from ..posix_io import aligned_buffer

    cfg = dict(config)
    cls = SecondaryTierFactory.get_tier_class(cfg)
    require_chunk_tier(name, cls)
    accepted = accepted_parameters(cls)
    if "verify" in accepted:
        cfg["verify"] = True
    if "background_scan" in accepted:
        cfg["background_scan"] = False  # list every chunk: the index must be complete before stored_keys()
    # never write over, format, grow or evict what is there: a check changes nothing unasked
    # nor stamp what it read as just used (fs: the LRU order other servers open with)
    for knob, value in (("reformat", False), ("create", False), ("lru_times", False)):
        if knob in accepted:
            cfg[knob] = value
    if "capacity_bytes" in accepted and not getattr(cls, "capacity_sizes_medium", False):
        cfg["capacity_bytes"] = None  # (a bound smaller than what is stored evicted the rest at open)
    check_exists(where, cfg)
    scratch = aligned_buffer(spec.total_bytes)  # never touched by verify_chunks; the tier wants a view
    try:
        tier = SecondaryTierFactory.create_secondary_tier(cfg, scratch, spec)
    except TierConfigError as e:
        raise TierConfigError(f"{where}: {e}") from None
    _check_layout_exists(where, tier, spec)
    return tier


async def fsck_tier(
    name: str,
    config: Mapping[str, Any],
    spec: OffloadingSpec,
    *,
    remove: bool = False,
    batch: int = 1024,
    progress: Callable[[int, int], None] | None = None,
    where: str | None = None,
) -> FsckReport:
    """Verify every chunk a tier holds (``stored_keys`` + ``verify_chunks``); remove bad ones on request.

    ``spec`` must be the layout the chunks were written with (chunk size, namespace): tiers
    scope their storage by it. Checksums are always verified here, whatever ``verify`` says
    in the config. ``where`` names the config in errors (default ``[tiers.<name>]``). A chain
    is not a ChunkTier: check its members (:func:`~asynctier.cli.fsck_targets.check_targets`).
    """
    tier = _build_for_check(name, where or f"[tiers.{name}]", config, spec)
    return await _verify_all(name, tier, remove=remove, batch=batch, progress=progress)


async def _verify_all(
    name: str, tier: Any, *, remove: bool, batch: int = 1024, progress: Callable[[int, int], None] | None = None
) -> FsckReport:
    """Open ``tier`` (built by :func:`_build_for_check`), verify every chunk it lists, close it."""
    report = await _open_for_check(name, tier, remove)
    if report.damaged:
        return report
    return await _verify_open(tier, report, batch=batch, progress=progress)


async def _open_for_check(name: str, tier: Any, remove: bool) -> FsckReport:
    """Open ``tier``; its report, ``damaged`` set where the open found damage that an open which
    may repair would make final (the tier is then not open)."""
    from ..errors import MediumDamagedError, MediumMismatchError

    report = FsckReport(tier=name, remove=remove)
    try:
        await tier.open()
    except MediumDamagedError as e:
        report.damaged = str(e)
    except MediumMismatchError as e:  # (its own advice, reformat=True, is not fsck's: it loses the chunks)
        advice = (
            "give the chunk_bytes and namespace the chunks were written with, and the capacity_bytes the medium "
            "was made with or none (a medium truncated or grown does not fit its layout either), or another path"
            if "another layout" in e.found and "format version" not in e.found
            else "give another path"
        )
        what = getattr(tier, "tier_type", type(tier).__name__)
        raise TierConfigError(f"{what}: {e.found}. Nothing was written; fsck never formats: {advice}") from None
    return report


async def _verify_open(
    tier: Any, report: FsckReport, *, batch: int = 1024, progress: Callable[[int, int], None] | None = None
) -> FsckReport:
    """Verify every chunk the open ``tier`` lists, into ``report``; close it."""
    from ..errors import IntegrityError, failure_kind

    remove = report.remove
    async with tier:
        keys = await tier.stored_keys()  # (the index complete: the open's scan is over)
        report.removed_at_open = int(tier.stats().extra.get("scan_removed_bad", 0))
        report.temporaries_removed_at_open = int(tier.stats().extra.get("scan_removed_tmp", 0))
        total = len(keys)
        if progress:
            progress(0, total)
        for start in range(0, total, batch):
            part = keys[start : start + batch]
            res = await tier.verify_chunks(part, remove_bad=remove)
            report.checked += len(part)
            report.ok += len(res.succeeded)
            for k, exc in res.failed.items():
                if isinstance(exc, IntegrityError):
                    report.bad[k.hex()] = str(exc)
                    if remove:
                        report.removed += 1
                elif failure_kind(exc) == "not_found":
                    report.vanished += 1  # evicted or removed by another user since the listing
                else:
                    report.errors[k.hex()] = f"{type(exc).__name__}: {exc}"
            if progress:
                progress(report.checked, total)
        if report.bad and not remove:
            # some tiers forget a chunk that failed a read at once; say so rather than claim it is still there
            bad_keys = [bytes.fromhex(k) for k in report.bad]
            report.dropped_by_tier = sum(1 for present in await tier.lookup(bad_keys) if not present)
    return report


def _selection(
    config_path: str, tier_names: tuple[str, ...], chunk_bytes: int | None, namespace: str | None
) -> tuple[OffloadingSpec, list[CheckTarget]]:
    """The layout and the tiers to check (a chain's members in its place), from the tier file
    and the overrides; every tier class is resolved here, before any chunk is read."""
    tfile = load_tier_file(config_path)
    table = dict(tfile.spec)
    if chunk_bytes is not None:
        table["chunk_bytes"] = chunk_bytes
    if namespace is not None:
        table["namespace"] = namespace
    spec = spec_from_table(table)
    missing = [n for n in tier_names if n not in tfile.tiers]
    if missing:
        raise TierConfigError(f"no [tiers.{missing[0]}] in {config_path}; it has: {', '.join(tfile.tiers)}")
    selected = {n: tfile.tiers[n] for n in (tier_names or tfile.tiers)}
    for n, cfg in selected.items():
        if uses_placeholders(cfg):
            raise TierConfigError(f"[tiers.{n}] uses bench placeholders ({{dir}}, {{capacity}}): fsck needs real paths")
    return spec, [t for n, cfg in selected.items() for t in check_targets(n, cfg)]


async def _check_all(targets: list[CheckTarget], spec: OffloadingSpec, remove: bool) -> list[FsckReport]:
    """Build every tier first, the skipped ones too (a bad parameter or a missing root is said
    before anything is read or removed), then verify them one after the other."""
    built = [(t, _build_for_check(t.name, t.where, t.config, spec)) for t in targets]
    reports = []
    for target, tier in built:
        # (an instance may hold nothing across processes where its class can: obj on memory://)
        skipped = target.skipped or (None if getattr(tier, "persistent", True) else NOT_PERSISTENT)
        if skipped:  # built, never opened
            report = FsckReport(tier=target.name, skipped=skipped)
        else:
            try:
                report = await _verify_all(target.name, tier, remove=remove)
            except (OSError, TierStateError, ChunkError, TierConfigError) as e:  # a server down, a slab in use,
                # a medium the config does not fit (found at open): said with the others, which are
                # checked all the same (one at a time: two tables may name one slab, and each open
                # tier holds its descriptors and threads)
                report = FsckReport(tier=target.name, remove=remove, cannot_check=str(e))
                report.refused_config = isinstance(e, TierConfigError)
        report.member = target.member
        reports.append(report)
    return reports


def _tmp_note(n: int) -> str:
    return f", {n} temporary file{'s' if n != 1 else ''} of dead writers removed as the tier opened" if n else ""


def _print_reports(reports: list[FsckReport], remove: bool) -> None:
    for r in reports:
        label = f"{r.tier} ({r.member})" if r.member else r.tier
        if r.skipped:
            click.echo(f"{label}: not checked: {r.skipped}")
            continue
        if r.damaged:
            click.echo(f"{label}: NOT CLEAN, damaged (left as it is): {r.damaged}")
            continue
        if r.cannot_check:
            click.echo(f"{label}: cannot check: {r.cannot_check}")
            continue
        state = "clean" if r.clean else "NOT CLEAN"
        click.echo(
            f"{label}: {r.checked} chunks checked, {r.ok} good, {len(r.bad)} bad"
            f"{f', {r.removed} removed' if r.removed else ''}"
            f"{f' ({r.dropped_by_tier} already dropped by the tier itself)' if r.dropped_by_tier else ''}"
            f"{f', {r.vanished} vanished while checking' if r.vanished else ''}"
            f"{f', {len(r.errors)} unreadable' if r.errors else ''}"
            f"{f', {r.removed_at_open} of the wrong size removed as the tier opened' if r.removed_at_open else ''}"
            f"{_tmp_note(r.temporaries_removed_at_open)}: {state}"
        )
        for k, why in r.bad.items():
            click.echo(f"  bad {k}: {why}{' (removed)' if remove else ''}")
        for k, why in r.errors.items():
            click.echo(f"  unreadable {k}: {why}")
        if not r.checked:
            click.echo(f"{label}: no chunks stored under this layout (chunk_bytes, namespace)", err=True)
    if any(r.bad and not r.removed for r in reports):
        click.echo("run again with --remove to delete the bad chunks", err=True)


@click.command(epilog=EXIT_CODES_HELP)
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    required=True,
    help="TOML tier file: [spec] (chunk_bytes, namespace) and the tier(s) to check.",
)
@click.option("--tier", "tier_names", multiple=True, metavar="NAME", help="Check only these [tiers.NAME] (repeatable).")
@click.option(
    "--chunk-bytes", callback=size_callback, default=None, metavar="SIZE", help="Override [spec] chunk_bytes."
)
@click.option("--namespace", default=None, help="Override [spec] namespace.")
@click.option("--remove", is_flag=True, help="Delete the chunks that fail verification.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@import_path_option
def fsck(
    config_path: str,
    tier_names: tuple[str, ...],
    chunk_bytes: int | None,
    namespace: str | None,
    remove: bool,
    as_json: bool,
) -> None:
    """Verify every stored chunk of a tier (header, length, layout, checksum); report or remove bad ones.

    fsck never creates anything: a root, slab or layout that is not there is an error (exit
    status 2), not an empty tier reported clean. Exit status 1 also covers chunks that could
    not be read. A chain is checked member by member (reported as NAME.tiers[i]); a member in
    process memory (memory) is skipped, said as such.
    """
    try:
        spec, targets = _selection(config_path, tier_names, chunk_bytes, namespace)
    except (TierConfigError, ValueError) as e:
        raise click.UsageError(str(e)) from None

    try:
        reports = run_async(_check_all(targets, spec, remove))
    except TierConfigError as e:
        raise click.UsageError(str(e)) from None
    except (OSError, TierStateError, ChunkError) as e:  # no permission, a failing disk, a slab in use, a
        # server down (a listing's failure): said, not a traceback
        raise CliError(f"cannot check: {e}", ExitCode.CANNOT_RUN) from None
    if as_json:
        click.echo(json.dumps([{**asdict(r), "clean": r.clean} for r in reports], indent=2))
    else:
        _print_reports(reports, remove)
    if not all(r.clean or r.cannot_check for r in reports):  # (the lowest status that applies)
        raise SystemExit(int(ExitCode.NOT_VERIFIED))
    if any(r.refused_config for r in reports):
        raise SystemExit(int(ExitCode.USAGE))
    if any(r.cannot_check for r in reports):
        raise SystemExit(int(ExitCode.CANNOT_RUN))
