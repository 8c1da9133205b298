"""The bench's tables: cells formatted once, shown in the terminal (as many columns as the
width holds, the tier name always whole) and in markdown (every column)."""

from __future__ import annotations

import io
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..sizes import format_size
from .results import BenchReport, Phase

__all__ = [
    "POINT_COLUMNS",
    "REF_COLUMNS",
    "SUMMARY_COLUMNS",
    "Col",
    "closing_lines",
    "point_rows",
    "ref_rows",
    "render_tables",
    "summary_rows",
]


@dataclass(frozen=True)
class Col:
    """A column: its full header, a narrow header (may break into lines), and when it goes:
    0 never, else columns with the largest number are dropped first on a narrow terminal."""

    name: str
    short: str
    drop: int = 0
    left: bool = False
    #: shown only when a row holds a figure (an option such as --steady was given)
    optional: bool = False


POINT_COLS = (
    Col("tier", "tier", 0, left=True),
    Col("chunk", "chunk", 0, left=True),
    Col("depth", "depth"),
    Col("offload GB/s", "offload\nGB/s"),
    Col("x fio", "x fio", 3),
    Col("x naive", "x naive", 4),
    Col("offload ops/s", "ops/s", 6),
    Col("offload p50 / p99 ms", "p50/p99\nms", 5),
    Col("full-tier offload GB/s", "full tier\nGB/s", 2, optional=True),
    Col("x fio overwrite", "x fio\nover", 3, optional=True),
    Col("load GB/s", "load\nGB/s"),
    Col("x fio", "x fio", 3),
    Col("x naive", "x naive", 4),
    Col("load ops/s", "ops/s", 6),
    Col("load p50 / p99 ms", "p50/p99\nms", 5),
    Col("lookups/s", "lookups\n/s", 7),
)
REF_COLS = (
    Col("chunk", "chunk", 0, left=True),
    Col("depth", "depth"),
    Col("fio write GB/s", "fio write\nGB/s"),
    Col("fio write p50 / p99 ms", "fio write\np50/p99 ms", 3),
    Col("fio read GB/s", "fio read\nGB/s"),
    Col("fio read p50 / p99 ms", "fio read\np50/p99 ms", 3),
    Col("fio overwrite GB/s", "fio over\nGB/s", 3, optional=True),
    Col("naive write GB/s", "naive\nwrite GB/s", 2),
    Col("naive read GB/s", "naive\nread GB/s", 2),
)
SUMMARY_COLS = (
    Col("tier", "tier", 0, left=True),
    Col("points ok", "points\nok"),
    Col("best offload GB/s", "best\noffload GB/s"),
    Col("best load GB/s", "best\nload GB/s"),
    Col("x fio write", "x fio\nwrite", 2),
    Col("x fio read", "x fio\nread", 2),
    Col("x naive write", "x naive\nwrite", 3),
    Col("x naive read", "x naive\nread", 3),
)
#: The markdown headers (every column, full names).
POINT_COLUMNS = tuple(c.name for c in POINT_COLS)
REF_COLUMNS = tuple(c.name for c in REF_COLS)
SUMMARY_COLUMNS = tuple(c.name for c in SUMMARY_COLS)

#: A column whose cells all say this holds nothing (fio not run): it is the first to go.
_EMPTY = ("-", "")
_DROP_EMPTY_FIRST = 100


def decimal_bytes(nbytes: int) -> str:
    """Bytes in decimal units, as throughput is given."""
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


def _gbps(bps: float | None) -> str:
    return "-" if not bps else f"{bps / 1e9:.2f}"


