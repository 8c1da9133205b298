"""Tier stats exported through prometheus_client, read back from its text format."""

from __future__ import annotations

from pathlib import Path

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
    assert get("asynctier_stored_chunks") == 2 and get("asynctier_max_inflight") >= 1
    assert 1 <= get("asynctier_peak_in_flight") <= get("asynctier_max_inflight")


async def test_collector_exports_tier_specific_figures(tmp_path: Path) -> None:
    """stats().extra (say the fs tier's direct_io_fallbacks or the nvme journal's counters)
    reaches the scrape as asynctier_tier_stat{name=...}."""
    from prometheus_client.parser import text_string_to_metric_families

    from asynctier.prometheus import TierCollector

    spec = OffloadingSpec(4096, 4)
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "fs", "root": str(tmp_path), "io_engine": "threads"}, memoryview(bytearray(spec.total_bytes)), spec
    )
    registry = prometheus_client.CollectorRegistry()
    registry.register(TierCollector({"kv": tier}))
    async with tier:
        assert (await tier.offload([b"a"], [0])).ok
        extra = {k: v for k, v in tier.stats().extra.items() if isinstance(v, int) and not isinstance(v, bool)}
        text = prometheus_client.generate_latest(registry).decode()
    got = {
        s.labels["name"]: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "asynctier_tier_stat"
    }
    assert extra and got == {k: float(v) for k, v in extra.items()}


async def test_collector_exports_each_tier_of_a_chain(tmp_path: Path) -> None:
    """A chain is exported as itself and each of its tiers as tier="name/inner", with the
    chain's figures for that tier (hits, promotions, backlog...) among the tier_stat figures."""
    from prometheus_client.parser import text_string_to_metric_families

    from asynctier.prometheus import TierCollector

    spec = OffloadingSpec(1024, 4)
    tier = SecondaryTierFactory.create_secondary_tier(
        {
            "type": "chain",
            "tiers": [{"type": "memory"}, {"type": "fs", "root": str(tmp_path), "io_engine": "threads"}],
            "write": "through",
        },
        memoryview(bytearray(spec.total_bytes)),
        spec,
    )
    registry = prometheus_client.CollectorRegistry()
    registry.register(TierCollector({"kv": tier}))
    async with tier:
        assert (await tier.offload([b"a", b"b"], [0, 1])).ok
        assert (await tier.member("memory").tier.remove([b"b"])).ok
        assert (await tier.load([b"a", b"b"], [2, 3])).ok  # b from fs, promoted
        await tier.drain()
        text = prometheus_client.generate_latest(registry).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }

    def get(metric: str, tier: str, type_: str, **labels: str) -> float:
        return samples[(metric, tuple(sorted({"tier": tier, "type": type_, **labels}.items())))]

    assert get("asynctier_chunks_total", "kv", "chain", op="load") == 2
    assert get("asynctier_chunks_total", "kv/memory", "memory", op="offload") == 3  # two stores, one promotion
    assert get("asynctier_chunks_total", "kv/fs", "fs", op="load") == 1
    assert get("asynctier_tier_stat", "kv/fs", "fs", name="chain_hits") == 1
    assert get("asynctier_tier_stat", "kv/memory", "memory", name="chain_promotions") == 1
    assert get("asynctier_tier_stat", "kv/memory", "memory", name="chain_misses") == 1
    assert get("asynctier_tier_stat", "kv", "chain", name="backlog") == 0
    assert get("asynctier_tier_stat", "kv/fs", "fs", name="chain_bytes_out") == 1024


