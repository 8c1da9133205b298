"""The valkey tier on a real three-node cluster while a slot moves: the client's cached slot
map goes stale (MOVED) or a slot is half-migrated (ASK); every chunk still loads byte-exact."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from valkey_helpers import ValkeyCluster3, ValkeyProcess, valkey_cluster3

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.errors import failure_kind

__all__ = ["valkey_cluster3"]

key_slot = pytest.importorskip("valkey.crc", reason="the valkey tier's tests need valkey-py").key_slot

CHUNK = 8 * 1024
SPEC = OffloadingSpec(CHUNK, 16, namespace="valkey/cluster")


def same_slot_keys(tier: Any, n: int, tag: str) -> tuple[int, list[bytes]]:
    """``n`` keys whose names fall in one slot (found by trying names)."""
    by_slot: dict[int, list[bytes]] = {}
    i = 0
    while True:
        k = f"{tag}-{i}".encode()
        i += 1
        group = by_slot.setdefault(key_slot(tier.name_of(k)), [])
        group.append(k)
        if len(group) == n:
            return key_slot(tier.name_of(k)), group


def other_node(cluster: ValkeyCluster3, slot: int) -> ValkeyProcess:
    with contextlib.closing(cluster.nodes[0].client()) as c:
        slots = c.execute_command("CLUSTER", "SLOTS")
    owner_port = next(int(r[2][1]) for r in slots if int(r[0]) <= slot <= int(r[1]))
    return next(n for n in cluster.nodes if n.port != owner_port)


def current_owner(cluster: ValkeyCluster3, slot: int) -> ValkeyProcess:
    with contextlib.closing(cluster.nodes[0].client()) as c:
        slots = c.execute_command("CLUSTER", "SLOTS")
    owner_port = next(int(r[2][1]) for r in slots if int(r[0]) <= slot <= int(r[1]))
    return next(n for n in cluster.nodes if n.port == owner_port)


def migrate(cluster: ValkeyCluster3, slot: int, names: list[bytes], *, finish: bool) -> ValkeyProcess:
    """Move ``names`` of ``slot`` to another node; with ``finish``, hand the slot over too
    (clients then get MOVED); without, leave it MIGRATING/IMPORTING (clients get ASK)."""
    src = current_owner(cluster, slot)
    dst = other_node(cluster, slot)
    src_id, dst_id = cluster.node_id(src), cluster.node_id(dst)
    with contextlib.closing(src.client()) as s, contextlib.closing(dst.client()) as d:
        d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id)
        s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id)
        s.execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *names)
        if finish:
            for n in cluster.nodes:
                with contextlib.closing(n.client()) as c:
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
    return dst


def hand_over(cluster: ValkeyCluster3, slot: int, dst: ValkeyProcess) -> None:
    dst_id = cluster.node_id(dst)
    for n in cluster.nodes:
        with contextlib.closing(n.client()) as c:
            c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)


@pytest.mark.parametrize("finish", [True, False], ids=["moved", "ask"])
def test_a_slot_migration_is_followed_transparently(valkey_cluster3: ValkeyCluster3, finish: bool) -> None:
    buf = bytearray(os.urandom(SPEC.total_bytes))
    tier: Any = SecondaryTierFactory.create_secondary_tier(
        {"type": "valkey", "url": valkey_cluster3.url, "key_prefix": f"mig-{finish}"}, memoryview(buf), SPEC
    )
    slot, ks = same_slot_keys(tier, 8, "slot")
    data = [bytes(SPEC.chunk_view(memoryview(buf), i)) for i in range(8)]

    async def check() -> None:
        buf[:] = bytes(len(buf))
        res = await tier.load(ks, list(range(8, 16)))
        assert res.ok, res.failed
        assert [bytes(SPEC.chunk_view(memoryview(buf), 8 + i)) for i in range(8)] == data
        assert await tier.lookup(ks) == [True] * 8
        fresh = [k + b"-new" for k in ks]
        assert (await tier.offload(fresh, list(range(8)))).ok
        assert (await tier.remove(ks)).ok
        assert await tier.lookup(ks + fresh) == [False] * 8 + [True] * 8
        assert sorted(await tier.stored_keys()) == sorted(fresh), "a listing scans every node"

    async def main() -> None:
        async with tier:
            assert (await tier.offload(ks, list(range(8)))).ok  # the client now caches the slot map
            moved = ks if finish else ks[:4]
            dst = migrate(valkey_cluster3, slot, [tier.name_of(k) for k in moved], finish=finish)
            try:
                await check()
            finally:
                if not finish:  # end the migration: the slot's keys are removed by then
                    hand_over(valkey_cluster3, slot, dst)

    anyio.run(main, backend="asyncio")


def test_a_wrong_password_on_a_cluster_is_a_refusal_not_an_unreachable_cluster(
    valkey_cluster3: ValkeyCluster3,
) -> None:
    """valkey-py reports a refused password while it reads the layout as a cluster it cannot
    connect to: every key failed ``unavailable`` and the breaker opened, where the docs (and
    one server) say ``io``, breakers closed."""
    for n in valkey_cluster3.nodes:
        with contextlib.closing(n.client()) as c:
            c.config_set("requirepass", "right-pw")
    try:
        url = "redis://default:wrong-pw@" + valkey_cluster3.url[len("redis://") :]
        buf = bytearray(SPEC.total_bytes)
        tier: Any = SecondaryTierFactory.create_secondary_tier(
            {"type": "valkey", "url": url, "key_prefix": "auth", "breaker_threshold": 2}, memoryview(buf), SPEC
        )

        async def main() -> None:
            async with tier:
                for _ in range(3):
                    res = await tier.offload([b"a", b"b"], [0, 1])
                    assert {failure_kind(e) for e in res.failed.values()} == {"io"}, res.failed
                    assert all("wrong-pw" not in str(e) for e in res.failed.values())
                assert tier.breaker_state == "closed"

        anyio.run(main, backend="asyncio")
    finally:
        for n in valkey_cluster3.nodes:
            with contextlib.closing(n.client(password="right-pw")) as c:
                c.config_set("requirepass", "")


def test_a_fresh_tiers_listing_covers_the_cluster(valkey_cluster3: ValkeyCluster3) -> None:
    """A tier that had made no call yet listed nothing: its client had not read the cluster's
    layout and knew no node to SCAN (fsck said "clean, 0 chunks", the cluster up or down)."""
    buf = bytearray(os.urandom(SPEC.total_bytes))
    config = {"type": "valkey", "url": valkey_cluster3.url, "key_prefix": "fresh-list"}
    ks = [b"fl%d" % i for i in range(8)]

    async def main() -> None:
        writer: Any = SecondaryTierFactory.create_secondary_tier(config, memoryview(buf), SPEC)
        async with writer:
            assert (await writer.offload(ks, list(range(8)))).ok
        fresh: Any = SecondaryTierFactory.create_secondary_tier(config, memoryview(buf), SPEC)
        async with fresh:
            assert sorted(await fresh.stored_keys()) == sorted(ks)
            assert (await fresh.remove(ks)).ok

    anyio.run(main, backend="asyncio")


def test_a_node_that_dies_fails_its_keys_and_nothing_hangs(tmp_path: Path) -> None:
    """A primary killed under the tier: every key loads byte-exact or fails with a per-key
    error within the deadline; the cluster's other slots go on serving after it."""
    cluster = ValkeyCluster3(tmp_path)
    try:
        buf = bytearray(os.urandom(SPEC.total_bytes))
        tier: Any = SecondaryTierFactory.create_secondary_tier(
            {"type": "valkey", "url": cluster.url, "timeout_s": 2, "breaker_threshold": 1000}, memoryview(buf), SPEC
        )
        ks = [b"die-%d" % i for i in range(16)]
        data = [bytes(SPEC.chunk_view(memoryview(buf), i)) for i in range(16)]

        async def main() -> None:
            async with tier:
                assert (await tier.offload(ks, list(range(16)))).ok
                cluster.nodes[2].stop()
                buf[:] = bytes(len(buf))
                res = await tier.load(ks, list(range(16)))
                assert {failure_kind(e) for e in res.failed.values()} <= {"unavailable", "timeout"}, res.failed
                for k in res.succeeded:
                    i = ks.index(k)
                    assert bytes(SPEC.chunk_view(memoryview(buf), i)) == data[i]
                dead = cluster.nodes[2]
                lo, hi = cluster.RANGES[cluster.nodes.index(dead)]
                on_live = [k for k in ks if not lo <= key_slot(tier.name_of(k)) <= hi]
                buf[:] = bytes(len(buf))
                res = await tier.load(on_live, list(range(len(on_live))))
                assert res.ok, res.failed  # once the client has seen the node gone, one call at most

        anyio.run(main, backend="asyncio")
    finally:
        cluster.stop()


