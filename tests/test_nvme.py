"""The nvme tier: conformance, slot I/O paths, eviction, coalescing, configuration and io_engine.

Integrity and journal faults: test_nvme_integrity.py; recovery and crashes:
test_nvme_recovery.py; the on-disk format built from raw bytes: test_nvme_format.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import random
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from disk_helpers import OnDisk
from nvme_helpers import CHUNK, chunk_at, damage_slot, fill, make, swap_slots

from asynctier import OffloadingSpec, SecondaryTierFactory, TierConfigError, TierStateError
from asynctier.engines import native as nativeio
from asynctier.errors import failure_kind
from asynctier.testing import Harness, TierConformance
from asynctier.tiers.nvme import NvmeTier


class TestNvmeTier(TierConformance):
    """The suite's bytearray primary buffer is not page-aligned: this runs the bounce path."""

    async def corrupt_stored(self, h: Harness, key: bytes, how: str) -> None:
        assert isinstance(h.tier, NvmeTier)
        damage_slot(h.tier, key, how)

    async def swap_stored(self, h: Harness, key_a: bytes, key_b: bytes) -> None:
        assert isinstance(h.tier, NvmeTier)
        swap_slots(h.tier, key_a, key_b)

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        # sparse: ~70 suite checks x 145 MB of fallocate would be 10 GB of disk per run;
        # preallocation has its own tests below
        return {
            "type": "nvme",
            "path": str(tmp_path / "kv.slab"),
            "capacity_bytes": 2048 * 72 * 1024,
            "preallocate": False,
        }


class TestNvmeTierAligned(OnDisk, TestNvmeTier):
    """The same checks with a page-aligned primary buffer (pinned memory is), on a disk's file
    system (O_DIRECT there, not on the suite's tmpfs): the zero-copy path,
    where loads run on the native workers (io_engine "auto"), planned and booked on the loop
    thread: asyncio and trio."""

    page_aligned_buffer = True
    backends = ("asyncio", "trio")


class TestNvmeTierAlignedThreads(TestNvmeTierAligned):
    """The zero-copy path on the threads engine (group jobs of adjacent slots)."""

    backends = ("asyncio",)

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {**super().tier_config(tmp_path), "io_engine": "threads"}


