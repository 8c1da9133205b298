"""The chain's policies on real tiers (memory, fs): configuration refused with clear messages,
admission, write-back overflow, promotion, demotion, prefix lookup, stats."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest
from chain_helpers import ChainRig, in_tier, keys

from asynctier import BlockingChunkTier, OffloadingSpec, SecondaryTierFactory, TierConfigError
from asynctier.errors import failure_kind
from asynctier.tiers.chain import NotAdmittedError, SecondHit

MEM: dict[str, Any] = {"type": "memory"}


def run(fn: Any, *args: Any) -> None:
    anyio.run(fn, *args, backend="asyncio")


def fs(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"type": "fs", "root": str(tmp_path / "kv"), "io_engine": "threads", **extra}


# -- configuration ---------------------------------------------------------------------------------
SIZED: dict[str, Any] = {**MEM, "capacity_bytes": 12 * 4096}  # a first tier demotion can keep under


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, r"tier 'chain' needs parameter 'tiers'"),
        ({"tiers": []}, r"tiers must list at least one tier config"),
        ({"tiers": "memory"}, r"tiers must be a list of tier configs"),
        ({"tiers": {"type": "memory"}}, r"tiers must be a list of tier configs"),
        ({"tiers": [42]}, r"tiers\[0\]: each tier must be a dict with 'type'; got int"),
        ({"tiers": [{"capacity_bytes": 4096}]}, r"tiers\[0\]: each tier needs 'type'"),
        ({"tiers": [MEM], "write": "around"}, r"write must be 'back' .* or 'through'"),
        ({"tiers": [MEM], "write": None}, r"write must be 'back'"),
        ({"tiers": [MEM], "backlog_chunks": True}, r"backlog_chunks must be an int from 0 to 1048576; got True"),
        ({"tiers": [MEM], "backlog_chunks": -1}, r"backlog_chunks must be an int from 0 to 1048576"),
        ({"tiers": [MEM], "max_inflight": 0}, r"max_inflight must be an int from 1 to 1024"),
        ({"tiers": [MEM], "max_inflight": 2.0}, r"max_inflight must be an int from 1 to 1024"),
        ({"tiers": [MEM], "promote": "yes"}, r"promote must be True or False"),
        ({"tiers": [MEM], "store_backpressure": "block"}, r"store_backpressure must be 'wait' or 'drop'"),
        ({"tiers": [MEM], "backpressure_timeout_s": -1}, r"backpressure_timeout_s must be a number of seconds >= 0"),
        ({"tiers": [{**MEM, "deadline_s": 0}]}, r"tiers\[0\]: deadline_s must be a number of seconds > 0 and <= 86400"),
        ({"tiers": [{**MEM, "deadline_s": "1"}]}, r"deadline_s must be"),
        ({"tiers": [{**MEM, "admit": "sometimes"}]}, r"admit policy must be one of 'second_hit', 'filter', 'all'"),
        ({"tiers": [{**MEM, "admit": 3}]}, r"admit must be 'all', 'second_hit'"),
        ({"tiers": [{**MEM, "admit": {"policy": "second_hit", "window": 1.5}}]}, r"window must be an int >= 1"),
        ({"tiers": [{**MEM, "admit": {"policy": "second_hit", "colour": 1}}]}, r"unknown key\(s\) 'colour'"),
        ({"tiers": [{**MEM, "admit": {"policy": "filter", "namespaces": "llama"}}]}, r"namespaces must be a list"),
        ({"tiers": [{**MEM, "name": "a"}, {**MEM, "name": "a"}]}, r"name 'a' is used by another tier"),
        ({"tiers": [{**MEM, "name": "a/b"}]}, r"name must be a non-empty printable str without '/'"),
        ({"tiers": [{**MEM, "breaker": {"threshold": 0}}]}, r"breaker threshold must be an int >= 1"),
        ({"tiers": [{**MEM, "breaker": {"limit": 3}}]}, r"breaker: unknown key\(s\) \['limit'\]"),
        ({"tiers": [{**MEM, "bogus": 1}]}, r"tiers\[0\] \('memory'\): unknown parameter 'bogus' for tier 'memory'"),
        ({"tiers": [{"type": "nosuch"}]}, r"tiers\[0\] \('nosuch'\): Unknown secondary tier type: 'nosuch'"),
        ({"tiers": [MEM], "demote": True}, r"demote=True needs a second tier"),
        ({"tiers": [MEM, MEM], "demote": True}, r"demote=True needs a first tier that keeps an index and has"),
        ({"tiers": [MEM], "tier": []}, r"unknown parameter 'tier' for tier 'chain'.*accepted: .*tiers"),
        ({"tiers": [MEM], "verify": 1}, r"verify must be True or False"),
        # falsy values other than None were read as "no breaker settings"
        ({"tiers": [{**MEM, "breaker": 0}]}, r"breaker must be a dict with threshold and/or cooldown_s; got 0"),
        ({"tiers": [{**MEM, "breaker": False}]}, r"breaker must be a dict .*; got False"),
        ({"tiers": [{**MEM, "breaker": []}]}, r"breaker must be a dict .*; got \[\]"),
        # a class has admit() and observe(): each call then failed, and nothing was ever admitted
        ({"tiers": [{**MEM, "admit": SecondHit}]}, r"admit must be .*; got the class SecondHit \(an instance\?\)"),
        # no slot for background writes: every write-back or demotion dropped
        ({"tiers": [MEM, MEM], "backlog_chunks": 0}, r"backlog_chunks=0 .* write='back' \(its write-backs\) would all"),
        (
            {"tiers": [SIZED, MEM], "write": "through", "demote": True, "backlog_chunks": 0},
            r"backlog_chunks=0 .* demote=True \(its demotions\) would all be dropped",
        ),
        # headroom as large as the first tier: every chunk demoted as it is stored
        (
            {"tiers": [SIZED, MEM], "demote": True, "demote_headroom_chunks": 12},
            r"demote_headroom_chunks=12 .* leaves no room in tiers\[0\], of capacity_bytes=49152",
        ),
    ],
)
def test_bad_config_is_refused_with_a_clear_message(config: dict[str, Any], message: str) -> None:
    spec = OffloadingSpec(4096, 4)
    with pytest.raises(TierConfigError, match=message):
        SecondaryTierFactory.create_secondary_tier({"type": "chain", **config}, memoryview(bytearray(16384)), spec)


def test_config_dict_is_left_untouched(tmp_path: Path) -> None:
    entry = {**fs(tmp_path), "name": "disk", "admit": "second_hit", "deadline_s": 1.0}
    config = {"type": "chain", "tiers": [MEM, entry]}
    before = repr(config)
    rig = ChainRig()
    SecondaryTierFactory.create_secondary_tier(config, memoryview(rig.buf), rig.spec)
    assert repr(config) == before


# -- admission -------------------------------------------------------------------------------------
def test_second_hit_admits_a_key_seen_twice(tmp_path: Path) -> None:
    async def check() -> None:
        rig = ChainRig()
        chain = rig.chain(tiers=[MEM, {**fs(tmp_path), "admit": {"policy": "second_hit", "window": 100}}])
        async with chain:
            once, twice, looked = keys(1, "once"), keys(1, "twice"), keys(1, "looked")
            assert (await chain.offload(once, [0])).ok
            assert (await chain.offload(twice, [1])).ok
            assert (await chain.offload(twice, [1])).ok  # the second sighting: now fs takes it
            assert await chain.lookup(looked) == [False]  # a lookup counts as a sighting
            assert (await chain.offload(looked, [2])).ok
            await chain.drain()
            assert await in_tier(chain, "memory", once + twice + looked) == [True] * 3
            assert await in_tier(chain, "fs", once + twice + looked) == [False, True, True]
            fs_stats = chain.stats().children["fs"].extra
            assert fs_stats["chain_not_admitted"] == 2 and fs_stats["chain_written_back"] == 2

    run(check)


def test_filter_and_callable_policies(tmp_path: Path) -> None:
    async def check() -> None:
        rig = ChainRig()
        reasons: list[str] = []

        def only_pinned(key: bytes, reason: str) -> bool:
            reasons.append(reason)
            return key.startswith(b"pin")

        chain = rig.chain(
            tiers=[
                {**MEM, "admit": {"policy": "filter", "namespaces": ["other-model/*"]}},  # never this spec
                {**fs(tmp_path), "admit": only_pinned},
            ]
        )
        async with chain:
            pinned, loose = keys(2, "pin"), keys(2, "loose")
            res = await chain.offload(pinned + loose, [0, 1, 2, 3])
            assert res.succeeded == pinned  # memory takes nothing; fs only the pinned keys, at once
            for k in loose:
                assert isinstance(res.failed[k], NotAdmittedError) and failure_kind(res.failed[k]) == "other"
            assert set(reasons) == {"store"}
            assert await in_tier(chain, "memory", pinned) == [False, False]
            assert await in_tier(chain, "fs", pinned) == [True, True]
            rig.zero()
            assert (await chain.load(pinned, [5, 6])).ok
            assert rig.chunk(5) == rig.orig_chunk(0) and rig.chunk(6) == rig.orig_chunk(1)
            await chain.drain()
            assert await in_tier(chain, "memory", pinned) == [False, False]  # not promoted: not admitted

    run(check)


def test_key_prefix_filter(tmp_path: Path) -> None:
    async def check() -> None:
        rig = ChainRig()
        chain = rig.chain(tiers=[MEM, {**fs(tmp_path), "admit": {"policy": "filter", "key_prefixes": ["sys:"]}}])
        async with chain:
            ks = [b"sys:a", b"user:b"]
            assert (await chain.offload(ks, [0, 1])).ok
            await chain.drain()
            assert await in_tier(chain, "fs", ks) == [True, False]

    run(check)


# -- write-back, promotion, demotion -------------------------------------------------------------------
def test_write_back_overflow_is_dropped_and_counted_never_blocking(tmp_path: Path) -> None:
    async def check() -> None:
        rig = ChainRig()
        chain = rig.chain(tiers=[MEM, fs(tmp_path)], write="back", backlog_chunks=1, max_inflight=16)
        async with chain:
            ks = keys(16)
            # the call runs as 4 batches of 4; a batch hands its chunks over at once, so at most
            # one of each 4 finds the one backlog slot free: the others are dropped, not waited for
            res = await chain.offload(ks, list(range(16)))
            assert res.ok, res.failed
            await chain.drain()
            s = chain.stats()
            drops, written = s.extra["background_drops"], s.children["fs"].extra["chain_written_back"]
            assert drops >= 12 and drops + written == 16, (drops, written)
            assert s.children["fs"].extra["chain_drops"] == drops
            assert sum(await in_tier(chain, "fs", ks)) == written
            rig.zero()
            assert (await chain.load(ks, list(range(16)))).ok  # all of it in the first tier
            assert all(rig.chunk(i) == rig.orig_chunk(i) for i in range(16))

    run(check)


def test_lower_hit_is_promoted_in_the_background(tmp_path: Path) -> None:
    async def check() -> None:
        rig = ChainRig()
        chain = rig.chain(tiers=[MEM, fs(tmp_path)], write="through")
        async with chain:
            ks = keys(4)
            assert (await chain.offload(ks, [0, 1, 2, 3])).ok
            assert (await chain.member("memory").tier.remove(ks[:2])).ok  # only fs holds these now
            rig.zero()
            res = await chain.load(ks, [4, 5, 6, 7])
            assert res.ok and [rig.chunk(4 + i) for i in range(4)] == [rig.orig_chunk(i) for i in range(4)]
            await chain.drain()
            assert await in_tier(chain, "memory", ks) == [True] * 4
            s = chain.stats()
            assert s.children["memory"].extra["chain_hits"] == 2 and s.children["fs"].extra["chain_hits"] == 2
            assert s.children["memory"].extra["chain_misses"] == 2
            assert s.children["memory"].extra["chain_promotions"] == 2 and s.extra["promotions"] == 2
            assert s.children["fs"].extra["chain_bytes_out"] == 2 * rig.spec.chunk_bytes

    run(check)


def test_demotion_moves_the_first_tiers_victims_down(tmp_path: Path) -> None:
    async def check() -> None:
        rig = ChainRig()
        c = rig.spec.chunk_bytes
        chain = rig.chain(
            tiers=[{**MEM, "capacity_bytes": 8 * c}, {**fs(tmp_path), "admit": lambda k, reason: reason == "demote"}],
            demote=True,
            demote_headroom_chunks=2,
        )
        async with chain:
            ks = keys(16)
            for i, k in enumerate(ks):
                assert (await chain.offload([k], [i])).ok
                await chain.drain()  # demotion keeps up: the first tier never evicts by itself
            s = chain.stats()
            assert s.children["memory"].evictions == 0
            assert s.children["memory"].used_bytes is not None and s.children["memory"].used_bytes <= 6 * c
            assert s.children["fs"].extra["chain_demotions"] >= 10
            in_memory, in_fs = await in_tier(chain, "memory", ks), await in_tier(chain, "fs", ks)
            assert all(m or f for m, f in zip(in_memory, in_fs)), "a victim was lost"
            assert in_fs[0] and in_memory[-1]  # the oldest went down, the newest stayed
            rig.zero()
            assert (await chain.load(ks, list(range(16)))).ok
            assert all(rig.chunk(i) == rig.orig_chunk(i) for i in range(16))

    run(check)


def test_two_members_on_one_medium_are_refused(tmp_path: Path) -> None:
    """Two fs members on one root were accepted: the first one's eviction deleted files the
    second one's index still listed (8 keys found by lookup_prefix, 4 of them loadable)."""
    rig = ChainRig()
    with pytest.raises(TierConfigError, match=r"tiers 'fs' and 'fs-1' both keep their chunks in .*kv"):
        rig.chain(tiers=[{"type": "fs", "root": str(tmp_path / "kv")}, {"type": "fs", "root": str(tmp_path / "kv/.")}])
    chain = rig.chain(
        tiers=[MEM, MEM, {"type": "fs", "root": str(tmp_path / "a")}, {"type": "fs", "root": str(tmp_path / "b")}]
    )
    assert [m.name for m in chain.members] == ["memory", "memory-1", "fs", "fs-1"]  # as the docs say
    with pytest.raises(TierConfigError, match=r"name 'memory-1' \(a name given by default"):
        rig.chain(tiers=[MEM, MEM, {**MEM, "name": "memory-1"}])
    nested = {"type": "chain", "name": "inner", "tiers": [{"type": "fs", "root": str(tmp_path / "kv")}]}
    with pytest.raises(TierConfigError, match=r"tiers 'fs' and 'inner/fs' both keep their chunks in"):
        rig.chain(tiers=[{"type": "fs", "root": str(tmp_path / "kv")}, nested])  # a chain inside: its tiers too


