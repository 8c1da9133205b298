"""The fs tier's loads on the native engine pin their chunks when planned, ahead of the I/O:
at most half the tier's capacity at once (tiers/fs/loads.py, asynctier/engines/room.py). A burst of loads then leaves
stores a victim to evict, and a store called after loads that wait does not evict their
chunks first."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.core import Op
from asynctier.engines import native as nativeio
from asynctier.posix_io import aligned_buffer
from asynctier.tiers.fs import HEADER_BLOCK

native_only = pytest.mark.skipif(nativeio.problem() is not None, reason=f"no native workers: {nativeio.problem()}")

CHUNK = 64 * 1024
SLOTS = 160


def _tier(root: Path, room: int, depth: int = 16):  # type: ignore[no-untyped-def]
    spec = OffloadingSpec(CHUNK, SLOTS, namespace="ahead")
    config = {"type": "fs", "root": str(root), "io_engine": "native", "max_inflight": depth,
              "capacity_bytes": room * (CHUNK + HEADER_BLOCK)}  # fmt: skip
    return SecondaryTierFactory.create_secondary_tier(config, aligned_buffer(spec.total_bytes), spec)


def _nothing_held(tier) -> None:  # type: ignore[no-untyped-def]
    """No load counted as pinning ahead, none parked: a count left over would hold back every
    later load for ever."""
    ahead = tier._split.fast[Op.LOAD]._ahead
    assert ahead.used == 0 and not ahead.waiting


@native_only
@pytest.mark.parametrize(("room", "batch"), [(64, 32), (128, 32), (32, 1)])
async def test_a_burst_of_loads_leaves_stores_room_and_keeps_its_chunks(tmp_path: Path, room: int, batch: int) -> None:
    """A full tier loads every chunk it holds (in group jobs of 32 chunks, or jobs of one)
    while a store of 8 new keys runs: every load and every store succeeds. Before the bound,
    the loads pinned every chunk when planned and each store failed with CapacityError; a
    store that overtook the loads held back would have evicted chunks they were about to read."""
    async with _tier(tmp_path, room) as tier:
        keys = [b"k%d" % i for i in range(room)]
        assert not (await tier.offload(keys, [i % 128 for i in range(room)])).failed
        failed: dict[str, list[BaseException]] = {"load": [], "store": []}

        async def load(ks: list[bytes]) -> None:
            r = await tier.load(ks, list(range(len(ks))))
            failed["load"] += r.failed.values()

        async def store() -> None:
            r = await tier.offload([b"new%d" % i for i in range(8)], list(range(150, 158)))
            failed["store"] += r.failed.values()

        async with anyio.create_task_group() as tg:
            for j in range(0, room, batch):
                tg.start_soon(load, keys[j : j + batch])
            tg.start_soon(store)
        assert failed == {"load": [], "store": []}
        _nothing_held(tier)
        held = tier.stats().extra["loads_held_back"]
        assert 0 < held <= room // 2  # the first half went at once, the rest waited
        assert (await tier.lookup([b"new%d" % i for i in range(8)])) == [True] * 8


@native_only
async def test_loads_held_back_and_cancelled_pin_nothing(tmp_path: Path) -> None:
    """A load call cancelled while some of its jobs wait for room ends; afterwards nothing is
    left pinned: the tier's whole capacity can be stored over (each store evicting)."""
    room = 64
    async with _tier(tmp_path, room) as tier:
        keys = [b"k%d" % i for i in range(room)]
        assert not (await tier.offload(keys, [i % 128 for i in range(room)])).failed
        for _ in range(5):
            with anyio.move_on_after(0.0005):
                await tier.load(keys, list(range(room)))
        assert tier.stats().extra["loads_held_back"] > 0
        _nothing_held(tier)
        fresh = [b"fresh%d" % i for i in range(room)]
        r = await tier.offload(fresh, [i % 128 for i in range(room)])
        assert not r.failed, r.failed
        assert (await tier.lookup(fresh)) == [True] * room


@native_only
async def test_a_tier_without_capacity_holds_no_load_back(tmp_path: Path) -> None:
    spec = OffloadingSpec(CHUNK, SLOTS, namespace="ahead")
    config = {"type": "fs", "root": str(tmp_path), "io_engine": "native", "max_inflight": 16}
    async with SecondaryTierFactory.create_secondary_tier(config, aligned_buffer(spec.total_bytes), spec) as tier:
        keys = [b"k%d" % i for i in range(SLOTS)]
        assert not (await tier.offload(keys, list(range(SLOTS)))).failed
        async with anyio.create_task_group() as tg:
            for j in range(0, SLOTS, 32):
                tg.start_soon(tier.load, keys[j : j + 32], list(range(32)))
        assert tier.stats().extra.get("loads_held_back", 0) == 0


@native_only
async def test_a_load_cancelled_while_held_back_returns_before_the_loads_ahead_end(tmp_path: Path) -> None:
    """A load whose jobs all wait behind another call's loads, which cannot start (their I/O
    token held), and a store waiting behind it, are cancelled: they return at once, not once
    those loads end, nothing is left counted or parked, the store stored nothing; the loads
    ahead then end as usual, every chunk read."""
    import asyncio

    from native_helpers import HeldToken

    room = 64
    async with _tier(tmp_path, room, depth=1) as tier:  # (one I/O token: held, no load starts)
        keys = [b"k%d" % i for i in range(room)]
        assert not (await tier.offload(keys, [i % 128 for i in range(room)])).failed
        engine = tier._split.native
        async with HeldToken(engine.pool) as held:
            first = asyncio.ensure_future(tier.load(keys[:32], list(range(32))))
            second = asyncio.ensure_future(tier.load(keys[32:], list(range(32, 64))))
            ahead = tier._split.fast[Op.LOAD]._ahead
            for _ in range(10_000):
                if tier.stats().extra.get("loads_held_back", 0) >= 32:
                    break
                await asyncio.sleep(0.001)
            assert tier.stats().extra["loads_held_back"] == 32 and not first.done()
            # a store called now waits behind the load held back
            third = asyncio.ensure_future(tier.offload([b"new"], [100]))
            for _ in range(10_000):
                if len(ahead.waiting) == 2:
                    break
                await asyncio.sleep(0.001)
            assert len(ahead.waiting) == 2
            third.cancel()
            second.cancel()
            done, _ = await asyncio.wait({second, third}, timeout=30)
            assert len(done) == 2 and second.cancelled() and third.cancelled() and not first.done()
            held.let_go()
            assert (await first).ok
        _nothing_held(tier)
        assert not any(await tier.lookup([b"new"]))
        assert (await tier.load(keys[32:], list(range(32, 64)))).ok