# -- slot format and I/O paths -------------------------------------------------------------------------
async def test_healthy_loads_take_the_fast_header_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot whose header is the one the index expects is accepted by one compare; the
    header is parsed field by field only when it differs (for the precise error)."""
    from asynctier.integrity import ChunkHeader

    parsed: list[int] = []
    unpack = ChunkHeader.unpack.__func__  # type: ignore[attr-defined]

    def counted(cls: type[ChunkHeader], *args: Any, **kw: Any) -> ChunkHeader:
        parsed.append(1)
        result: ChunkHeader = unpack(cls, *args, **kw)
        return result

    tier, view = make(tmp_path / "f.slab")
    async with tier:
        data = fill(view, CHUNK, 3)
        keys = [b"k%d" % i for i in range(8)]
        assert (await tier.offload(keys, list(range(8)))).ok
        monkeypatch.setattr(ChunkHeader, "unpack", classmethod(counted))
        assert (await tier.load(keys, list(range(8, 16)))).ok
        assert (await tier.load([keys[0]], [0])).ok  # one chunk: the per-chunk path
        assert [chunk_at(view, CHUNK, 8 + i) for i in range(8)] == data[:8]
        assert parsed == []


async def test_aligned_view_goes_direct_and_unaligned_bounces(tmp_path: Path) -> None:
    for aligned in (True, False):
        tier, view = make(tmp_path / f"a{aligned}.slab", aligned_view=aligned)
        async with tier:
            data = fill(view, CHUNK, 1)
            keys = [b"k%d" % i for i in range(16)]
            assert (await tier.offload(keys, list(range(16)))).ok
            view[:] = bytes(view.nbytes)
            assert (await tier.load(keys, list(range(15, -1, -1)))).ok
            for i in range(16):
                assert chunk_at(view, CHUNK, 15 - i) == data[i]
            bounces = tier.stats().extra.get("bounce_copies", 0)
            assert (bounces == 0) if aligned else (bounces == 32)
            assert tier.stats().extra.get("direct_io_fallbacks", 0) == 0


@pytest.mark.parametrize("aligned", [True, False], ids=["direct", "bounced"])
async def test_one_chunk_calls_take_the_per_chunk_path(tmp_path: Path, aligned: bool) -> None:
    """Calls of one chunk each (no group jobs) store and load byte-exact on both paths."""
    tier, view = make(tmp_path / "one.slab", aligned_view=aligned)
    async with tier:
        data = fill(view, CHUNK, 2)
        for i in range(4):
            assert (await tier.offload([b"one%d" % i], [i])).ok
        view[:] = bytes(view.nbytes)
        for i in range(4):
            assert (await tier.load([b"one%d" % i], [7 - i])).ok
        assert [chunk_at(view, CHUNK, 7 - i) for i in range(4)] == data[:4]
        assert tier.stats().extra.get("bounce_copies", 0) == (0 if aligned else 8)


async def test_chunk_size_not_a_block_multiple(tmp_path: Path) -> None:
    tier, view = make(tmp_path / "odd.slab", chunk=10_000, nchunks=8)
    async with tier:
        data = fill(view, 10_000, 2)
        keys = [b"odd%d" % i for i in range(8)]
        assert (await tier.offload(keys, list(range(8)))).ok
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys, list(range(8)))).ok
        assert [chunk_at(view, 10_000, i) for i in range(8)] == data
        assert tier.stats().extra["bounce_copies"] == 16


async def test_slab_is_preallocated_and_slots_fixed(tmp_path: Path) -> None:
    p = tmp_path / "pre.slab"
    tier, _ = make(p, slots=32)
    async with tier:
        assert tier.nslots == 32
        assert tier.stored_size() == 4096 + CHUNK
        assert os.stat(p).st_blocks * 512 >= os.stat(p).st_size  # fallocated, not sparse
        assert tier.stats().used_bytes == 0


@pytest.mark.parametrize("aligned", [True, False], ids=["direct", "buffered"])
@pytest.mark.usefixtures("atime_updates")
async def test_loads_leave_the_slabs_access_time_alone(tmp_path: Path, aligned: bool) -> None:
    """The slab is opened with O_NOATIME: a load after a store does not dirty its inode."""
    p = tmp_path / "a.slab"
    tier, view = make(p, aligned_view=aligned)
    data = fill(view, CHUNK, 5)
    async with tier:
        assert (await tier.offload([b"a", b"b"], [0, 1])).ok
        m = os.stat(p).st_mtime_ns
        os.utime(p, ns=(m, m))  # atime = mtime: relatime would update it on the next read
        res = await tier.load([b"a", b"b"], [2, 3])
        assert res.ok, res.failed
        assert [chunk_at(view, CHUNK, 2), chunk_at(view, CHUNK, 3)] == data[:2]
        assert os.stat(p).st_atime_ns == m


async def test_io_errors_fail_their_chunks_and_the_tier_goes_on(tmp_path: Path) -> None:
    """A failed write (EBADF: the slab swapped for a read-only descriptor) fails the chunks of
    that I/O with the system's error; their slots are freed; the tier then works again."""
    p = tmp_path / "kv.slab"
    tier, view = make(p, nchunks=32, slots=64, max_inflight=2)
    data = fill(view, CHUNK, 8)
    keys = [b"e%d" % i for i in range(32)]
    async with tier:
        fds = tier._slabs.fds
        good = fds[0]
        ro = os.open(p, os.O_RDONLY)
        fds[0] = ro
        try:
            res = await tier.offload(keys, list(range(32)))
        finally:
            fds[0] = good
            os.close(ro)
        assert set(res.failed) == set(keys)
        assert {getattr(e, "errno", None) for e in res.failed.values()} == {errno.EBADF}
        assert tier.stats().failures["io"] == 32 and await tier.lookup(keys) == [False] * 32
        assert tier._catalog is not None and len(tier._catalog.index.free) == tier.nslots
        assert (await tier.offload(keys, list(range(32)))).ok
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys, list(range(32)))).ok
        assert [chunk_at(view, CHUNK, i) for i in range(32)] == data