def _partial_cluster_tier(cluster: ValkeyCluster3, timeout_s: float) -> Any:
    """A tier on ``cluster`` whose live nodes go on serving their slots when one is down, each
    call one batch (keys of every node in one pipeline), its breakers opened by two failures."""
    for n in cluster.nodes:
        with contextlib.closing(n.client()) as c:
            c.config_set("cluster-require-full-coverage", "no")
    buf = bytearray(os.urandom(SPEC.total_bytes))
    config = {"type": "valkey", "url": cluster.url, "timeout_s": timeout_s, "breaker_threshold": 2,
              "breaker_cooldown_s": 60, "max_inflight": 1}  # fmt: skip
    return SecondaryTierFactory.create_secondary_tier(config, memoryview(buf), SPEC)


async def _stored_by_node(
    tier: Any, cluster: ValkeyCluster3, ks: list[bytes], node: int
) -> tuple[list[bytes], list[bytes]]:
    """Store ``ks`` (slots 0..): the keys node ``node`` serves, and the others (neither empty)."""
    assert (await tier.offload(ks, list(range(len(ks))))).ok
    lo, hi = cluster.RANGES[node]
    on_node = [k for k in ks if lo <= key_slot(tier.name_of(k)) <= hi]
    others = [k for k in ks if k not in on_node]
    assert on_node and others
    return on_node, others