def _x(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def _ops(v: float | None) -> str:
    if not v:
        return "-"
    return f"{v / 1000:.1f}k" if v >= 10_000 else f"{v:.0f}"


def _lat(p: Phase | None) -> str:
    if p is None or not p.lat_p50_s:
        return "-"
    return f"{p.lat_p50_s * 1e3:.2f} / {p.lat_p99_s * 1e3:.2f}"


def _fio_lat(r: Mapping[str, Any] | None) -> str:
    if not r:
        return "-"
    return f"{r['lat_p50_s'] * 1e3:.2f} / {r['lat_p99_s'] * 1e3:.2f}"


def point_rows(report: BenchReport) -> Iterator[list[str]]:
    """Rows of the per-tier table (see :data:`POINT_COLUMNS`); a failed point says why in its 4th cell."""
    order = list(report.tiers)
    for p in sorted(report.points, key=lambda p: (order.index(p.tier), p.chunk_bytes, p.depth)):
        head = [p.tier, format_size(p.chunk_bytes), str(p.depth)]
        if not p.ok:
            yield [*head, f"FAILED: {p.error}", *[""] * (len(POINT_COLUMNS) - 4)]
            continue
        o, ld, r = p.offload, p.load, p.ratios
        yield [
            *head,
            _gbps(o.bytes_per_s if o else None),
            _x(r.get("fio_write")),
            _x(r.get("naive_write")),
            _ops(o.ops_per_s if o else None),
            _lat(o),
            _gbps(p.steady.bytes_per_s if p.steady else None),
            _x(r.get("fio_steady")),
            _gbps(ld.bytes_per_s if ld else None),
            _x(r.get("fio_read")),
            _x(r.get("naive_read")),
            _ops(ld.ops_per_s if ld else None),
            _lat(ld),
            _ops(p.lookup_ops_per_s),
        ]


def ref_rows(report: BenchReport) -> Iterator[list[str]]:
    """Rows of the reference table (see :data:`REF_COLUMNS`)."""
    for r in report.references:
        yield [
            format_size(r.chunk_bytes),
            str(r.depth),
            _gbps(r.fio_bps("write")),
            _fio_lat(r.fio_write),
            _gbps(r.fio_bps("read")),
            _fio_lat(r.fio_read),
            _gbps(r.fio_bps("overwrite")),
            _gbps(r.naive_bps("write")),
            _gbps(r.naive_bps("read")),
        ]


def summary_rows(report: BenchReport) -> Iterator[list[str]]:
    """One row per tier that ran: best GB/s and the geometric mean of each ratio over its points."""
    for name, t in report.summary.get("tiers", {}).items():
        if "points" not in t:
            continue
        yield [
            name,
            f"{t['points_ok']}/{t['points']}",
            _gbps(t["best_offload_bytes_per_s"]),
            _gbps(t["best_load_bytes_per_s"]),
            *(_x(t.get(f"geomean_{r}")) for r in ("fio_write", "fio_read", "naive_write", "naive_read")),
        ]


def closing_lines(report: BenchReport) -> list[str]:
    """Skipped tiers and notes (markdown lists these; the terminal adds failures and totals)."""
    skipped = [f"{n}: skipped ({s.get('reason')})" for n, s in report.tiers.items() if s["status"] != "ok"]
    return skipped + list(report.summary.get("notes", []))


def _build(cols: Sequence[Col], rows: Sequence[Sequence[str]], keep: Sequence[int], short: bool, **kw: Any) -> Any:
    from rich.table import Table
    from rich.text import Text

    if isinstance(kw.get("title"), str):
        kw["title"] = Text(kw["title"])

    t = Table(header_style="bold", **kw)
    first = keep[0] if keep else -1
    width0 = max((len(r[first]) for r in rows), default=0) if first >= 0 else 0
    for i in keep:
        c = cols[i]
        # the first column names the row (tier or chunk): it never wraps nor shrinks below its longest cell
        t.add_column(
            c.short if short else c.name,
            justify="left" if c.left else "right",
            no_wrap=True,
            min_width=width0 if i == first else None,
        )
    for row in rows:  # as Text: data (a path, an error) is not rich markup ("[s3]" vanished)
        t.add_row(*(Text(row[i]) for i in keep), style="red" if "FAILED" in row else None)
    return t


def fitted_table(cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int, **kw: Any) -> Any:
    """A rich table of ``rows`` no wider than ``width``: every column with full headers when it
    fits, else narrow headers and, from the highest drop number down, fewer columns; the last
    try (the never-dropped columns) is returned even when it is still too wide."""
    from rich.console import Console
    from rich.measure import Measurement

    probe = Console(width=10_000, file=io.StringIO())
    prio = [
        _DROP_EMPTY_FIRST if c.drop and rows and all(r[i] in _EMPTY for r in rows) else c.drop
        for i, c in enumerate(cols)
    ]
    keep = [i for i, c in enumerate(cols) if not (c.optional and all(r[i] in _EMPTY for r in rows))]
    short = False
    while True:
        t = _build(cols, rows, keep, short, **kw)
        if Measurement.get(probe, probe.options, t).maximum <= width:
            return t
        if not short:
            short = True
            continue
        droppable = [prio[i] for i in keep if prio[i]]
        if not droppable:
            return t
        worst = max(droppable)
        keep = [i for i in keep if prio[i] != worst]


CAPTION = (
    "GB/s and ops/s: one call with every chunk, depth = chunk I/Os in flight; offload timed until the bytes are on "
    "the medium, load from a cold page cache. x fio / x naive: the tier's GB/s over fio's (O_DIRECT, same block "
    "size and depth) and over a naive aiofiles loop's; with --repeat, the median of each repetition's ratio. full "
    "tier (--steady): new keys offloaded into a tier at capacity, each evicting one, over fio writing over a file "
    "laid out first. p50/p99: one-chunk calls, depth callers. Narrow terminals show fewer columns: --json and "
    "--markdown keep them all."
)


def render_tables(report: BenchReport, width: int) -> list[Any]:
    """rich renderables no wider than ``width``: the per-tier table, the summary, the
    references, then failures, skipped tiers, notes and totals."""
    from rich.text import Text

    m = report.machine
    rows = [[*r[:3], "FAILED", *r[4:]] if r[3].startswith("FAILED") else r for r in point_rows(report)]
    title = f"asynctier bench: {m['cpus']} CPUs, {m['root_fs']} at {m['root']}, {m['event_loop']}"
    out: list[Any] = [fitted_table(POINT_COLS, rows, width, title=title, caption=CAPTION, caption_justify="left")]
    summary = list(summary_rows(report))
    if summary:
        out.append(
            fitted_table(SUMMARY_COLS, summary, width, title="per tier (ratios: geometric mean over its points)")
        )
    if report.references:
        out.append(
            fitted_table(REF_COLS, list(ref_rows(report)), width, title="references (same run, same file system)")
        )
    failed = [f"{r[0]} {r[1]} depth {r[2]}: {r[3]}" for r in point_rows(report) if r[3].startswith("FAILED")]
    verified = sum(p.verified_bytes for p in report.points)
    lines = [
        *failed,
        *closing_lines(report),
        f"verified {decimal_bytes(verified)} byte for byte; {sum(p.ok for p in report.points)}/{len(report.points)} "
        f"points ok; wall time {report.wall_s:.1f} s",
    ]
    out.append(Text("\n".join(lines)))
    return out
