"""What a transfer returns (:class:`TransferResult`) and what a tier reports (:class:`TierStats`)."""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from .errors import FAILURE_KINDS, AsyncTierError, Withdrawn, failure_kind

__all__ = ["STATS_FAILED", "LatencySummary", "StatsRecorder", "TierStats", "TransferFailedError", "TransferResult"]

Op = Literal["offload", "load", "remove", "verify"]

#: The ``extra`` key of a :class:`TierStats` that stands in for a tier whose ``stats()`` raised
#: (a chain's member): its figures are zeros, not the tier's (an exporter leaves it out).
STATS_FAILED = "stats_failed"


class TransferFailedError(AsyncTierError):
    """Raised by :meth:`TransferResult.raise_for_failures` when any chunk failed."""

    def __init__(self, result: TransferResult) -> None:
        kinds = sorted({failure_kind(e) for e in result.failed.values()})
        first_key, first_exc = next(iter(result.failed.items()))
        super().__init__(
            f"{result.op}: {len(result.failed)} of {result.total} chunks failed ({', '.join(kinds)}); "
            f"first: key {first_key.hex()[:32]}: {first_exc!r}"
        )
        self.result = result


@dataclass
class TransferResult:
    """Outcome of one ``offload``/``load``/``remove`` call.

    Every key of the call is in exactly one of :attr:`succeeded` (in call order) and
    :attr:`failed` (key -> the exception that failed it). A failed load leaves the content of
    that key's primary slot unspecified.

    :attr:`skipped` lists the keys of :attr:`succeeded` an offload found stored already: nothing
    was written for them, and :attr:`bytes_transferred` counts only the chunks moved.

    A tier made of tiers (the ``chain`` tier) also says which of its tiers failed which key in
    :attr:`tier_failures` (tier name -> key -> exception), including keys it then served
    from another of its tiers (they are in :attr:`succeeded`); empty for a single tier.
    """

    op: Op
    succeeded: list[bytes] = field(default_factory=list)
    failed: dict[bytes, BaseException] = field(default_factory=dict)
    bytes_transferred: int = 0
    elapsed_s: float = 0.0
    skipped: list[bytes] = field(default_factory=list)
    tier_failures: dict[str, dict[bytes, BaseException]] = field(default_factory=dict)

    def failed_in(self, tier: str) -> dict[bytes, BaseException]:
        """The keys the chain's tier named ``tier`` failed (empty if none, or not a chain)."""
        return self.tier_failures.get(tier, {})

    @property
    def ok(self) -> bool:
        """True when every chunk of the call succeeded."""
        return not self.failed

    @property
    def total(self) -> int:
        """Number of keys in the call."""
        return len(self.succeeded) + len(self.failed)

    def raise_for_failures(self) -> TransferResult:
        """Raise :class:`TransferFailedError` if any chunk failed; otherwise return ``self``."""
        if self.failed:
            raise TransferFailedError(self)
        return self


@dataclass(frozen=True)
class LatencySummary:
    """Per-chunk latency percentiles in seconds, over the most recent samples."""

    count: int = 0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    max: float = 0.0


@dataclass(frozen=True)
class TierStats:
    """A snapshot of a tier's counters.

    ``in_flight`` counts chunk I/Os running on the medium now (never above ``max_inflight``);
    ``peak_in_flight`` is its high-water mark since open; ``queued`` counts chunk I/Os waiting
    for a slot. ``failures`` maps every kind of :data:`asynctier.errors.FAILURE_KINDS` to a count.
    ``extra`` holds tier-specific counters (for example ``direct_io_fallbacks``).
    ``children`` holds, for a tier made of tiers (the ``chain`` tier), each inner tier's own
    snapshot by name, with the chain's figures for that tier in its ``extra``; empty otherwise.
    """

    tier_type: str
    in_flight: int
    peak_in_flight: int
    queued: int
    max_inflight: int
    offloaded: int
    loaded: int
    skipped: int
    removed: int
    bytes_written: int
    bytes_read: int
    failures: dict[str, int]
    evictions: int
    stored_chunks: int | None
    used_bytes: int | None
    capacity_bytes: int | None
    offload_latency: LatencySummary
    load_latency: LatencySummary
    extra: dict[str, int]
    children: dict[str, TierStats] = field(default_factory=dict)

    @property
    def failed(self) -> int:
        """Total per-chunk failures of every kind."""
        return sum(self.failures.values())