def test_two_remote_members_on_one_place_are_refused(tmp_path: Path) -> None:
    """Only fs and nvme media were compared: two obj tiers on one directory were accepted, and
    the first one's evictions deleted objects the second one still counted (2 of 8 lost).
    The same holds for one bucket and prefix at one endpoint, and one valkey key prefix."""
    rig = ChainRig()
    here = {"type": "obj", "url": f"file://{tmp_path}/o"}
    with pytest.raises(TierConfigError, match=r"tiers 'obj' and 'obj-1' both keep their chunks in .*/o:"):
        rig.chain(tiers=[here, {"type": "obj", "url": f"file://{tmp_path}/x/../o/"}])
    s3 = {"type": "obj", "url": "s3://b/p", "endpoint": "http://127.0.0.1:9"}
    with pytest.raises(TierConfigError, match=r"both keep their chunks in s3://b/p \(endpoint http://127.0.0.1:9\)"):
        rig.chain(tiers=[s3, {**s3, "url": "s3://b/p/"}])
    vk = {"type": "valkey", "url": "redis://127.0.0.1:9"}
    with pytest.raises(TierConfigError, match=r"both keep their chunks in valkey 127.0.0.1:9 db 0, key_prefix"):
        rig.chain(tiers=[vk, {**vk, "url": "redis://127.0.0.1:9,127.0.0.1:10"}])
    apart = [
        here,
        {**s3, "url": "s3://b/q"},
        s3,
        {**vk, "key_prefix": "other:"},
        vk,
        {"type": "obj", "url": "memory://"},
    ]
    assert len(rig.chain(tiers=[*apart, {"type": "obj", "url": "memory://"}]).members) == 7  # each its own place
    with pytest.raises(TierConfigError, match=r"both keep their chunks in s3://b/p \(endpoint"):
        rig.chain(tiers=[s3, {**s3, "url": "s3a://b/p"}])  # one place under two spellings


