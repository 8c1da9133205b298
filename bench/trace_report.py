"""What ``bench_trace.py`` writes: per-tier rows, the markdown tables and the plot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from asynctier.cli.benchkit import md_table

__all__ = ["markdown", "plot", "tier_rows"]

_COLORS = {"memory": "#1f77b4", "fs": "#2ca02c", "nvme": "#ff7f0e", "obj": "#9467bd"}


def tier_rows(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per tier of a run: chunks it served, its hit ratio among the reusable chunks that
    reached it (missed by every tier above), bytes read and written, evictions, chunks held.

    A single tier's figures are its :class:`~asynctier.stats.TierStats`; a chain's are its
    inner tiers' snapshots (``TierStats.children``, fastest first), where the chain's own count
    of the chunks a tier served (``extra["hits"]``) is preferred to the tier's loads (which
    may include reads the chain made for itself).
    """
    st, cfg, c = run["stats"], run["config"], run["counters"]
    if not st:
        return []
    children: Mapping[str, Mapping[str, Any]] = st.get("children") or {}
    if not children:
        return [_row(str(cfg.get("type")), st, c["reusable_chunks"])]
    rows: list[dict[str, Any]] = []
    reaching = c["reusable_chunks"]
    for name, sub in children.items():
        row = _row(name, sub, reaching)
        reaching -= row["served"]
        rows.append(row)
    return rows


def _row(name: str, st: Mapping[str, Any], reaching: int) -> dict[str, Any]:
    served = int(st.get("extra", {}).get("hits", st.get("loaded", 0)))
    return {
        "tier": name,
        "served": served,
        "reaching": reaching,
        "hit_ratio": served / reaching if reaching else 0.0,
        "bytes_read": int(st.get("bytes_read", 0)),
        "bytes_written": int(st.get("bytes_written", 0)),
        "offloaded": int(st.get("offloaded", 0)),
        "evictions": int(st.get("evictions", 0)),
        "stored_chunks": st.get("stored_chunks"),
    }


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f}"


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f}"


def markdown(report: Mapping[str, Any], header: Sequence[str]) -> str:
    """The report as markdown: the workload, one row per run, one row per tier of each run."""
    runs = report["runs"]
    main_rows = []
    for r in runs:
        if not r["ok"]:
            main_rows.append([r["name"], "FAILED", r["error"], *[""] * 7])
            continue
        lat = r["latency"]
        main_rows.append(
            [
                r["name"],
                f"{100 * r['prefix_hit_ratio']:.1f}",
                f"{100 * r['turn_hit_ratio']:.1f}",
                f"{_ms(lat['turn_load']['p50_s'])} / {_ms(lat['turn_load']['p99_s'])}",
                f"{1e6 * lat['chunk_load']['p50_s']:.0f} / {1e6 * lat['chunk_load']['p99_s']:.0f}",
                f"{_ms(lat['lookup']['p50_s'])} / {_ms(lat['lookup']['p99_s'])}",
                f"{_ms(lat['turn_offload']['p50_s'])} / {_ms(lat['turn_offload']['p99_s'])}",
                f"{r['cpu_us_per_chunk_moved']:.0f}",
                f"{r['cpu_s']:.2f}",
                f"{r['wall_s']:.2f}",
            ]
        )
    tier_table = []
    for r in runs:
        for t in r.get("tiers", []):
            tier_table.append(
                [
                    r["name"],
                    t["tier"],
                    str(t["served"]),
                    f"{100 * t['hit_ratio']:.1f}",
                    _mib(t["bytes_read"]),
                    _mib(t["bytes_written"]),
                    str(t["evictions"]),
                    "" if t["stored_chunks"] is None else str(t["stored_chunks"]),
                ]
            )
    ideal = report["trace"]["ideal_hit_chunks"] / max(1, report["trace"]["prompt_chunks"])
    parts = [
        "# Trace-driven benchmark: a multi-turn chat workload through tiers and chains",
        "",
        f"Command: `{report['command']}`",
        "",
        *[f"- {line}" for line in header],
        f"- unbounded cache (the ceiling): prefix hit ratio {100 * ideal:.1f}%",
        "",
        "Prefix hit % = chunks loaded / chunks asked for (the rest is recomputed); turns hit % = turns "
        "that loaded at least one chunk. Latencies are p50 / p99; per chunk = a turn's load time / "
        "chunks it loaded. CPU is the process's (all threads) over the run, per chunk loaded or offloaded.",
        "",
        md_table(
            [
                "run",
                "prefix hit %",
                "turns hit %",
                "load per turn ms",
                "load per chunk us",
                "lookup ms",
                "offload per turn ms",
                "CPU us/chunk",
                "CPU s",
                "wall s",
            ],
            main_rows,
        ),
        "",
        "Per tier: chunks served, hit % among the reusable chunks that reached the tier (missed "
        "above it), MiB read and written, evictions, chunks held at the end.",
        "",
        md_table(["run", "tier", "served", "hit %", "MiB read", "MiB written", "evictions", "held"], tier_table),
    ]
    return "\n".join(parts) + "\n"


