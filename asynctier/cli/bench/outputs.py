"""The bench's files: the report as JSON, as markdown (command line, machine, tables) and as a PNG plot."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..sizes import GiB, format_size
from .results import BenchReport
from .tables import (
    POINT_COLUMNS,
    REF_COLUMNS,
    SUMMARY_COLUMNS,
    closing_lines,
    decimal_bytes,
    point_rows,
    ref_rows,
    summary_rows,
)

__all__ = ["render_markdown", "write_json", "write_markdown", "write_plot"]


def write_json(report: BenchReport, path: str | os.PathLike[str]) -> None:
    """Every figure as JSON (:meth:`BenchReport.as_dict`)."""
    Path(path).write_text(json.dumps(report.as_dict(), indent=2) + "\n")


def write_markdown(report: BenchReport, path: str | os.PathLike[str]) -> None:
    """:func:`render_markdown` into a file."""
    Path(path).write_text(render_markdown(report))


def _md_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "| " + " | ".join(columns) + " |"
    sep = "| " + " | ".join("---" for _ in columns) + " |"
    body = ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join([head, sep, *body])


def render_markdown(report: BenchReport) -> str:
    """The results as markdown: what ran, where, the command line, the tables."""
    m = report.machine
    lines = [
        f"Run {report.started} on {m['cpus']} CPUs, {m['memory_bytes'] / GiB:.0f} GiB, {m['platform']}; "
        f"Python {m['python']}, {m['event_loop']}; primary buffer: {m['primary_buffer']}; "
        f"{m['fio'] or 'no fio'}; files on {m['root_fs']}.",
        "",
        "```",
        report.command,
        "```",
        "",
        f"Wall time {report.wall_s:.0f} s; {decimal_bytes(sum(p.verified_bytes for p in report.points))} loaded back "
        f"and verified byte for byte; {sum(p.ok for p in report.points)}/{len(report.points)} points ok.",
        "",
        "Per tier (ratios: geometric means over its chunk sizes and depths):",
        "",
        _md_table(SUMMARY_COLUMNS, list(summary_rows(report))),
        "",
        "Every point:",
        "",
        _md_table(POINT_COLUMNS, list(point_rows(report))),
    ]
    if report.references:
        lines += ["", "References measured in the same run:", "", _md_table(REF_COLUMNS, list(ref_rows(report)))]
    extra = closing_lines(report)
    if extra:
        lines += ["", *[f"- {x}" for x in extra]]
    return "\n".join(lines) + "\n"


def _panel(ax: Any, report: BenchReport, chunk: int, side: str, label: str) -> None:
    """One panel: GB/s by depth at one chunk size, one side (write = offload, read = load)."""
    refs = sorted((r for r in report.references if r.chunk_bytes == chunk), key=lambda r: r.depth)
    if any(r.fio_bps(side) for r in refs):
        ax.plot([r.depth for r in refs], [r.fio_bps(side) / 1e9 for r in refs], "k--", label="fio O_DIRECT")
    if any(r.naive_bps(side) for r in refs):
        ax.plot(
            [r.depth for r in refs], [r.naive_bps(side) / 1e9 for r in refs], ":", color="gray", label="naive aiofiles"
        )
    for tier in report.tiers:
        pts = sorted(
            (p for p in report.points if p.tier == tier and p.chunk_bytes == chunk and p.ok), key=lambda p: p.depth
        )
        phases = [(p.depth, p.offload if side == "write" else p.load) for p in pts]
        xs = [d for d, ph in phases if ph]
        ys = [ph.bytes_per_s / 1e9 for _, ph in phases if ph]
        if xs:
            ax.plot(xs, ys, "o-", label=tier)
    ax.set_xscale("log", base=2)
    depths = sorted({r.depth for r in refs} | {p.depth for p in report.points if p.chunk_bytes == chunk})
    ax.set_xticks(depths, [str(d) for d in depths])
    ax.minorticks_off()
    ax.set_title(f"{label}, {format_size(chunk)} chunks")
    ax.set_xlabel("depth (chunk I/Os in flight)")
    ax.set_ylabel("GB/s")
    ax.grid(True, alpha=0.3)
    ax.set_ylim(bottom=0)


def write_plot(report: BenchReport, path: str | os.PathLike[str]) -> None:
    """A PNG: GB/s against depth, one panel per (offload|load, chunk size), a line per tier,
    fio and the naive loop as references. Needs matplotlib (the ``bench`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chunks = sorted({p.chunk_bytes for p in report.points} | {r.chunk_bytes for r in report.references})
    if not chunks:
        raise ValueError("nothing to plot: no tier ran and no reference was measured")
    fig, axes = plt.subplots(2, len(chunks), figsize=(4.2 * len(chunks), 7), squeeze=False, sharex=True)
    for col, chunk in enumerate(chunks):
        for row, (side, label) in enumerate((("write", "offload"), ("read", "load"))):
            _panel(axes[row][col], report, chunk, side, label)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle(f"asynctier bench, {report.started}: GB/s by depth", y=0.995, fontsize=10)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.965), ncol=max(1, len(labels)))
    fig.tight_layout(rect=(0, 0, 1, 0.91))
    fig.savefig(path, dpi=110)
    plt.close(fig)