@pytest.mark.parametrize("chunk", [CHUNK, 2 * 1024 * 1024])
async def test_calls_cancelled_anywhere_leave_slots_and_buffers_whole(tmp_path: Path, chunk: int) -> None:
    """Cancel offloads and loads at points spread from before their first step to past their
    end: 64 KiB chunks go in coalesced groups, 2 MiB chunks one per job. A cancelled call
    returns only once the threads are done with the caller's buffer; no slot stays allocated
    or pinned; what was stored loads whole, and a load after a cancelled one fills the buffer
    exactly."""
    n, depth = (128, 2) if chunk == CHUNK else (8, 4)
    tier, view = make(tmp_path / "kv.slab", chunk=chunk, nchunks=n, slots=4 * n, max_inflight=depth)
    data = fill(view, chunk, 3)
    cids = list(range(n))

    async def cancel_after(coro: Any, delay: float) -> None:
        task = asyncio.ensure_future(coro)
        await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async with tier:
        idx = tier._catalog.index if tier._catalog is not None else None
        assert idx is not None
        whole = [b"whole-%d" % i for i in cids]
        t0 = time.perf_counter()
        assert (await tier.offload(whole, cids)).ok
        t_store = time.perf_counter() - t0
        for step in range(12):
            keys = [b"c%d-%d" % (step, i) for i in cids]
            await cancel_after(tier.offload(keys, cids), t_store * step / 10)
            assert not idx.writing and not idx.pins
            assert len(idx.free) + len(idx.entries) == tier.nslots
            held = [i for i, ok in enumerate(await tier.lookup(keys)) if ok]
            view[:] = bytes(view.nbytes)
            assert (await tier.load([keys[i] for i in held], held)).ok
            assert all(chunk_at(view, chunk, i) == data[i] for i in held)
            await tier.remove(keys)  # room for the next step without evicting `whole`
            fill(view, chunk, 3)
        view[:] = bytes(view.nbytes)
        t0 = time.perf_counter()
        assert (await tier.load(whole, cids)).ok
        t_load = time.perf_counter() - t0
        for step in range(12):
            view[:] = bytes(view.nbytes)
            await cancel_after(tier.load(whole, cids), t_load * step / 10)
            assert not idx.pins
            assert (await tier.load(whole, cids)).ok
            assert [chunk_at(view, chunk, i) for i in cids] == data


# -- eviction -------------------------------------------------------------------------------------------
async def test_lru_eviction_when_full(tmp_path: Path) -> None:
    tier, view = make(tmp_path / "lru.slab", slots=8, evict_batch=1)
    async with tier:
        data = fill(view, CHUNK, 3)
        keys = [b"e%d" % i for i in range(12)]
        for i in range(8):  # one by one: the LRU order is the order of completion
            assert (await tier.offload([keys[i]], [i])).ok
        await tier.touch([keys[0]])
        assert (await tier.load([keys[1]], [15])).ok  # a load also makes a key recent
        assert (await tier.offload(keys[8:10], [8, 9])).ok
        assert await tier.lookup(keys[:10]) == [True, True, False, False, True, True, True, True, True, True]
        s = tier.stats()
        assert s.evictions == 2 and s.stored_chunks == 8
        view[:] = bytes(view.nbytes)
        res = await tier.load([keys[0], keys[1], keys[8], keys[9]], [0, 1, 2, 3])
        assert res.ok, res.failed
        assert [chunk_at(view, CHUNK, i) for i in range(4)] == [data[0], data[1], data[8], data[9]]


async def test_an_eviction_batch_never_empties_a_small_slab(tmp_path: Path) -> None:
    """evict_batch (default 16) on a slab of 12 slots evicted every chunk, those this very
    call had just reported stored among them (found by a crash harness's after-reopen
    check). A batch is at most an eighth of the slots."""
    tier, view = make(tmp_path / "small.slab", slots=12, evict_batch=16)
    async with tier:
        fill(view, CHUNK, 5)
        keys = [b"s%d" % i for i in range(14)]
        for i in range(12):
            assert (await tier.offload([keys[i]], [i % 16])).ok
        res = await tier.offload(keys[12:14], [12, 13])
        assert res.ok
        assert tier.stats().stored_chunks == 12 and tier.stats().evictions == 2
        assert await tier.lookup(keys) == [False, False] + [True] * 12


