"""What ``asynctier bench`` measured: phases, points, references, the report; medians of
repeated runs, ratios to the references and the per-tier summary."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import benchkit
from ..sizes import format_size

__all__ = [
    "BenchReport",
    "Phase",
    "PointResult",
    "RefResult",
    "median_point",
    "median_ref",
    "ratios",
    "summarize",
]


@dataclass
class Phase:
    """One timed phase: throughput, chunk operations per second, per-chunk latency (seconds)."""

    seconds: float
    bytes_per_s: float
    ops_per_s: float
    lat_p50_s: float = 0.0
    lat_p99_s: float = 0.0
    lat_max_s: float = 0.0

    @classmethod
    def of(cls, seconds: float, nbytes: int, nops: int, latencies: Sequence[float] = ()) -> Phase:
        """Build from a duration, the bytes and chunk operations it covered, and their latencies."""
        lat = sorted(latencies)
        s = max(seconds, 1e-9)
        return cls(
            seconds=seconds,
            bytes_per_s=nbytes / s,
            ops_per_s=nops / s,
            lat_p50_s=benchkit.percentile(lat, 0.50),
            lat_p99_s=benchkit.percentile(lat, 0.99),
            lat_max_s=lat[-1] if lat else 0.0,
        )


@dataclass
class RefResult:
    """fio and the naive loop at one (chunk size, depth): the references a tier is divided by."""

    chunk_bytes: int
    depth: int
    chunks: int
    fio_write: dict[str, Any] | None = None
    fio_read: dict[str, Any] | None = None
    #: ``--steady``: fio writing over a file laid out first (what the full-tier figure is divided by).
    fio_overwrite: dict[str, Any] | None = None
    naive_write: Phase | None = None
    naive_read: Phase | None = None
    notes: list[str] = field(default_factory=list)
    #: Runs these figures are the median of (``--repeat``).
    repeats: int = 1

    def fio_bps(self, side: str) -> float:
        """Best fio bytes/s for ``"write"``, ``"read"`` or ``"overwrite"`` (0 when fio did not run)."""
        r = {"write": self.fio_write, "read": self.fio_read, "overwrite": self.fio_overwrite}[side]
        return float(r["bytes_per_s"]) if r else 0.0

    def naive_bps(self, side: str) -> float:
        """Naive loop bytes/s for ``"write"`` or ``"read"`` (0 when it did not run)."""
        r = self.naive_write if side == "write" else self.naive_read
        return r.bytes_per_s if r else 0.0


@dataclass
class PointResult:
    """One tier at one (chunk size, depth)."""

    tier: str
    tier_type: str
    chunk_bytes: int
    depth: int
    chunks: int
    ok: bool = False
    error: str | None = None
    #: The tier could not be built or opened: nothing moved (exit status 4, not 1).
    failed_at_open: bool = False
    offload: Phase | None = None
    #: Offload throughput before the final flush (what the caller saw return).
    offload_returned_bytes_per_s: float = 0.0
    flush_s: float = 0.0
    load: Phase | None = None
    #: ``--steady``: offloads of new keys into a full tier, each evicting one (flush included).
    steady: Phase | None = None
    #: Chunks the steady phase evicted (as many as it stored, in a tier that was full).
    steady_evictions: int = 0
    #: Chunks the untimed ``--steady-passes`` evicted before it (each pass turns the tier over).
    steady_pass_evictions: int = 0
    lookup_ops_per_s: float = 0.0
    #: Chunks timed one call at a time for the latency percentiles (also verified).
    probe_chunks: int = 0
    verified_bytes: int = 0
    failed_chunks: int = 0
    peak_in_flight: int = 0
    tier_extra: dict[str, int] = field(default_factory=dict)
    ratios: dict[str, float | None] = field(default_factory=dict)
    #: Runs this point's figures are the median of (``--repeat``); every run was verified.
    repeats: int = 1


@dataclass
class BenchReport:
    """Everything one ``asynctier bench`` run measured (``--json`` writes :meth:`as_dict`)."""

    started: str
    command: str
    machine: dict[str, Any]
    options: dict[str, Any]
    tiers: dict[str, dict[str, Any]]
    references: list[RefResult] = field(default_factory=list)
    points: list[PointResult] = field(default_factory=list)
    wall_s: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when at least one tier ran and every point verified."""
        return bool(self.points) and all(p.ok for p in self.points)

    def ref(self, chunk_bytes: int, depth: int) -> RefResult | None:
        """The references measured at (chunk size, depth)."""
        for r in self.references:
            if r.chunk_bytes == chunk_bytes and r.depth == depth:
                return r
        return None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        d = asdict(self)
        d["ok"] = self.ok
        return d