class _Reservoir:
    """The last ``size`` samples; percentiles computed on demand so recording stays O(1)."""

    def __init__(self, size: int = 4096) -> None:
        self._samples: deque[float] = deque(maxlen=size)
        self._count = 0

    def add(self, value: float) -> None:
        self._samples.append(value)
        self._count += 1

    def extend(self, values: list[float]) -> None:
        self._samples.extend(values)
        self._count += len(values)

    def summary(self) -> LatencySummary:
        if not self._samples:
            return LatencySummary()
        s = sorted(self._samples)
        n = len(s)

        def pct(p: float) -> float:  # nearest rank: the smallest sample with at least p of them at or below
            return s[max(0, math.ceil(p * n) - 1)]

        return LatencySummary(count=self._count, p50=pct(0.50), p90=pct(0.90), p99=pct(0.99), max=s[-1])


class StatsRecorder:
    """Thread-safe counters behind :class:`TierStats`; tiers may bump :meth:`incr` for extras."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.offloaded = 0
        self.loaded = 0
        self.skipped = 0
        self.removed = 0
        self.bytes_written = 0
        self.bytes_read = 0
        self.evictions = 0
        self.failures = dict.fromkeys(FAILURE_KINDS, 0)
        self.extra: dict[str, int] = {}
        self._lat = {"offload": _Reservoir(), "load": _Reservoir()}

    def record_success(self, op: str, nbytes: int, latency_s: float, *, skipped: bool = False) -> None:
        """Count one chunk that succeeded."""
        with self._lock:
            if op == "offload":
                if skipped:
                    self.skipped += 1
                else:
                    self.offloaded += 1
                    self.bytes_written += nbytes
            elif op == "load":
                self.loaded += 1
                self.bytes_read += nbytes
            elif op == "remove":
                self.removed += 1
            lat = self._lat.get(op)
            if lat is not None:
                lat.add(latency_s)

    def record_successes(self, op: str, n: int, nbytes: int, latency_s: float, *, skipped: int = 0) -> None:
        """Count ``n`` chunks of ``nbytes`` each that succeeded together (one batched job, so
        one latency for all) and ``skipped`` offloads of chunks already stored; one lock."""
        self.record_each(op, nbytes, [latency_s] * (n + skipped), skipped=skipped)

    def record_each(self, op: str, nbytes: int, latencies: list[float], *, skipped: int = 0) -> None:
        """Count one chunk of ``nbytes`` that succeeded per latency in ``latencies`` (an
        engine's jobs booked together, each with its own latency), the last ``skipped`` of
        them offloads of chunks already stored; one lock."""
        n = len(latencies) - skipped
        with self._lock:
            if op == "offload":
                self.offloaded += n
                self.bytes_written += n * nbytes
                self.skipped += skipped
            elif op == "load":
                self.loaded += n
                self.bytes_read += n * nbytes
            lat = self._lat.get(op)
            if lat is not None:
                lat.extend(latencies)

    def record_failure(self, exc: BaseException) -> None:
        """Count one chunk that failed, by :func:`~asynctier.errors.failure_kind` (not one
        withdrawn: its call was cancelled before it started)."""
        if type(exc) is Withdrawn:
            return
        with self._lock:
            self.failures[failure_kind(exc)] += 1

    def incr(self, name: str, n: int = 1) -> None:
        """Add ``n`` to a tier-specific counter reported in ``TierStats.extra``."""
        with self._lock:
            if name == "evictions":
                self.evictions += n
            else:
                self.extra[name] = self.extra.get(name, 0) + n

    def counters(self) -> dict[str, int]:
        """The counters behind :class:`TierStats` at one instant (``failures`` apart: see :meth:`failure_counts`)."""
        with self._lock:
            return {
                "offloaded": self.offloaded,
                "loaded": self.loaded,
                "skipped": self.skipped,
                "removed": self.removed,
                "bytes_written": self.bytes_written,
                "bytes_read": self.bytes_read,
                "evictions": self.evictions,
            }

    def failure_counts(self) -> dict[str, int]:
        """Failures by kind at one instant."""
        with self._lock:
            return dict(self.failures)

    def latency(self, op: str) -> LatencySummary:
        with self._lock:
            return self._lat[op].summary()