def test_one_node_gone_opens_its_own_breaker_not_the_clusters(tmp_path: Path) -> None:
    """One breaker for the whole cluster: the batches of a dead primary opened it, and then
    the keys of the live nodes failed too ("circuit breaker open") for as long as the node
    was down. Each node has its own now; a batch that spans nodes serves the keys of those
    that answer."""
    cluster = ValkeyCluster3(tmp_path)
    try:
        tier = _partial_cluster_tier(cluster, timeout_s=2)
        ks = [b"gone-%d" % i for i in range(16)]

        async def main() -> None:
            async with tier:
                on_dead, on_live = await _stored_by_node(tier, cluster, ks, 2)
                cluster.nodes[2].stop()
                for _ in range(4):  # one key a batch: the dead node's batches open its breaker
                    for k in on_dead:
                        await tier.load([k], [0])
                assert tier.breaker_state == "open"
                res = await tier.load(on_live, list(range(len(on_live))))
                assert res.ok, res.failed
                res = await tier.load(ks, list(range(16)))  # batches across nodes: the live ones' keys load
                assert set(res.succeeded) == set(on_live), res.failed
                assert {failure_kind(e) for e in res.failed.values()} == {"unavailable"}
                # a batch led by a key of the dead node: its breaker fails that key, not the batch
                res = await tier.load([on_dead[0], *on_live], list(range(1 + len(on_live))))
                assert set(res.succeeded) == set(on_live) and set(res.failed) == {on_dead[0]}, res.failed

        anyio.run(main, backend="asyncio")
    finally:
        cluster.stop()


def test_a_node_that_hangs_fails_its_own_keys_not_the_batch(tmp_path: Path) -> None:
    """A stopped node (it keeps its sockets and answers nothing): a batch across nodes waited
    for it until timeout_s, so every key failed, and every node's breaker was booked a
    failure and opened. On the review's script no key of a live node loaded for as long as
    the node hung. Each node's part of a batch now goes on its own, under its own deadline."""
    cluster = ValkeyCluster3(tmp_path)
    try:
        tier = _partial_cluster_tier(cluster, timeout_s=0.5)
        ks = [b"hung-%d" % i for i in range(16)]

        async def main() -> None:
            async with tier:
                _, on_live = await _stored_by_node(tier, cluster, ks, 2)
                cluster.nodes[2].pause()
                try:
                    kinds = []
                    for _ in range(4):
                        res = await tier.load(ks, list(range(16)))
                        assert set(res.succeeded) == set(on_live), res.failed
                        kinds.append({failure_kind(e) for e in res.failed.values()})
                    # timeouts until the hung node's breaker opens, then refused at once
                    assert kinds == [{"timeout"}, {"timeout"}, {"unavailable"}, {"unavailable"}], kinds
                    assert (await tier.offload(on_live, list(range(len(on_live))))).ok
                finally:
                    cluster.nodes[2].resume()

        anyio.run(main, backend="asyncio")
    finally:
        cluster.stop()