def test_remote_members_in_different_places_are_not_refused_and_nothing_secret_is_shown() -> None:
    """The place was the redacted URL and the endpoint argument: two Azure containers of one
    account (the container is the URL's user info), two accounts, two endpoints given in
    ``config`` were refused as one place."""
    rig = ChainRig()
    az = {"type": "obj", "url": "abfs://alpha@acct.dfs.core.windows.net/cache"}
    other_az = {**az, "url": "abfs://beta@acct.dfs.core.windows.net/cache"}
    acct = {"type": "obj", "url": "az://cache/p", "config": {"account_name": "acct1"}}
    ep = {"type": "obj", "url": "s3://b/p", "config": {"aws_endpoint": "http://127.0.0.1:9001"}}
    tiers = [az, other_az, acct, {**acct, "config": {"account_name": "acct2"}}, ep,
             {**ep, "config": {"aws_endpoint": "http://127.0.0.1:9002"}}]  # fmt: skip
    assert len(rig.chain(tiers=tiers).members) == 6
    for pw in ("s3cr3t/Pw", "s3cr/et/pw", "s3cr?etpw", "s3cr#et@pw"):
        leak = {"type": "obj", "url": "s3://b/p", "config": {"aws_endpoint": f"http://minio:{pw}@127.0.0.1:9000"}}
        with pytest.raises(TierConfigError) as e:
            rig.chain(tiers=[leak, {**leak, "config": {"endpoint": "http://127.0.0.1:9000"}}])  # (one place)
        assert "s3cr" not in str(e.value) and "127.0.0.1:9000" in str(e.value), str(e.value)


