"""What ``bench_trace.py`` writes: per-tier rows, the markdown tables and the plot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from asynctier.cli.benchkit import md_table

__all__ = ["backlog_served", "markdown", "plot", "tier_rows"]

_COLORS = {
    "memory": "#1f77b4",
    "fs": "#2ca02c",
    "nvme": "#ff7f0e",
    "obj": "#9467bd",
    "valkey": "#d62728",
    "write-back queue": "#17becf",
}


def tier_rows(run: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per tier of a run: chunks it served, its hit ratio among the reusable chunks that
    reached it (missed by every tier above), bytes read and written, evictions, chunks held.

    A single tier's figures are its :class:`~asynctier.stats.TierStats`; a chain's are its
    inner tiers' snapshots (``TierStats.children``, fastest first), where the chain's own count
    of the chunks a tier served (``extra["chain_hits"]``) is taken over the tier's loads (which
    may include reads the chain made for itself), beside the chain's promotions into the tier,
    background writes to it and writes it dropped. A write-back chain looks in its write-back
    queue after its first tier: the chunks served there (:func:`backlog_served`) did not reach
    the tiers below.
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
        if not rows:
            reaching -= backlog_served(run)
        rows.append(row)
    return rows


def backlog_served(run: Mapping[str, Any]) -> int:
    """Chunks a chain served from its write-back queue: stored, evicted from the first tier,
    not yet written to the tier below (0 for a single tier)."""
    extra: Mapping[str, Any] = (run.get("stats") or {}).get("extra", {})
    return int(extra.get("backlog_hits", 0)) if (run.get("stats") or {}).get("children") else 0


def _row(name: str, st: Mapping[str, Any], reaching: int) -> dict[str, Any]:
    extra: Mapping[str, int] = st.get("extra", {})
    served = int(extra.get("chain_hits", st.get("loaded", 0)))
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
        "promotions": int(extra.get("chain_promotions", 0)),
        "demotions": int(extra.get("chain_demotions", 0)),
        "written_back": int(extra.get("chain_written_back", 0)),
        "drops": int(extra.get("chain_drops", 0)),
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
        for i, t in enumerate(r.get("tiers", [])):
            tier_table.append(
                [
                    r["name"],
                    t["tier"],
                    str(t["served"]),
                    f"{100 * t['hit_ratio']:.1f}",
                    _mib(t["bytes_read"]),
                    _mib(t["bytes_written"]),
                    str(t["promotions"]),
                    str(t["demotions"]),
                    str(t["written_back"]),
                    str(t["drops"]),
                    str(t["evictions"]),
                    "" if t["stored_chunks"] is None else str(t["stored_chunks"]),
                ]
            )
            queued = r.get("backlog_served", 0)
            if i == 0 and queued:  # looked in after the first tier, before the second
                reaching = t["reaching"] - t["served"]
                hit = f"{100 * queued / reaching:.1f}" if reaching else "0.0"
                tier_table.append([r["name"], "write-back queue", str(queued), hit, *[""] * 8])
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
        "above it), MiB the tier read and wrote (all of it: served, promoted, written back), and for "
        "a chain's tiers the chunks promoted into it, demoted into it (evicted above), written back "
        "to it in the background and dropped (backlog full or tier failing); evictions; chunks held "
        "at the end. With turns in flight together, the tiers may serve a few more chunks than the "
        "prefix hits count: a chunk evicted between a turn's lookup and its load ends the prefix there, and the chunks "
        "loaded after it are of no use (`load_missed_chunks`, `loaded_unused_chunks` in the JSON).",
        "",
        md_table(
            [
                "run",
                "tier",
                "served",
                "hit %",
                "MiB read",
                "MiB written",
                "promoted in",
                "demoted in",
                "written back",
                "dropped",
                "evictions",
                "held",
            ],
            tier_table,
        ),
    ]
    return "\n".join(parts) + "\n"


def plot(report: Mapping[str, Any], path: str) -> None:
    """One row per run, three panels side by side: where the prompt chunks came from (a
    segment per tier, grey recomputed), load latency per turn (p50 bar, p99 tick), and what
    each tier wrote (the cost of keeping it filled)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import ScalarFormatter

    runs = [r for r in report["runs"] if r["ok"]]
    height = 1.6 + 0.42 * len(runs)
    fig, (ax1, ax2, ax3) = plt.subplots(
        1, 3, figsize=(14, height), sharey=True, gridspec_kw={"width_ratios": [1.3, 1, 1]}
    )
    ys = range(len(runs))
    seen: dict[str, str] = {}
    for i, r in enumerate(runs):
        left = 0.0
        hit = 100 * r["prefix_hit_ratio"]
        # a tier's share of the hits (the few chunks loaded after a failed one, of no use, left out)
        queued = r.get("backlog_served", 0)
        segments = [(_kind(t["tier"]), t["served"]) for t in r.get("tiers", [])]
        if queued:
            segments.insert(1, ("write-back queue", queued))
        served = max(1, sum(n for _, n in segments))
        for kind, n in segments:
            color = seen.setdefault(kind, _COLORS.get(kind, "#8c564b"))
            share = hit * n / served
            ax1.barh(i, share, left=left, color=color, edgecolor="white")
            left += share
        ax1.barh(i, 100 - left, left=left, color="#dddddd", edgecolor="white")
        ax1.text(left - 1, i, f"{hit:.1f}%", ha="right", va="center", fontsize=8, color="white", weight="bold")
        written = 0.0
        for t in r.get("tiers", []):
            mib = t["bytes_written"] / (1 << 20)
            ax3.barh(i, mib, left=written, color=_COLORS.get(_kind(t["tier"]), "#8c564b"), edgecolor="white")
            written += mib
        lat = r["latency"]["turn_load"]
        ax2.barh(i, 1e3 * lat["p50_s"], color="#4c72b0", height=0.5)
        ax2.plot([1e3 * lat["p99_s"]], [i], marker="|", markersize=14, markeredgewidth=2, color="#c44e52")
    ideal = 100 * report["trace"]["ideal_hit_chunks"] / max(1, report["trace"]["prompt_chunks"])
    ax1.axvline(ideal, color="black", linestyle="--", linewidth=1)
    ax1.set_yticks(list(ys), [r["name"] for r in runs], fontsize=8)
    ax1.invert_yaxis()
    ax1.set_xlim(0, 100)
    ax1.set_xlabel(f"% of prompt chunks loaded, by tier (dashed: unbounded cache, {ideal:.1f}%)", fontsize=8)
    ax1.set_title("prefix hits: where the chunks came from", fontsize=10)
    fig.legend(
        handles=[Patch(color=c, label=k) for k, c in seen.items()] + [Patch(color="#dddddd", label="recomputed")],
        fontsize=8,
        loc="lower center",
        ncol=len(seen) + 1,
        frameon=False,
    )
    ax2.set_xscale("log")
    ax2.xaxis.set_major_formatter(ScalarFormatter())
    ax2.set_xlabel("ms per turn, log (bar: p50, red tick: p99)", fontsize=8)
    ax2.set_title("load latency per turn", fontsize=10)
    ax2.grid(True, axis="x", which="both", alpha=0.3)
    ax3.set_xlabel("MiB written, by tier (promotions and write-backs included)", fontsize=8)
    ax3.set_title("writes: what keeping the tiers filled costs", fontsize=10)
    ax3.grid(True, axis="x", alpha=0.3)
    fig.suptitle(report.get("title", "trace benchmark"), fontsize=9)
    fig.tight_layout(rect=(0, 0.35 / height, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _kind(tier: str) -> str:
    """The tier type in a tier's name ("memory", "0:fs"), for its colour."""
    return next((k for k in _COLORS if k in tier), tier)