def test_a_tier_whose_stats_raise_leaves_the_others_exported() -> None:
    """One tier's stats() that raised failed the whole scrape: every tier's metrics were lost.
    A top-level name with a "/" could be exported twice (a chain's tiers are "name/inner")."""
    from prometheus_client.parser import text_string_to_metric_families

    from asynctier.prometheus import TierCollector

    spec = OffloadingSpec(1024, 4)

    def memory() -> object:
        return SecondaryTierFactory.create_secondary_tier({"type": "memory"}, memoryview(bytearray(4096)), spec)

    good, bad = memory(), memory()

    def broken() -> None:
        raise RuntimeError("stats broke")

    bad.stats = broken  # type: ignore[attr-defined]
    registry = prometheus_client.CollectorRegistry()
    registry.register(TierCollector({"good": good, "bad": bad}))  # type: ignore[dict-item]
    for _ in range(2):
        text = prometheus_client.generate_latest(registry).decode()
    samples = {(s.name, s.labels.get("tier")): s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert ("asynctier_max_inflight", "good") in samples and ("asynctier_max_inflight", "bad") not in samples
    assert samples[("asynctier_scrape_errors_total", "bad")] == 2
    with pytest.raises(ValueError, match=r"without '/'; got 'kv/b'"):
        TierCollector({"kv/b": good})  # type: ignore[dict-item]


def test_a_chain_member_whose_stats_raise_is_left_out_not_exported_as_zeros() -> None:
    """The chain stands a failing member's stats in with zeros: exported, its counters dropped
    to 0 (a reset, to Prometheus). Registering also called every tier's stats() once."""
    from prometheus_client.parser import text_string_to_metric_families

    from asynctier.prometheus import TierCollector

    spec = OffloadingSpec(1024, 4)
    chain = SecondaryTierFactory.create_secondary_tier(
        {"type": "chain", "tiers": [{"type": "memory"}, {"type": "memory"}]}, memoryview(bytearray(4096)), spec
    )
    member = chain.members[1].tier  # type: ignore[attr-defined]
    calls: list[int] = []

    def broken() -> None:
        calls.append(1)
        raise RuntimeError("stats broke")

    member.stats = broken
    registry = prometheus_client.CollectorRegistry(auto_describe=True)
    registry.register(TierCollector({"kv": chain}))
    assert calls == []  # registering asked no tier
    text = prometheus_client.generate_latest(registry).decode()
    families = text_string_to_metric_families(text)
    tiers = {s.labels.get("tier") for f in families if f.name != "asynctier_scrape_errors" for s in f.samples}
    assert "kv" in tiers and "kv/memory" in tiers and "kv/memory-1" not in tiers, tiers
    assert 'asynctier_scrape_errors_total{tier="kv/memory-1"} 1.0' in text


def test_the_registry_still_sees_the_collectors_names() -> None:
    """An empty describe() (to keep registering from calling stats()) hid the names: two
    collectors of one prefix were both registered, and a scrape filtered by name got nothing."""
    from asynctier.prometheus import TierCollector

    spec = OffloadingSpec(1024, 4)
    tier = SecondaryTierFactory.create_secondary_tier({"type": "memory"}, memoryview(bytearray(4096)), spec)
    registry = prometheus_client.CollectorRegistry()
    registry.register(TierCollector({"a": tier}))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(TierCollector({"b": tier}))
    text = prometheus_client.generate_latest(registry.restricted_registry(["asynctier_max_inflight"])).decode()
    assert 'asynctier_max_inflight{tier="a",type="memory"}' in text


async def test_a_chain_keeps_its_totals_when_a_member_stats_fail() -> None:
    """The chain summed zeros in place of a member whose stats() raised: its counters dropped."""
    spec = OffloadingSpec(1024, 4)
    chain = SecondaryTierFactory.create_secondary_tier(
        {"type": "chain", "tiers": [{"type": "memory", "capacity_bytes": 2048}, {"type": "memory"}]},
        memoryview(bytearray(4096)),
        spec,
    )
    async with chain:
        assert (await chain.offload([b"a", b"b", b"c", b"d"], [0, 1, 2, 3])).ok
        first = chain.members[0].tier  # type: ignore[attr-defined]
        before = chain.stats().children["memory"].evictions
        assert before >= 2

        def broken() -> None:
            raise RuntimeError("stats broke")

        first.stats = broken
        after = chain.stats().children["memory"]
        assert after.evictions == before and after.extra.get("stats_failed") == 1
        assert after.extra["chain_stored"] >= 1 and "chain_breaker_open" in after.extra  # the chain's own, current
