"""A full nvme slab evicts a few batches ahead of its stores on the native engine: the EVICT
records ride the commit that its parked stores start anyway (Catalog.evict_ahead_locked)."""

from __future__ import annotations

from pathlib import Path

import pytest
from nvme_helpers import chunk_at, crash, fill, make

from asynctier.engines import native as nativeio
from asynctier.tiers.nvme.catalog import EVICT_AHEAD

pytestmark = pytest.mark.skipif(nativeio.problem() is not None, reason=f"no native workers: {nativeio.problem()}")

CHUNK = 4096


async def _store(tier: object, keys: list[bytes], per_call: int) -> None:
    for i in range(0, len(keys), per_call):
        res = await tier.offload(keys[i : i + per_call], list(range(per_call)))  # type: ignore[attr-defined]
        assert res.ok, res.failed


async def test_a_full_slab_keeps_batches_free_ahead_in_lru_order(tmp_path: Path) -> None:
    slots, batch = 256, 4
    tier, view = make(tmp_path / "a.slab", chunk=CHUNK, nchunks=16, slots=slots, evict_batch=batch)
    fill(view, CHUNK, 1)
    async with tier:
        assert tier.active_io_engine == "native"
        idx = tier._catalog.index  # type: ignore[union-attr]
        keys = [b"k%04d" % i for i in range(slots + 16)]
        # filling up to capacity evicts nothing, ahead or not. Calls of 8: one job each here
        # (half the slab over max_inflight), so the keys are published, and grow old, in
        # order; a call of 16 runs as two jobs, published in whichever order they end
        await _store(tier, keys[:slots], 8)
        assert tier.stats().evictions == 0 and tier.stats().stored_chunks == slots
        assert not idx.free
        # the next store lacks room: it evicts its batch, and the commit that publishes it
        # leaves EVICT_AHEAD batches free (within 1/32 of the slots: 8 here)
        await _store(tier, keys[slots:], 16)
        ahead = min(EVICT_AHEAD * batch, slots // 32)
        s = tier.stats()
        assert len(idx.free) == ahead
        assert s.evictions == 16 + ahead and s.stored_chunks == slots - ahead
        # the least recently used went, in order
        gone = s.evictions
        assert await tier.lookup(keys) == [False] * gone + [True] * (len(keys) - gone)
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys[-16:], list(range(16)))).ok


async def test_a_small_slab_evicts_only_what_its_stores_lack(tmp_path: Path) -> None:
    """Under 32 slots no slot is kept free ahead: each store evicts what it needs."""
    tier, view = make(tmp_path / "s.slab", chunk=CHUNK, nchunks=16, slots=16, evict_batch=1)
    fill(view, CHUNK, 2)
    async with tier:
        keys = [b"s%02d" % i for i in range(20)]
        await _store(tier, keys[:16], 4)
        for k in keys[16:]:
            await _store(tier, [k], 1)
        s = tier.stats()
        assert s.evictions == 4 and s.stored_chunks == 16
        assert await tier.lookup(keys) == [False] * 4 + [True] * 16


async def test_what_a_crash_leaves_is_what_the_slab_held_after_evicting_ahead(tmp_path: Path) -> None:
    """After stores that evicted ahead, a process killed without its closing checkpoint finds,
    at the next open, the keys the live tier held (not the ones it had evicted ahead: their
    EVICT records are in the journal), each loading its own bytes."""
    slots, batch = 256, 4
    path = tmp_path / "c.slab"
    tier, view = make(path, chunk=CHUNK, nchunks=16, slots=slots, evict_batch=batch)
    data = fill(view, CHUNK, 3)
    keys = [b"c%04d" % i for i in range(slots + 64)]
    await tier.open()
    await _store(tier, keys, 16)
    held = await tier.lookup(keys)
    assert tier.stats().evictions > 64 and len(tier._catalog.index.free) > 0  # type: ignore[union-attr]
    crash(tier)
    tier, view = make(path, chunk=CHUNK, nchunks=16, slots=slots, evict_batch=batch)
    async with tier:
        assert await tier.lookup(keys) == held
        kept = [i for i, h in enumerate(held) if h]  # key i was stored from chunk i % 16
        for at in range(0, len(kept), 16):
            part = kept[at : at + 16]
            view[:] = bytes(view.nbytes)
            assert (await tier.load([keys[i] for i in part], list(range(len(part))))).ok
            assert [chunk_at(view, CHUNK, j) for j in range(len(part))] == [data[i % 16] for i in part]