class PlacedTier(BlockingChunkTier):
    """A tier of one's own that names its place by setting ``media``, as the docs say."""

    uses_index = True

    def __init__(self, where: str = "/srv/x", **kw: Any) -> None:
        super().__init__(**kw)
        self.media = (where,)

    def write_chunk(self, key: bytes, data: memoryview) -> None:
        raise NotImplementedError

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        raise NotImplementedError

    def chunk_exists(self, key: bytes) -> bool:
        return False

    def delete_chunk(self, key: bytes) -> bool:
        return False


def test_a_tier_of_your_own_names_its_place_by_setting_media() -> None:
    """``media`` became a property of the built-ins: a tier that set it, as the docs say,
    failed to construct (no setter)."""
    rig = ChainRig()
    placed = {"type": "PlacedTier", "module_path": __name__}
    with pytest.raises(TierConfigError, match=r"both keep their chunks in /srv/x"):
        rig.chain(tiers=[placed, placed])
    assert len(rig.chain(tiers=[placed, {**placed, "where": "/srv/y"}]).members) == 2


def test_building_a_tier_touches_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tier's constructor does no I/O (DESIGN.md): resolving the place with realpath had
    moved into every fs, nvme and obj constructor; only a chain asks for it."""
    import os as _os

    seen: list[str] = []
    real = _os.lstat

    def lstat(p: Any, *a: Any, **k: Any) -> Any:
        seen.append(str(p))
        return real(p, *a, **k)

    monkeypatch.setattr(_os, "lstat", lstat)
    rig = ChainRig()
    for cfg in ({"type": "fs", "root": str(tmp_path / "a")}, {"type": "obj", "url": f"file://{tmp_path}/o"},
                {"type": "nvme", "path": str(tmp_path / "s.slab"), "capacity_bytes": 1 << 24}):  # fmt: skip
        rig.tier(cfg)
    assert seen == [], seen


def test_promotions_into_the_first_tier_start_demotion(tmp_path: Path) -> None:
    """Only stores woke the demoter: promotions took the first tier over its mark and it stayed
    there, so the next stores made it evict by itself chunks no other tier held."""

    async def check() -> None:
        rig = ChainRig()
        c = rig.spec.chunk_bytes
        chain = rig.chain(
            tiers=[
                {**MEM, "capacity_bytes": 8 * c, "admit": lambda k, reason: not (k[:1] == b"P" and reason == "store")},
                {**fs(tmp_path), "admit": lambda k, reason: k[:1] == b"P" or reason == "demote"},
            ],
            demote=True,
            demote_headroom_chunks=2,
        )
        async with chain:
            m, p = [b"M%d" % i for i in range(8)], [b"P0", b"P1"]
            assert (await chain.offload(m[:6], list(range(6)))).ok  # the first tier at its mark
            assert (await chain.offload(p, [8, 9])).ok  # the second tier only
            await chain.drain()
            assert (await chain.load(p, [10, 11])).ok  # promoted: the first tier 2 over its mark
            await chain.drain()
            assert (await chain.offload(m[6:], [6, 7])).ok
            await chain.drain()
            assert chain.stats().children["memory"].evictions == 0
            rig.zero()
            res = await chain.load(m, list(range(8)))
            assert res.ok, f"lost: {sorted(res.failed)}"
            assert all(rig.chunk(i) == rig.orig_chunk(i) for i in range(8))

    run(check)


# -- prefix lookup ---------------------------------------------------------------------------------
def test_lookup_prefix_spans_tiers(tmp_path: Path) -> None:
    async def check() -> None:
        rig = ChainRig()
        chain = rig.chain(tiers=[MEM, fs(tmp_path)], write="through")
        async with chain:
            ks = keys(6)
            assert (await chain.offload(ks[:4], [0, 1, 2, 3])).ok
            assert (await chain.member("memory").tier.remove([ks[1], ks[3]])).ok  # fs only
            assert (await chain.member("fs").tier.remove([ks[0]])).ok  # memory only
            assert (await chain.member("memory").tier.offload([ks[5]], [5])).ok  # after a gap
            assert await chain.lookup_prefix(ks) == 4
            assert await chain.lookup_prefix(ks[1:]) == 3
            assert await chain.lookup_prefix([ks[4], *ks[:4]]) == 0
            assert await chain.lookup(ks) == [True, True, True, True, False, True]

    run(check)


def test_stats_name_every_tier(tmp_path: Path) -> None:
    async def check() -> None:
        rig = ChainRig()
        chain = rig.chain(tiers=[{**MEM, "name": "ram"}, fs(tmp_path)])
        async with chain:
            ks = keys(3)
            assert (await chain.offload(ks, [0, 1, 2])).ok
            await chain.drain()
            s = chain.stats()
            assert s.tier_type == "chain" and s.offloaded == 3 and set(s.children) == {"ram", "fs"}
            assert s.children["ram"].tier_type == "memory" and s.children["ram"].offloaded == 3
            assert s.children["fs"].offloaded == 3 and s.children["fs"].extra["chain_written_back"] == 3
            assert s.extra["backlog"] == 0 and s.children["fs"].extra["chain_backlog"] == 0
            assert re.fullmatch(r"<ChainTier type='chain' namespace='chain/test'>", repr(chain))

    run(check)
