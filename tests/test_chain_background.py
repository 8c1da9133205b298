"""The chain's background lanes on real tiers (memory, fs): a hit refreshes the tiers below it,
a key queued twice in one lane batch is written once, from its latest copy, and a load finds a
chunk whose write-back is still queued."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from chain_helpers import ChainRig, in_tier, keys

from asynctier import TierConfigError
from asynctier.errors import failure_kind
from asynctier.tiers.chain.background import Backlog, RemovalFence
from asynctier.tiers.chain.staging import StagingPool
from asynctier.tiers.fs.layout import HEADER_BLOCK
from asynctier.tiers.memory import MemoryTier

MEM: dict[str, Any] = {"type": "memory"}


def run(fn: Any, *args: Any) -> None:
    anyio.run(fn, *args, backend="asyncio")


def fs(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"type": "fs", "root": str(tmp_path / "kv"), "io_engine": "threads", **extra}


@pytest.mark.parametrize("refresh", [True, False])
def test_a_hit_above_refreshes_the_tiers_below(tmp_path: Path, refresh: bool) -> None:
    """fs holds four chunks; the oldest is used (served by memory), then a fifth is stored: with
    ``refresh_below`` fs evicts the least recently *used* chunk, without it the oldest stored."""

    async def check() -> None:
        rig = ChainRig()
        c = rig.spec.chunk_bytes
        chain = rig.chain(tiers=[MEM, fs(tmp_path, capacity_bytes=4 * (HEADER_BLOCK + c))], refresh_below=refresh)
        async with chain:
            ks = keys(5)
            for i, k in enumerate(ks[:4]):  # one at a time: fs's LRU order is ks[0] oldest
                assert (await chain.offload([k], [i])).ok
                await chain.drain()
            assert await in_tier(chain, "fs", ks[:4]) == [True] * 4
            assert (await chain.load([ks[0]], [8])).ok  # served by memory
            await chain.drain()
            assert (await chain.offload([ks[4]], [4])).ok
            await chain.drain()
            fs_stats = chain.stats().children["fs"]
            assert fs_stats.evictions == 1
            assert fs_stats.extra["chain_hits"] == 0 and chain.stats().children["memory"].extra["chain_hits"] == 1
            assert fs_stats.extra["chain_touched"] == (1 if refresh else 0)
            assert fs_stats.extra["chain_touch_drops"] == 0
            held = await in_tier(chain, "fs", ks)
            assert held == ([True, False, True, True, True] if refresh else [False, True, True, True, True])

    run(check)


def test_refresh_below_must_be_bool() -> None:
    with pytest.raises(TierConfigError, match=r"refresh_below must be True or False"):
        ChainRig().chain(tiers=[MEM], refresh_below=1)


def test_a_key_queued_twice_in_one_lane_batch_is_written_once_from_its_latest_copy(tmp_path: Path) -> None:
    """Both copies are queued before the fs lane runs, so they land in one batch: fs must get the
    key once (a call naming a key twice is refused whole, which dropped the batch and counted
    against fs's breaker), from the slot queued last."""

    async def check() -> None:
        rig = ChainRig()
        no_stores = {**fs(tmp_path), "admit": lambda key, reason: reason != "store"}  # the chain's own lane idles
        chain = rig.chain(tiers=[MEM, no_stores], promote=False, refresh_below=False)
        async with chain:
            memory, fs_member = chain.member("memory"), chain.member("fs")
            k, probe = keys(2)
            assert (await chain.offload([k], [3])).ok  # only memory holds it
            # a backlog of our own over the chain's tiers and the same staging slots
            pool = StagingPool(chain.max_inflight, chain.config.backlog_chunks)
            backlog = Backlog(pool, RemovalFence(), chain.members, batch=32, chunk=rig.spec.chunk_bytes)
            backlog.start()
            stale, latest, check_slot = (pool.take_background() for _ in range(3))
            assert stale is not None and latest is not None and check_slot is not None
            assert (await memory.tier.load([k], [latest])).ok  # the latest copy: the real chunk
            backlog.submit([(k, stale, [fs_member]), (k, latest, [fs_member])], epoch=0, reason="store")
            await backlog.drain()
            await backlog.stop()
            assert fs_member.counts["written_back"] == 1 and fs_member.counts["drops"] == 0
            assert fs_member.counts["failed"] == 0 and fs_member.breaker.state == "closed"
            # what fs holds is the latest copy: read it back through memory into the caller's buffer
            assert (await fs_member.tier.load([k], [check_slot])).ok
            assert (await memory.tier.offload([probe], [check_slot])).ok
            rig.zero()
            assert (await chain.load([probe], [0])).ok
            assert rig.chunk(0) == rig.orig_chunk(3)
            pool.release_background([check_slot])

    run(check)


class GatedMemoryTier(MemoryTier):
    """A memory tier whose stores wait for ``GATE`` (a write-back held while loads run)."""

    GATE = threading.Event()

    def write_chunk(self, key: bytes, data: memoryview) -> None:
        assert self.GATE.wait(30)
        super().write_chunk(key, data)


GATED_BELOW = {"type": "GatedMemoryTier", "module_path": __name__, "name": "below"}


@contextlib.contextmanager
def gate_closed() -> Iterator[None]:
    """The gated tier's stores wait until the block ends (or 30 s)."""
    GatedMemoryTier.GATE.clear()
    try:
        yield
    finally:
        GatedMemoryTier.GATE.set()


def test_a_load_is_served_from_a_write_back_still_queued() -> None:
    """The first tier evicts chunks before their write-back reaches the tier below: a load
    finds them in the background's staging slots (they were acknowledged as stored), being
    written or still queued, the latest copy of each; not one removed since it was queued."""

    async def check() -> None:
        rig = ChainRig()
        chain = rig.chain(tiers=[MEM, GATED_BELOW], write="back")
        with gate_closed():
            async with chain:
                ks = keys(4)
                assert (await chain.offload(ks[:2], [0, 1])).ok
                await anyio.wait_all_tasks_blocked()
                assert chain.stats().extra["background_in_flight"] == 2  # being written, held at the gate
                assert (await chain.offload(ks[2:], [2, 3])).ok  # queued behind them
                assert (await chain.member("memory").tier.remove([ks[3]])).ok  # evicted above, then
                assert (await chain.offload([ks[3]], [5])).ok  # a newer copy of ks[3]: chunk 5's bytes
                assert (await chain.remove([ks[2]])).ok  # queued, not running: the removal does not wait
                assert (await chain.member("memory").tier.remove(ks)).ok  # evicted above
                assert await chain.lookup(ks) == [True, True, False, True]
                assert await chain.lookup_prefix(ks) == 2
                rig.zero()
                res = await chain.load(ks, [8, 9, 10, 11])
                assert res.succeeded == [ks[0], ks[1], ks[3]], res.failed
                assert failure_kind(res.failed[ks[2]]) == "not_found"
                got = [rig.chunk(8), rig.chunk(9), rig.chunk(11)]
                assert got == [rig.orig_chunk(0), rig.orig_chunk(1), rig.orig_chunk(5)]
                assert chain.stats().extra["backlog_hits"] == 3
                GatedMemoryTier.GATE.set()
                await chain.drain()
                assert chain.stats().extra["backlog"] == 0  # every slot went back, the loads' too
                rig.zero()
                res = await chain.load(ks[:2] + ks[3:], [8, 9, 11])  # from the tier below now
                assert res.ok and chain.stats().extra["backlog_hits"] == 3
                assert [rig.chunk(8), rig.chunk(11)] == [rig.orig_chunk(0), rig.orig_chunk(5)]

    run(check)


def test_a_store_the_first_tier_skipped_queues_no_other_copy() -> None:
    """A key stored twice while its first write-back was queued: the first tier kept the first
    copy and reported the second store skipped, but the second copy was queued too, and being
    the newest, it was the one written below (and served from the queue)."""

    async def check() -> None:
        rig = ChainRig()
        chain = rig.chain(tiers=[MEM, GATED_BELOW], write="back")
        with gate_closed():
            async with chain:
                k, blocker = b"twice", b"blocker"
                assert (await chain.offload([blocker], [7])).ok
                await anyio.wait_all_tasks_blocked()  # the lane busy at the gate
                assert (await chain.offload([k], [0])).ok
                res = await chain.offload([k], [1])
                assert res.skipped == [k]
                assert (await chain.member("memory").tier.remove([k])).ok  # evicted above
                rig.zero()
                assert (await chain.load([k], [8])).ok  # from the queue
                assert rig.chunk(8) == rig.orig_chunk(0)
                GatedMemoryTier.GATE.set()
                await chain.drain()
                rig.zero()
                assert (await chain.load([k], [9])).ok  # from the tier below
                assert rig.chunk(9) == rig.orig_chunk(0)

    run(check)


def test_a_queued_promotion_does_not_stand_in_for_a_write_back() -> None:
    """The skip rule asked whether anything of the key was queued: a promotion going up (to a
    tier above the one that stored it) stood in for the write-back to the tiers below, which
    then never got the key."""

    async def check() -> None:
        rig = ChainRig()
        below_ok = [False]
        top = {"type": "GatedMemoryTier", "module_path": __name__, "name": "top", "admit": lambda k, r: r == "promote"}
        low = {"type": "memory", "name": "low", "admit": lambda k, r: below_ok[0]}
        chain = rig.chain(tiers=[top, {"type": "memory", "name": "mid"}, low], write="back")
        with gate_closed():
            async with chain:
                k = [b"up-and-down"]
                assert (await chain.offload(k, [0])).ok  # mid only: low refuses now
                below_ok[0] = True
                assert (await chain.load(k, [5])).ok  # a hit in mid: its promotion to top held at the gate
                res = await chain.offload(k, [0])  # mid holds it: skipped, and written back to low
                assert res.skipped == k
                GatedMemoryTier.GATE.set()
                await chain.drain()
                assert await in_tier(chain, "low", k) == [True]

    run(check)


def test_the_fence_forgets_no_stamp_a_window_still_open_needs() -> None:
    """A removal's stamp makes its keys stale to every window opened before it ended: while
    such a window is open the stamp is kept past the bound (65,536), and dropped once it closes;
    a key being removed is stale to any window, and no key never removed ever is."""
    fence = RemovalFence()
    early = fence.open()
    removed = [b"k%d" % i for i in range(65537 + 100)]
    for i in range(0, len(removed), 1000):
        fence.removing(removed[i : i + 1000])
        fence.removed(removed[i : i + 1000])
    assert all(fence.stale(k, early) for k in removed)  # none forgotten: the window needs them all
    later = fence.open()
    assert not any(fence.stale(k, later) for k in removed[:10])  # (removed before it opened)
    fence.close(early)
    assert len(fence._removed_at) <= 65536  # now they may go
    assert not fence.stale(b"never-removed", early - 1)
    fence.removing([b"now"])
    assert fence.stale(b"now", later) and fence.stale(b"now", fence.open())  # while it runs: to every window
    fence.removed([b"now"])
    assert fence.stale(b"now", later) and not fence.stale(b"now", fence.open())
