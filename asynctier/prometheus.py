"""Export tier stats as Prometheus metrics (extra ``prometheus``).

::

    from prometheus_client import REGISTRY, start_http_server
    from asynctier.prometheus import TierCollector

    REGISTRY.register(TierCollector({"kv-fs": fs_tier, "kv-s3": s3_tier}))
    start_http_server(9400)

Values are read from :meth:`SecondaryTierManager.stats` at scrape time, so nothing is
recorded twice and the hot path pays nothing for metrics.

A tier made of tiers (the ``chain`` tier) is exported as itself under its name, and each of
its tiers under ``name/inner`` (``tier="kv/fs"``) with the chain's figures for that tier
(hits, misses, promotions, demotions, drops, backlog, bytes moved) among the
``asynctier_tier_stat`` figures; nested chains nest the names. A tier whose ``stats()``
raises is left out of that scrape (logged; ``asynctier_scrape_errors`` counts it), the others
are exported.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping

try:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
    from prometheus_client.registry import Collector
except ImportError as e:  # (say which extra brings it, as the factory does for a tier's client)
    raise ImportError(
        f"asynctier.prometheus needs prometheus_client: pip install 'asynctier[prometheus]' ({e})", name=e.name
    ) from e

from .contract import SecondaryTierManager
from .stats import STATS_FAILED, TierStats

__all__ = ["TierCollector"]

log = logging.getLogger("asynctier.prometheus")


class TierCollector(Collector):
    """A Prometheus collector for named tiers (the name becomes the ``tier`` label)."""

    def __init__(self, tiers: Mapping[str, SecondaryTierManager], prefix: str = "asynctier") -> None:
        bad = [n for n in tiers if not isinstance(n, str) or not n or "/" in n]
        if bad:  # ("/" joins a chain's name to its tiers': "kv/fs" would be exported twice)
            raise ValueError(f"TierCollector: tier names must be non-empty strings without '/'; got {bad[0]!r}")
        self._tiers = dict(tiers)
        self._p = prefix
        self._scrape_errors: dict[str, int] = {}
        self._errors_lock = threading.Lock()  # (scrapes may run on several threads at once)

    def describe(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        """The families, empty: their names never depend on the tiers, so registering calls no
        tier's ``stats()`` (the registry calls ``collect()`` where a collector has no
        ``describe``), and the registry still finds duplicate names and filters scrapes."""
        return list(self._families().values())

    def _families(self) -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
        p = self._p
        labels = ["tier", "type"]
        return {
            "chunks": CounterMetricFamily(f"{p}_chunks", "Chunks transferred", labels=[*labels, "op"]),
            "bytes": CounterMetricFamily(f"{p}_bytes", "Bytes transferred", labels=[*labels, "op"]),
            "failures": CounterMetricFamily(f"{p}_failures", "Per-chunk failures by kind", labels=[*labels, "kind"]),
            "evictions": CounterMetricFamily(f"{p}_evictions", "Chunks evicted to make room", labels=labels),
            "in_flight": GaugeMetricFamily(f"{p}_in_flight", "Chunk I/Os running now", labels=labels),
            "queued": GaugeMetricFamily(f"{p}_queued", "Chunk I/Os waiting for a slot", labels=labels),
            "used": GaugeMetricFamily(f"{p}_used_bytes", "Bytes held by the tier", labels=labels),
            "capacity": GaugeMetricFamily(f"{p}_capacity_bytes", "Capacity of the tier", labels=labels),
            "stored": GaugeMetricFamily(f"{p}_stored_chunks", "Chunks held by the tier", labels=labels),
            "peak": GaugeMetricFamily(f"{p}_peak_in_flight", "Most chunk I/Os seen running at once", labels=labels),
            "bound": GaugeMetricFamily(f"{p}_max_inflight", "The tier's bound on chunk I/Os in flight", labels=labels),
            # tier-specific figures (stats().extra): counters and levels alike, so exported as gauges
            "extra": GaugeMetricFamily(
                f"{p}_tier_stat", "A tier-specific figure from stats().extra", labels=[*labels, "name"]
            ),
            "latency": GaugeMetricFamily(
                f"{p}_latency_seconds", "Recent per-chunk latency quantiles", labels=[*labels, "op", "quantile"]
            ),
            "scrape_errors": CounterMetricFamily(
                f"{p}_scrape_errors", "Scrapes that left the tier out: its stats() raised", labels=["tier"]
            ),
        }

    def _failed(self, name: str, e: BaseException) -> None:
        with self._errors_lock:
            self._scrape_errors[name] = self._scrape_errors.get(name, 0) + 1
        log.warning("asynctier: stats() of tier %r raised: %r (left out of this scrape)", name, e)

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | SummaryMetricFamily]:
        fam = self._families()
        chunks, nbytes, failures, evictions = fam["chunks"], fam["bytes"], fam["failures"], fam["evictions"]
        in_flight, queued, used, capacity = fam["in_flight"], fam["queued"], fam["used"], fam["capacity"]
        stored, peak, bound, extra, latency = fam["stored"], fam["peak"], fam["bound"], fam["extra"], fam["latency"]

        def flattened(name: str, s: TierStats) -> Iterator[tuple[str, TierStats]]:
            if s.extra.get(STATS_FAILED):  # a chain's member whose stats() raised: zeros, not its figures
                self._failed(name, RuntimeError("its stats() raised (logged by the chain)"))
                return
            yield name, s
            for child, cs in s.children.items():
                yield from flattened(f"{name}/{child}", cs)

        def each() -> Iterator[tuple[str, TierStats]]:
            for name, tier in self._tiers.items():
                try:
                    s = tier.stats()
                except Exception as e:  # one tier's failure must not take the others' metrics down
                    self._failed(name, e)
                    continue
                yield from flattened(name, s)

        snapshots = list(each())
        scrape_errors = fam["scrape_errors"]
        with self._errors_lock:
            errors = sorted(self._scrape_errors.items())
        for name, n in errors:
            scrape_errors.add_metric([name], n)
        for name, s in snapshots:
            base = [name, s.tier_type]
            chunks.add_metric([*base, "offload"], s.offloaded)
            chunks.add_metric([*base, "load"], s.loaded)
            chunks.add_metric([*base, "skip"], s.skipped)
            chunks.add_metric([*base, "remove"], s.removed)
            nbytes.add_metric([*base, "offload"], s.bytes_written)
            nbytes.add_metric([*base, "load"], s.bytes_read)
            for kind, n in s.failures.items():
                failures.add_metric([*base, kind], n)
            evictions.add_metric(base, s.evictions)
            in_flight.add_metric(base, s.in_flight)
            queued.add_metric(base, s.queued)
            if s.used_bytes is not None:
                used.add_metric(base, s.used_bytes)
            if s.capacity_bytes is not None:
                capacity.add_metric(base, s.capacity_bytes)
            if s.stored_chunks is not None:
                stored.add_metric(base, s.stored_chunks)
            peak.add_metric(base, s.peak_in_flight)
            bound.add_metric(base, s.max_inflight)
            for key, value in sorted(s.extra.items()):
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    extra.add_metric([*base, key], value)
            for op, lat in (("offload", s.offload_latency), ("load", s.load_latency)):
                for q, v in (("0.5", lat.p50), ("0.9", lat.p90), ("0.99", lat.p99)):
                    latency.add_metric([*base, op, q], v)
        yield from (chunks, nbytes, failures, evictions, in_flight, queued, used, capacity, stored, peak, bound, extra)
        yield latency
        yield scrape_errors