def _median_of(items: Sequence[Any], key: Callable[[Any], float]) -> Any:
    """The item with the median ``key`` (the lower one of the middle two for an even count)."""
    ranked = sorted(items, key=key)
    return ranked[(len(ranked) - 1) // 2]


def median_ref(runs: list[RefResult]) -> RefResult:
    """One reference per side from repeated runs: each side's median run (its latencies with it)."""
    if len(runs) == 1:
        return runs[0]
    out = RefResult(chunk_bytes=runs[0].chunk_bytes, depth=runs[0].depth, chunks=runs[0].chunks)
    for side in ("fio_write", "fio_read", "fio_overwrite"):
        vals = [getattr(r, side) for r in runs if getattr(r, side)]
        setattr(out, side, _median_of(vals, lambda v: float(v["bytes_per_s"])) if vals else None)
    for side in ("naive_write", "naive_read"):
        phases = [getattr(r, side) for r in runs if getattr(r, side)]
        setattr(out, side, _median_of(phases, lambda ph: ph.bytes_per_s) if phases else None)
    out.notes = sorted({n for r in runs for n in r.notes})
    out.repeats = len(runs)
    return out


def median_point(runs: list[PointResult]) -> PointResult:
    """One point from repeated runs: failed if any run failed; else each phase's median run."""
    bad = [r for r in runs if not r.ok]
    if len(runs) == 1 or bad:
        out = bad[0] if bad else runs[0]
        out.repeats = len(runs)
        return out
    off = _median_of(runs, lambda r: r.offload.bytes_per_s if r.offload else 0.0)
    ld = _median_of(runs, lambda r: r.load.bytes_per_s if r.load else 0.0)
    st = _median_of(runs, lambda r: r.steady.bytes_per_s if r.steady else 0.0)
    out = PointResult(
        tier=off.tier,
        tier_type=off.tier_type,
        chunk_bytes=off.chunk_bytes,
        depth=off.depth,
        chunks=off.chunks,
        ok=True,
        offload=off.offload,
        offload_returned_bytes_per_s=off.offload_returned_bytes_per_s,
        flush_s=off.flush_s,
        load=ld.load,
        steady=st.steady,
        steady_evictions=st.steady_evictions,
        steady_pass_evictions=st.steady_pass_evictions,
        lookup_ops_per_s=_median_of(runs, lambda r: r.lookup_ops_per_s).lookup_ops_per_s,
        probe_chunks=off.probe_chunks,
        verified_bytes=sum(r.verified_bytes for r in runs),
        peak_in_flight=max(r.peak_in_flight for r in runs),
        tier_extra=off.tier_extra,
        repeats=len(runs),
    )
    return out


def median_ratios(pairs: Sequence[tuple[PointResult, RefResult]]) -> dict[str, float | None]:
    """Each ratio's median over repetitions, each repetition's tier run over the references
    measured just before it (so drift between repetitions cancels); None where none has it."""
    each = [ratios(p, ref) for p, ref in pairs if p.ok]
    out: dict[str, float | None] = {}
    for name in each[0] if each else {}:
        vals = sorted(v for r in each if (v := r.get(name)) is not None)
        out[name] = statistics.median(vals) if vals else None
    return out


def ratios(p: PointResult, ref: RefResult) -> dict[str, float | None]:
    out: dict[str, float | None] = {"fio_write": None, "fio_read": None, "naive_write": None, "naive_read": None}
    if p.steady is not None:
        out["fio_steady"] = benchkit.ratio(p.steady.bytes_per_s, ref.fio_bps("overwrite"))
    if p.offload is not None:
        out["fio_write"] = benchkit.ratio(p.offload.bytes_per_s, ref.fio_bps("write"))
        out["naive_write"] = benchkit.ratio(p.offload.bytes_per_s, ref.naive_bps("write"))
    if p.load is not None:
        out["fio_read"] = benchkit.ratio(p.load.bytes_per_s, ref.fio_bps("read"))
        out["naive_read"] = benchkit.ratio(p.load.bytes_per_s, ref.naive_bps("read"))
    return out


def _geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v and v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in vals)) if vals else None


def summarize(report: BenchReport, notes: list[str]) -> dict[str, Any]:
    per_tier: dict[str, Any] = {}
    for name, st in report.tiers.items():
        pts = [p for p in report.points if p.tier == name]
        if not pts:
            per_tier[name] = {"status": st["status"], "reason": st.get("reason")}
            continue
        good = [p for p in pts if p.ok]
        entry: dict[str, Any] = {
            "status": "ok" if len(good) == len(pts) else "failed",
            "points": len(pts),
            "points_ok": len(good),
            "verified_bytes": sum(p.verified_bytes for p in pts),
            "best_offload_bytes_per_s": max((p.offload.bytes_per_s for p in good if p.offload), default=0.0),
            "best_load_bytes_per_s": max((p.load.bytes_per_s for p in good if p.load), default=0.0),
        }
        for r in ("fio_write", "fio_read", "naive_write", "naive_read"):
            entry[f"geomean_{r}"] = _geomean([p.ratios.get(r) or 0.0 for p in good])
        errors = [f"{format_size(p.chunk_bytes)} depth {p.depth}: {p.error}" for p in pts if p.error]
        if errors:
            entry["errors"] = errors
        per_tier[name] = entry
    notes = list(notes) + [n for r in report.references for n in r.notes]
    return {"tiers": per_tier, "notes": notes}