def plot(report: Mapping[str, Any], path: str) -> None:
    """Two panels: prefix hit ratio against p99 load latency per turn (one point per run), and
    where each run's prompt chunks came from (a bar per run, a segment per tier)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import ScalarFormatter

    runs = [r for r in report["runs"] if r["ok"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [1.1, 1]})
    for r in runs:
        p50, p99 = (1e3 * r["latency"]["turn_load"][k] for k in ("p50_s", "p99_s"))
        y = 100 * r["prefix_hit_ratio"]
        chain = r["config"].get("type") == "chain"
        (line,) = ax1.plot([p50, p99], [y, y], linewidth=1, alpha=0.5)
        ax1.scatter([p99], [y], marker="s" if chain else "o", s=50, color=line.get_color())
        ax1.scatter([p50], [y], marker="|", s=60, color=line.get_color())
        ax1.annotate(r["name"], (p99, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
    ideal = 100 * report["trace"]["ideal_hit_chunks"] / max(1, report["trace"]["prompt_chunks"])
    ax1.axhline(ideal, color="grey", linestyle="--", linewidth=1)
    ax1.set_xscale("log")
    ax1.xaxis.set_major_formatter(ScalarFormatter())
    ax1.xaxis.set_minor_formatter(ScalarFormatter())
    ax1.tick_params(axis="x", which="minor", labelsize=7)
    ax1.text(ax1.get_xlim()[0], ideal, " unbounded cache", va="bottom", fontsize=8, color="grey")
    ax1.set_xlabel("load latency per turn (ms, log): | p50, marker p99; square = chain")
    ax1.set_ylabel("prefix hit ratio (% of prompt chunks loaded)")
    ax1.set_title("hit ratio vs load latency (up and left is better)", fontsize=10)
    ax1.grid(True, which="both", alpha=0.3)

    names = [r["name"] for r in runs]
    for i, r in enumerate(runs):
        left = 0.0
        total = max(1, r["counters"]["prompt_chunks"])
        for t in r.get("tiers", []):
            share = 100 * t["served"] / total
            kind = next((k for k in _COLORS if k in t["tier"]), t["tier"])
            ax2.barh(i, share, left=left, color=_COLORS.get(kind, "#8c564b"), edgecolor="white")
            if share > 6:
                ax2.text(left + share / 2, i, kind, ha="center", va="center", fontsize=7, color="white")
            left += share
        ax2.barh(i, 100 - left, left=left, color="#dddddd", edgecolor="white")
    ax2.set_yticks(range(len(names)), names, fontsize=8)
    ax2.invert_yaxis()
    ax2.set_xlim(0, 100)
    ax2.set_xlabel("% of prompt chunks: served by each tier, fastest first; grey: recomputed")
    ax2.set_title("where the prompt chunks came from", fontsize=10)
    fig.suptitle(report.get("title", "trace benchmark"), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