async def _fill_slab(tier: NvmeTier, view: memoryview) -> list[bytes]:
    """Fill a 64-slot slab in calls of 8 (least recently used first); the keys."""
    fill(view, CHUNK, 6)
    keys = [b"o%d" % i for i in range(64)]
    for i in range(0, 64, 8):
        assert (await tier.offload(keys[i : i + 8], list(range(8)))).ok
    return keys


async def test_a_batch_into_a_full_slab_evicts_what_it_lacks_at_once(tmp_path: Path) -> None:
    """A store's keys are allocated together: into a full slab, the least recently used slots
    it lacks are evicted in one batch (their EVICT records queued together, the batch's wait
    being the last of them), not a quota at a time."""
    tier, view = make(tmp_path / "b.slab", slots=64, evict_batch=4)
    async with tier:
        old = await _fill_slab(tier, view)
        await tier.touch(old[:2])  # the LRU ones are now old[2:8]
        cat = tier._catalog
        assert cat is not None
        new = [b"n%d" % i for i in range(6)]
        with cat.index.lock:
            before = cat.journal.appended
            slots, failed, wait, skipped, _ = cat.allocate_many_locked(new)
        assert not failed and not skipped and len(slots) == 6
        assert tier.stats().evictions == 6  # what it lacked: more than a quota of 4, no more
        assert wait == cat.journal.appended == before + 6
        assert await tier.lookup(old[:8]) == [True, True] + [False] * 6
        for p, (slot, _) in slots.items():  # give them back unwritten
            cat.abort(new[p], slot)


async def test_a_batch_takes_the_free_slots_first_then_evicts_what_it_lacks(tmp_path: Path) -> None:
    """As one-by-one allocation would: the slots free already (their EVICT records likely in)
    are taken, and only what the batch still lacks is evicted (a quota at least)."""
    tier, view = make(tmp_path / "f.slab", slots=64, evict_batch=4)
    async with tier:
        old = await _fill_slab(tier, view)
        cat = tier._catalog
        assert cat is not None
        assert (await tier.remove(old[60:62])).ok
        freed = set(cat.index.free)
        assert len(freed) == 2 and tier.stats().evictions == 0
        new = [b"n%d" % i for i in range(6)]
        with cat.index.lock:
            slots, failed, _, _, _ = cat.allocate_many_locked(new)
        assert not failed and freed <= {slot for slot, _ in slots.values()}
        assert tier.stats().evictions == 4  # the 4 it lacked (a quota of 4)
        for p, (slot, _) in slots.items():
            cat.abort(new[p], slot)


async def test_two_stores_of_one_key_in_flight_keep_the_copy_published_last(tmp_path: Path) -> None:
    """Two writes of a key allocate two slots; publishing the second maps the key to it and
    frees the first's slot behind the second's record (the bulk publish's general case)."""
    tier, _ = make(tmp_path / "k.slab", slots=16)
    async with tier:
        cat = tier._catalog
        assert cat is not None
        idx = cat.index
        with idx.lock:
            first, _, _, _, _ = cat.allocate_many_locked([b"k"])
            second, _, _, _, _ = cat.allocate_many_locked([b"k"])  # not stored yet: a slot of its own
            (s1, _), (s2, _) = first[0], second[0]
            assert s1 != s2 and idx.writing[b"k"] == 2
            t1 = cat.publish_many_locked([b"k"], [0], first, {0: 1})
            assert idx.entries[b"k"] == s1 and s1 not in idx.free
            t2 = cat.publish_many_locked([b"k"], [0], second, {0: 2})
        assert t2 == t1 + 1 and idx.entries[b"k"] == s2 and idx.slot_csum[s2] == 2
        assert s1 in idx.free and idx.reuse_ticket[s1] == t2 and not idx.slot_key[s1]
        assert b"k" not in idx.writing and idx.slot_key[s2] == b"k" and idx.tail == s2


