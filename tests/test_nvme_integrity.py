"""The nvme tier: corrupt or stale slots are misses, never garbage; races between stores,
removals and loads; a failing journal or index directory fails stores, not the tier."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from nvme_helpers import (
    CHUNK,
    NS,
    chunk_at,
    corrupt_payload,
    crash,
    fill,
    find,
    flip,
    hold_first_flush,
    journal_full_once,
    make,
)

from asynctier import IntegrityError, OffloadingSpec
from asynctier.errors import failure_kind
from asynctier.tiers.nvme import format as nvme_format
from asynctier.tiers.nvme import sysio as nvme_sysio


async def test_corrupt_payload_or_header_is_a_miss_not_garbage(tmp_path: Path) -> None:
    p = tmp_path / "bad.slab"
    tier, view = make(p)
    data = fill(view, CHUNK, 4)
    keys = [b"c%d" % i for i in range(3)]
    async with tier:
        assert (await tier.offload(keys, [0, 1, 2])).ok
    # flip a payload byte of chunk 0 and a header byte (the key) of chunk 1
    pay = find(p, data[0][:64]) + 1000
    hdr_key = find(p, OffloadingSpec(CHUNK, 1, namespace=NS).layout_digest + keys[1]) + 16
    flip(p, [pay, hdr_key])
    tier, view = make(p)
    async with tier:
        # fsck finds both and removes nothing unless asked to
        vres = await tier.verify_chunks(keys)
        assert vres.succeeded == [keys[2]] and set(vres.failed) == {keys[0], keys[1]}
        assert await tier.lookup(keys) == [True, True, True]
        view[:] = bytes(view.nbytes)
        res = await tier.load(keys, [5, 6, 7])
        assert res.succeeded == [keys[2]] and chunk_at(view, CHUNK, 7) == data[2]
        assert {failure_kind(e) for e in res.failed.values()} == {"checksum"}
        assert await tier.lookup(keys) == [False, False, True]
        assert tier.stats().failures["checksum"] == 4


async def test_overwritten_slot_is_never_served_for_an_old_mapping(tmp_path: Path) -> None:
    """A checkpoint pointing at a slot rewritten later (a reused slot) yields a miss."""
    p = tmp_path / "stale.slab"
    tier, view = make(p, slots=4, evict_batch=1)
    fill(view, CHUNK, 5)
    async with tier:
        assert (await tier.offload([b"old"], [0])).ok
    ck_path = p.with_name(p.name + ".atidx.ckpt")
    stale = ck_path.read_bytes()
    tier, view = make(p, slots=4, evict_batch=1)
    async with tier:
        assert (await tier.remove([b"old"])).ok
        assert (await tier.offload([b"new"], [1])).ok  # reuses the freed slot
    # roll the index back to the stale checkpoint and drop the journal: "old" -> reused slot
    ck_path.write_bytes(stale)
    for j in p.parent.glob(p.name + ".atidx.journal.*"):
        j.unlink()
    tier, view = make(p, slots=4, evict_batch=1)
    async with tier:
        assert await tier.lookup([b"old"]) == [True]
        view[:] = bytes(view.nbytes)
        res = await tier.load([b"old"], [2])
        assert not res.ok and failure_kind(res.failed[b"old"]) == "checksum"
        assert await tier.lookup([b"old"]) == [False]


async def test_remove_during_a_store_cancels_it_and_the_key_can_be_stored_again(tmp_path: Path) -> None:
    tier, view = make(tmp_path / "rw.slab")
    data = fill(view, CHUNK, 13)
    async with tier:
        cat = tier._catalog
        assert cat is not None
        # a store in flight, driven by hand: slot taken, not yet published
        slot, seq, _ = cat.allocate(b"k")
        assert (await tier.remove([b"k"])).ok
        assert cat.publish(b"k", slot, seq, 0) == 0  # removed meanwhile: not published
        assert await tier.lookup([b"k"]) == [False]
        assert (await tier.offload([b"k"], [3])).ok  # a later store is a new one
        assert await tier.lookup([b"k"]) == [True]
        view[:] = bytes(view.nbytes)
        assert (await tier.load([b"k"], [0])).ok and chunk_at(view, CHUNK, 0) == data[3]
        assert len(cat.index.free) == tier.nslots - 1


async def test_a_store_begun_after_a_remove_is_not_cancelled_by_it(tmp_path: Path) -> None:
    """remove() cancels the stores of the key in flight when it runs, not those that begin
    after it returned (one was reported stored and never published while an older one ran)."""
    tier, view = make(tmp_path / "rw.slab")
    data = fill(view, CHUNK, 17)
    async with tier:
        cat = tier._catalog
        assert cat is not None
        old_slot, old_seq, _ = cat.allocate(b"k")  # an older store, still writing
        assert (await tier.remove([b"k"])).ok
        assert (await tier.offload([b"k"], [2])).ok  # begun after the remove: a new store
        assert await tier.lookup([b"k"]) == [True]
        assert cat.publish(b"k", old_slot, old_seq, 0) == 0  # the older one: cancelled
        assert await tier.lookup([b"k"]) == [True]
        view[:CHUNK] = bytes(CHUNK)
        assert (await tier.load([b"k"], [0])).ok and chunk_at(view, CHUNK, 0) == data[2]
        assert len(cat.index.free) == tier.nslots - 1


@pytest.mark.parametrize("grouped", [False, True], ids=["one", "group"])
async def test_a_bad_copy_is_dropped_by_its_slot_not_a_copy_stored_since(tmp_path: Path, grouped: bool) -> None:
    """A load that finds a bad copy drops that copy only: if the key was removed and stored
    again while the load ran (even into the same slot), the new copy stays. (The threads
    engine's paths: the native one reads a failed chunk again, from the copy indexed then.)"""
    tier, view = make(tmp_path / "rw.slab", max_inflight=2, io_engine="threads")
    data = fill(view, CHUNK, 19)
    names = [b"a", b"b", b"c", b"d"] if grouped else [b"a"]
    held, go_on = threading.Event(), threading.Event()
    async with tier:
        cat = tier._catalog
        assert cat is not None
        assert (await tier.offload(names, list(range(len(names))))).ok
        bad_slot = cat.index.entries[b"a"]
        corrupt_payload(tier, b"a")
        slabs = tier._slabs
        if grouped:  # hold the group between its reads and the dropping of its bad slots
            end = tier._end_load_group

            def held_end(ks: list[bytes], *args: Any) -> Any:
                if b"a" in ks:
                    held.set()
                    go_on.wait(30)
                return end(ks, *args)

            tier._end_load_group = held_end  # type: ignore[method-assign]
        else:  # hold the one-chunk load's read
            preadv = slabs.preadv

            def held_read(*args: Any) -> Any:
                held.set()
                go_on.wait(30)
                return preadv(*args)

            slabs.preadv = held_read  # type: ignore[method-assign]
        loading = asyncio.ensure_future(tier.load(names, list(range(8, 8 + len(names)))))
        assert await asyncio.to_thread(held.wait, 30)
        assert (await tier.remove([b"a"])).ok
        if not grouped:
            slabs.preadv = preadv  # type: ignore[method-assign]
        assert (await tier.offload([b"a"], [5])).ok  # a good copy, stored again
        assert grouped is False or cat.index.entries[b"a"] == bad_slot
        go_on.set()
        res = await loading
        assert set(res.failed) == {b"a"} and isinstance(res.failed[b"a"], IntegrityError)
        assert await tier.lookup([b"a"]) == [True]
        view[:CHUNK] = bytes(CHUNK)
        assert (await tier.load([b"a"], [0])).ok and chunk_at(view, CHUNK, 0) == data[5]


async def test_a_store_found_stored_is_acknowledged_only_once_journaled(tmp_path: Path) -> None:
    """A second store of a key whose first store is published but whose record is still
    queued waits for that record to reach the journal: else it acknowledged a chunk that a
    crash right after would lose."""
    tier, _ = make(tmp_path / "rw.slab")
    held, go_on = threading.Event(), threading.Event()
    async with tier:
        hold_first_flush(tier, held, go_on)
        first = asyncio.ensure_future(tier.offload([b"k"], [0]))
        assert await asyncio.to_thread(held.wait, 30)  # published, its record not written yet
        assert await tier.lookup([b"k"]) == [True]
        second = asyncio.ensure_future(tier.offload([b"k"], [1]))
        await asyncio.wait([second], timeout=0.3)
        assert not second.done()  # found stored, but not acknowledged before the record is in
        go_on.set()
        assert (await first).ok and (await second).ok
        assert tier.stats().offloaded >= 1


@pytest.mark.parametrize("group", [False, True])
async def test_a_store_found_stored_waits_for_its_own_record_only(tmp_path: Path, group: bool) -> None:
    """A store of a key whose record is in the journal is acknowledged at once, even while
    other stores' records wait for a flush (it used to wait for every record queued, and so
    for a flush, an fdatasync under durability="fsync", that it did not need)."""
    tier, view = make(tmp_path / "own.slab", max_inflight=4)
    fill(view, CHUNK, 43)
    held, go_on = threading.Event(), threading.Event()
    async with tier:
        assert (await tier.offload([b"a", b"a2"], [0, 1])).ok  # journaled
        hold_first_flush(tier, held, go_on)
        other = asyncio.ensure_future(tier.offload([b"b"], [2]))
        assert await asyncio.to_thread(held.wait, 30)  # b's record is queued, its flush held
        try:
            again = asyncio.ensure_future(tier.offload([b"a", b"a2"] if group else [b"a"], [0, 1] if group else [0]))
            done, _ = await asyncio.wait([again], timeout=20)
            assert again in done and again.result().ok
            assert not other.done()
        finally:
            go_on.set()
        assert (await other).ok


async def test_a_failed_journal_write_is_mended_and_the_tier_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One journal write fails (ENOSPC, as on a full index directory): that store is reported
    failed, what may be half-written is cut off and its records are written by the next
    flush, so stores go on once the fault is gone and everything acknowledged is there after
    a reopen (the journal used to refuse every store for the rest of the tier's life). On
    threads, where a store's flush writes with sysio.pwritev_all; the native engine's commit
    job: test_nvme_native_stores.py."""
    tier, view = make(tmp_path / "rw.slab", max_inflight=2, io_engine="threads")
    data = fill(view, CHUNK, 29)
    once_full = journal_full_once(tier)

    async with tier:
        assert (await tier.offload([b"a"], [0])).ok
        monkeypatch.setattr(nvme_sysio, "pwritev_all", once_full)
        res = await tier.offload([b"b"], [1])
        assert failure_kind(res.failed[b"b"]) == "io"
        assert (await tier.offload([b"c", b"d"], [2, 3])).ok  # the fault is gone
        journal = tier._catalog.journal if tier._catalog is not None else None
        assert journal is not None and journal.mended == 1 and journal.broken is None
        assert (await tier.offload([b"b"], [1])).ok  # its record made it after all: found stored
    again, view2 = make(tmp_path / "rw.slab")
    async with again:
        assert await again.lookup([b"a", b"b", b"c", b"d"]) == [True] * 4
        res = await again.load([b"a", b"b", b"c", b"d"], [0, 1, 2, 3])
        assert res.ok and [chunk_at(view2, CHUNK, i) for i in range(4)] == data[:4]


async def test_a_failed_journal_switch_keeps_the_old_generation(tmp_path: Path) -> None:
    """A checkpoint whose new journal generation cannot be created (here a directory holds
    its name: EISDIR) fails, but the journal goes on in the generation it had, and what is
    stored after is there after a crash (it used to refuse every store from then on)."""
    p = tmp_path / "sw.slab"
    tier, view = make(p, checkpoint_every=1 << 20)
    data = fill(view, CHUNK, 31)
    await tier.open()
    assert (await tier.offload([b"a"], [0])).ok
    assert tier._catalog is not None
    journal = tier._catalog.journal
    gen = journal.gen
    squatter = journal.path(gen + 1)
    squatter.mkdir()
    with pytest.raises(IsADirectoryError):
        await asyncio.to_thread(tier.checkpoint)
    assert journal.broken is None and journal.gen == gen
    assert (await tier.offload([b"b", b"c"], [1, 2])).ok
    crash(tier)
    squatter.rmdir()
    tier, view = make(p)
    async with tier:
        res = await tier.load([b"a", b"b", b"c"], [3, 4, 5])
        assert res.ok and [chunk_at(view, CHUNK, i) for i in (3, 4, 5)] == data[:3]
        await asyncio.to_thread(tier.checkpoint)  # nothing in the way: the switch happens
        assert tier._catalog is not None and tier._catalog.journal.gen > gen
        assert (await tier.offload([b"d"], [3])).ok
    tier, view = make(p)
    async with tier:
        assert await tier.lookup([b"a", b"b", b"c", b"d"]) == [True] * 4


async def test_a_failed_write_while_switching_generations_is_mended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last batch of a generation fails to write (ENOSPC) during a checkpoint: the
    checkpoint fails, the batch is cut back and queued again, and the tier goes on."""
    p = tmp_path / "sw.slab"
    tier, view = make(p, checkpoint_every=1 << 20)
    data = fill(view, CHUNK, 37)
    once_full = journal_full_once(tier)

    await tier.open()
    assert tier._catalog is not None
    journal = tier._catalog.journal
    gen = journal.gen
    journal.append(nvme_format.pack_record(nvme_format.EVICT, b"nothing", 0, 0, 0))  # a batch to write
    monkeypatch.setattr(nvme_sysio, "pwritev_all", once_full)
    with pytest.raises(OSError, match="simulated"):
        await asyncio.to_thread(tier.checkpoint)
    assert journal.broken is None and journal.mended == 1 and journal.gen == gen
    assert tier.stats().extra["journal_mended"] == 1
    assert (await tier.offload([b"a", b"b"], [0, 1])).ok
    crash(tier)
    tier, view = make(p)
    async with tier:
        res = await tier.load([b"a", b"b"], [2, 3])
        assert res.ok and [chunk_at(view, CHUNK, i) for i in (2, 3)] == data[:2]


async def test_the_checkpointer_retries_a_failed_checkpoint_later(tmp_path: Path) -> None:
    """A checkpoint that keeps failing is retried after a pause, not on every store, and
    succeeds once its cause is gone."""
    p = tmp_path / "rt.slab"
    tier, view = make(p, checkpoint_every=2)
    fill(view, CHUNK, 41)
    async with tier:
        cat = tier._catalog
        assert cat is not None
        squatter = cat.journal.path(cat.journal.gen + 1)
        squatter.mkdir()
        for i in range(0, 8, 2):
            assert (await tier.offload([b"r%d" % i, b"r%d" % (i + 1)], [i, i + 1])).ok
        for _ in range(1000):
            if cat.ckpt_retrying:
                break
            await asyncio.sleep(0.01)
        extra = tier.stats().extra
        assert cat.ckpt_retrying and extra.get("checkpoints", 0) == 0 and extra["checkpoint_failures"] >= 1
        squatter.rmdir()
        for _ in range(3000):  # the first retry comes after the shortest pause
            if tier.stats().extra.get("checkpoints"):
                break
            await asyncio.sleep(0.01)
        assert tier.stats().extra.get("checkpoints", 0) >= 1 and not cat.ckpt_retrying
        assert (await tier.offload([b"r8"], [8])).ok
    tier, view = make(p)
    async with tier:
        assert await tier.lookup([b"r%d" % i for i in range(9)]) == [True] * 9
