"""Tier stats exported through prometheus_client, read back from its text format."""

from __future__ import annotations

import pytest

from asynctier import OffloadingSpec, SecondaryTierFactory

prometheus_client = pytest.importorskip("prometheus_client")


async def test_collector_exports_live_stats() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from asynctier.prometheus import TierCollector

    spec = OffloadingSpec(1024, 4)
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "memory", "capacity_bytes": 4096}, memoryview(bytearray(spec.total_bytes)), spec
    )
    registry = prometheus_client.CollectorRegistry()
    registry.register(TierCollector({"kv": tier}))
    async with tier:
        assert (await tier.offload([b"a", b"b"], [0, 1])).ok
        await tier.load([b"a", b"zz"], [2, 3])
        text = prometheus_client.generate_latest(registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }

    def get(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted({"tier": "kv", "type": "memory", **labels}.items())))]

    assert get("asynctier_chunks_total", op="offload") == 2
    assert get("asynctier_chunks_total", op="load") == 1
    assert get("asynctier_bytes_total", op="offload") == 2048
    assert get("asynctier_failures_total", kind="not_found") == 1
    assert get("asynctier_used_bytes") == 2048 and get("asynctier_capacity_bytes") == 4096
    assert get("asynctier_latency_seconds", op="load", quantile="0.99") > 0