# -- coalescing ---------------------------------------------------------------------------------------
async def test_many_small_chunks_coalesce_into_fewer_ios(tmp_path: Path) -> None:
    """A 64-chunk call runs as groups (one job, one pwritev/preadv per run of adjacent slots)."""
    for aligned in (True, False):
        tier, view = make(tmp_path / f"co{aligned}.slab", nchunks=64, slots=128, aligned_view=aligned, max_inflight=4)
        async with tier:
            data = fill(view, CHUNK, 14)
            keys = [b"co%d" % i for i in range(64)]
            res = await tier.offload(keys, list(range(64)))
            assert res.ok and res.succeeded == keys and res.bytes_transferred == 64 * CHUNK
            s = tier.stats()
            assert s.offloaded == 64 and s.offload_latency.count == 64 and s.peak_in_flight <= 4
            view[:] = bytes(view.nbytes)
            perm = list(range(64))
            random.Random(3).shuffle(perm)
            res = await tier.load([*keys[:63], b"absent"], perm)
            assert res.succeeded == keys[:63] and set(res.failed) == {b"absent"}
            assert failure_kind(res.failed[b"absent"]) == "not_found"
            for i, slot in enumerate(perm[:63]):
                assert chunk_at(view, CHUNK, slot) == data[i]
            assert tier.stats().extra.get("bounce_copies", 0) == (0 if aligned else 127)
            assert tier.stats().loaded == 63


async def test_grouped_calls_skip_stored_keys_and_fail_bad_slots_one_by_one(tmp_path: Path) -> None:
    """The group paths book per chunk what the one-chunk paths do: skips, integrity failures
    (a corrupted payload, a corrupted header), bit-exact loads of the rest, stats."""
    from nvme_helpers import NS, find, flip

    for aligned in (True, False):
        p = tmp_path / f"grp{aligned}.slab"
        tier, view = make(p, nchunks=64, slots=128, aligned_view=aligned, max_inflight=2)
        data = fill(view, CHUNK, 21)
        keys = [b"g%02d" % i for i in range(48)]
        async with tier:
            assert (await tier.offload(keys[:32], list(range(32)))).ok
            res = await tier.offload(keys[16:48], list(range(16, 48)))  # 16 stored already
            assert res.ok and res.succeeded == keys[16:48]
            s = tier.stats()
            assert (s.offloaded, s.skipped, s.offload_latency.count) == (48, 16, 64)
        digest = OffloadingSpec(CHUNK, 1, namespace=NS).layout_digest
        flip(p, [find(p, data[3][:64]) + 777, find(p, digest + keys[5]) + 16 + 1])
        tier, view = make(p, nchunks=64, slots=128, aligned_view=aligned, max_inflight=2)
        async with tier:
            view[:] = bytes(view.nbytes)
            perm = list(range(63, 15, -1))  # other slots than offloaded from
            res = await tier.load(keys, perm)
            assert set(res.failed) == {keys[3], keys[5]}
            assert {failure_kind(e) for e in res.failed.values()} == {"checksum"}
            for i, cid in enumerate(perm):
                if i not in (3, 5):
                    assert chunk_at(view, CHUNK, cid) == data[i], i
            assert await tier.lookup([keys[3], keys[5], keys[4]]) == [False, False, True]
            s = tier.stats()
            assert (s.loaded, s.failures["checksum"], s.load_latency.count) == (46, 2, 46)
            assert s.extra.get("bounce_copies", 0) == (0 if aligned else 46)


# -- configuration ------------------------------------------------------------------------------------
def _create(tmp_path: Path, **cfg: Any) -> Any:
    spec = OffloadingSpec(CHUNK, 4)
    view = memoryview(bytearray(spec.total_bytes))
    return SecondaryTierFactory.create_secondary_tier({"type": "nvme", **cfg}, view, spec)


def test_config_errors(tmp_path: Path) -> None:
    bad: dict[str, Any]
    for bad in (
        {},
        {"path": "a", "paths": ["b"]},
        {"paths": []},
        {"paths": "a"},
        {"paths": ["a", "a"]},
        {"path": "a", "checkpoint_every": 0},
        {"path": "a", "evict_batch": True},
        {"path": "a", "coalesce_bytes": -1},
        {"path": "a", "direct_io": "yes"},
        {"path": "a", "preallocate": 1},
        {"path": "a", "durability": "fdatasync"},
    ):
        with pytest.raises(TierConfigError):
            _create(tmp_path, **bad)


_NO_NATIVE = nativeio.problem()


@pytest.mark.parametrize(
    ("value", "runs_on"),
    [
        ("threads", "threads"),
        ("auto", "threads" if _NO_NATIVE else "native"),
        pytest.param("native", "native", marks=pytest.mark.skipif(_NO_NATIVE is not None, reason=f"{_NO_NATIVE}")),
    ],
)
async def test_io_engine_values_run_on_their_engine(tmp_path: Path, value: str, runs_on: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # none is deprecated
        tier, view = make(tmp_path / "kv.slab", io_engine=value)
    assert tier.io_engine == value
    async with tier:
        assert tier.active_io_engine == runs_on
        data = fill(view, CHUNK, 3)
        keys = [b"eng%d" % i for i in range(16)]
        assert (await tier.offload(keys, list(range(16)))).ok
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys, list(range(16)))).ok
        assert [chunk_at(view, CHUNK, i) for i in range(16)] == data


async def test_io_engine_native_refused_where_the_workers_are_missing_auto_runs_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(nativeio, "_PROBLEM", "asynctier/engines/_nativeio was not built")
    tier, _ = make(tmp_path / "n.slab", io_engine="native")
    with pytest.raises(TierConfigError, match=r"io_engine='native' but native I/O workers are unavailable.*not built"):
        await tier.open()
    assert not (tmp_path / "n.slab").exists()  # refused before anything was made
    tier, view = make(tmp_path / "a.slab", io_engine="auto")
    async with tier:
        assert tier.active_io_engine == "threads"
        fill(view, CHUNK, 5)
        assert (await tier.offload([b"x"], [0])).ok and (await tier.load([b"x"], [1])).ok


async def test_a_missing_c_part_is_told_once_a_process_where_auto_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A failed build of an optional C part leaves ``pip install`` silent: the first tier that
    opens with ``io_engine="auto"`` logs which part does not serve and why, once; a tier that
    asked for threads logs nothing."""
    from asynctier import io_engine
    from asynctier.engines import speedups

    real = nativeio.problem()
    monkeypatch.setattr(io_engine, "_told", set())
    caplog.set_level("WARNING", logger="asynctier")
    tier, _ = make(tmp_path / "t.slab", io_engine="threads")
    async with tier:
        pass
    assert not caplog.records
    monkeypatch.setattr(nativeio, "_PROBLEM", "asynctier/engines/_nativeio was not built")
    for name in ("a.slab", "b.slab"):
        tier, _ = make(tmp_path / name, io_engine="auto")
        async with tier:
            assert tier.active_io_engine == "threads"
    (told,) = caplog.records
    assert told.levelname == "WARNING" and "runs on Python threads" in told.getMessage()
    assert "_nativeio was not built" in told.getMessage() and "asynctier info" in told.getMessage()
    monkeypatch.setattr(nativeio, "_PROBLEM", real)
    if real is not None:
        return  # (no workers here at all: only the first message applies)
    monkeypatch.setattr(speedups, "_SPEEDUPS", [None])  # the workers serve; the C twins do not
    caplog.clear()
    for name in ("c.slab", "d.slab"):
        tier, _ = make(tmp_path / name, io_engine="auto")
        async with tier:
            assert tier.active_io_engine == "native"
    (told,) = caplog.records
    assert "C twins of per-chunk helpers" in told.getMessage() and "asynctier info" in told.getMessage()


async def test_a_slab_in_use_by_another_tier_is_refused_and_what_it_stored_stays(tmp_path: Path) -> None:
    """Two tiers on one slab wrote the same slots and journal: each then failed its loads, and
    after a reopen neither's chunks were there. The second open is refused now (the slab is
    locked while open, in this process or another), and once the first closes it opens."""
    first, view = make(tmp_path / "kv.slab")
    second, _ = make(tmp_path / "kv.slab")
    async with first:
        data = fill(view, CHUNK, 7)
        ks = [b"first-%d" % i for i in range(4)]
        assert (await first.offload(ks, [0, 1, 2, 3])).ok
        with pytest.raises(TierStateError, match=r"kv.slab' is open by another tier .*one tier at a time"):
            await second.open()
        view[:] = bytes(view.nbytes)
        assert (await first.load(ks, [4, 5, 6, 7])).ok
        assert [chunk_at(view, CHUNK, 4 + i) for i in range(4)] == data[:4]
    async with second:  # the first closed: the slab is free, and holds what it stored
        assert await second.lookup(ks) == [True] * 4


async def test_two_paths_naming_one_file_are_refused(tmp_path: Path) -> None:
    """``[a, x/../a]`` (or a hard link) passed the distinct-paths check, and both stripes wrote
    one file: loads failed, and a reopen refused the slab as another layout."""
    (tmp_path / "x").mkdir()
    tier, _ = make([tmp_path / "a.slab", tmp_path / "b.slab"], slots=None, capacity_bytes=2 << 20)
    async with tier:
        pass  # both made
    os.link(tmp_path / "a.slab", tmp_path / "hard.slab")
    for other in (tmp_path / "x" / ".." / "a.slab", tmp_path / "hard.slab"):
        tier, _ = make([tmp_path / "a.slab", other], slots=None, capacity_bytes=2 << 20)
        with pytest.raises(TierConfigError, match=r"is the same file as an earlier one of paths"):
            await tier.open()


def test_timeout_s_is_refused_where_nothing_applies_it(tmp_path: Path) -> None:
    """The fs, nvme and memory tiers accepted ``timeout_s`` and ignored it: a store of
    ``timeout_s=1e-06`` took 41 ms and succeeded. Nothing cuts their system calls off."""
    spec = OffloadingSpec(CHUNK, 4)
    view = memoryview(bytearray(spec.total_bytes))
    for config in (
        {"type": "nvme", "path": str(tmp_path / "kv.slab"), "capacity_bytes": 1 << 20},
        {"type": "fs", "root": str(tmp_path / "fs")},
        {"type": "memory"},
    ):
        with pytest.raises(TierConfigError, match=r"chunk I/O is not cut off by a deadline: timeout_s is accepted"):
            SecondaryTierFactory.create_secondary_tier({**config, "timeout_s": 1.0}, view, spec)


async def test_io_engine_defaults_to_auto(tmp_path: Path) -> None:
    tier, _ = make(tmp_path / "kv.slab")
    assert tier.io_engine == "auto"


async def test_io_engine_psync_is_deprecated_and_still_works(tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning, match=r"io_engine='psync' is deprecated.*'threads'"):
        tier, view = make(tmp_path / "kv.slab", io_engine="psync")
    assert tier.io_engine == "threads"
    async with tier:
        assert tier.active_io_engine == "threads"
        data = fill(view, CHUNK, 4)
        assert (await tier.offload([b"a", b"b"], [0, 1])).ok
        view[:] = bytes(view.nbytes)
        assert (await tier.load([b"a", b"b"], [0, 1])).ok
        assert [chunk_at(view, CHUNK, i) for i in range(2)] == data[:2]


def test_io_engine_io_uring_is_refused_naming_the_accepted_values(tmp_path: Path) -> None:
    with pytest.raises(TierConfigError) as ei:
        _create(tmp_path, path=str(tmp_path / "a"), io_engine="io_uring")
    msg = str(ei.value)
    assert "'io_uring'" in msg and "retired" in msg
    assert all(f"'{v}'" in msg for v in ("auto", "native", "threads"))


@pytest.mark.parametrize("value", ["aio", "", 1, None])
def test_io_engine_unknown_values_name_the_accepted_ones(tmp_path: Path, value: object) -> None:
    with pytest.raises(TierConfigError) as ei:
        _create(tmp_path, path=str(tmp_path / "a"), io_engine=value)
    msg = str(ei.value)
    assert repr(value) in msg and "'auto'" in msg and "'threads'" in msg


def test_a_slab_of_a_tier_dropped_without_aclose_is_taken_once_it_is_collected(tmp_path: Path) -> None:
    """A tier dropped without aclose() whose load failed (the error kept in a reference cycle)
    held its slab until the cycle collector ran: the next open of the slab was refused as
    "open by another tier" (the third run in the review's loop, every time)."""

    async def run_once() -> None:
        tier, _view = make(tmp_path / "kv.slab", slots=None, capacity_bytes=4 << 20)
        await tier.open()
        assert (await tier.offload([b"k", b"x"], [0, 1])).ok
        res = await tier.load([b"k", b"missing"], [2, 3])
        assert set(res.failed) == {b"missing"}

    for _ in range(5):
        asyncio.run(run_once())
