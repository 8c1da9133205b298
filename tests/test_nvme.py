"""The nvme tier: conformance, slot format, eviction, recovery, SIGKILL crash safety, 1M-slot reopen."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import mmap
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from asynctier import IntegrityError, OffloadingSpec, SecondaryTierFactory, TierConfigError, ioring
from asynctier.errors import failure_kind
from asynctier.posix_io import buffer_address
from asynctier.testing import TierConformance
from asynctier.tiers.nvme import Checkpoint, NvmeTier, read_checkpoint, write_checkpoint

_NO_URING = ioring.problem()
needs_uring = pytest.mark.skipif(_NO_URING is not None, reason=f"io_uring cannot be initialised here: {_NO_URING}")
ENGINES = ["psync"] if _NO_URING is not None else ["psync", "io_uring"]


class TestNvmeTier(TierConformance):
    """The suite's bytearray primary buffer is not page-aligned: this runs the bounce path."""

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        # sparse: ~70 suite checks x 145 MB of fallocate would be 10 GB of disk per run;
        # preallocation has its own tests below
        return {
            "type": "nvme",
            "path": str(tmp_path / "kv.slab"),
            "capacity_bytes": 2048 * 72 * 1024,
            "preallocate": False,
        }


class TestNvmeTierAligned(TestNvmeTier):
    """The same checks with a page-aligned primary buffer (pinned memory is): the zero-copy path."""

    page_aligned_buffer = True


@needs_uring
class TestNvmeTierUring(TestNvmeTierAligned):
    """The conformance suite with slot I/O through io_uring (per-thread rings), zero-copy path."""

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {**super().tier_config(tmp_path), "io_engine": "io_uring"}


@needs_uring
class TestNvmeTierUringBounce(TestNvmeTier):
    """io_uring with the suite's unaligned bytearray buffer: the bounce path."""

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {**super().tier_config(tmp_path), "io_engine": "io_uring"}


# -- helpers ---------------------------------------------------------------------------------------
CHUNK = 64 * 1024
NS = "nvme/test"


def _aligned(nbytes: int) -> memoryview:
    return memoryview(mmap.mmap(-1, nbytes))


def _misaligned(nbytes: int) -> memoryview:
    """A view 512 bytes past a page boundary: never O_DIRECT-aligned for a 4 KiB block."""
    raw = memoryview(bytearray(nbytes + 8192))
    start = -buffer_address(raw) % 4096 + 512
    return raw[start : start + nbytes]


def _make(
    path: Path | list[Path],
    *,
    chunk: int = CHUNK,
    nchunks: int = 16,
    slots: int | None = 64,
    aligned: bool = True,
    namespace: str = NS,
    **cfg: Any,
) -> tuple[NvmeTier, memoryview]:
    spec = OffloadingSpec(chunk, nchunks, namespace=namespace)
    view = _aligned(spec.total_bytes) if aligned else _misaligned(spec.total_bytes)
    conf: dict[str, Any] = {"type": "nvme", **cfg}
    if isinstance(path, list):
        conf["paths"] = [str(p) for p in path]
    else:
        conf["path"] = str(path)
    if slots is not None:
        slot = 4096 + -(-chunk // 4096) * 4096
        n = len(path) if isinstance(path, list) else 1
        conf["capacity_bytes"] = n * (4096 + slot * (slots // n))
    tier = SecondaryTierFactory.create_secondary_tier(conf, view, spec)
    assert isinstance(tier, NvmeTier)
    return tier, view


def _fill(view: memoryview, chunk: int, seed: int) -> list[bytes]:
    rnd = random.Random(seed)
    out = []
    for i in range(view.nbytes // chunk):
        data = rnd.randbytes(chunk)
        view[i * chunk : (i + 1) * chunk] = data
        out.append(data)
    return out


def _chunk(view: memoryview, chunk: int, i: int) -> bytes:
    return bytes(view[i * chunk : (i + 1) * chunk])


# -- slot format and I/O paths -------------------------------------------------------------------------
@pytest.mark.parametrize("io_engine", ENGINES)
async def test_healthy_loads_take_the_fast_header_check(
    tmp_path: Path, io_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot whose header is the one the index expects is accepted by one compare; the
    header is parsed field by field only when it differs (for the precise error)."""
    from asynctier.integrity import ChunkHeader

    parsed: list[int] = []
    unpack = ChunkHeader.unpack.__func__  # type: ignore[attr-defined]

    def counted(cls: type[ChunkHeader], *args: Any, **kw: Any) -> ChunkHeader:
        parsed.append(1)
        result: ChunkHeader = unpack(cls, *args, **kw)
        return result

    tier, view = _make(tmp_path / "f.slab", io_engine=io_engine)
    async with tier:
        data = _fill(view, CHUNK, 3)
        keys = [b"k%d" % i for i in range(8)]
        assert (await tier.offload(keys, list(range(8)))).ok
        monkeypatch.setattr(ChunkHeader, "unpack", classmethod(counted))
        assert (await tier.load(keys, list(range(8, 16)))).ok
        assert [_chunk(view, CHUNK, 8 + i) for i in range(8)] == data[:8]
        assert parsed == []


@pytest.mark.parametrize("io_engine", ENGINES)
async def test_aligned_view_goes_direct_and_unaligned_bounces(tmp_path: Path, io_engine: str) -> None:
    for aligned in (True, False):
        tier, view = _make(tmp_path / f"a{aligned}.slab", aligned=aligned, io_engine=io_engine)
        async with tier:
            data = _fill(view, CHUNK, 1)
            keys = [b"k%d" % i for i in range(16)]
            assert (await tier.offload(keys, list(range(16)))).ok
            view[:] = bytes(view.nbytes)
            assert (await tier.load(keys, list(range(15, -1, -1)))).ok
            for i in range(16):
                assert _chunk(view, CHUNK, 15 - i) == data[i]
            bounces = tier.stats().extra.get("bounce_copies", 0)
            assert (bounces == 0) if aligned else (bounces == 32)
            assert tier.stats().extra.get("direct_io_fallbacks", 0) == 0


@pytest.mark.parametrize("io_engine", ENGINES)
async def test_chunk_size_not_a_block_multiple(tmp_path: Path, io_engine: str) -> None:
    tier, view = _make(tmp_path / "odd.slab", chunk=10_000, nchunks=8, io_engine=io_engine)
    async with tier:
        data = _fill(view, 10_000, 2)
        keys = [b"odd%d" % i for i in range(8)]
        assert (await tier.offload(keys, list(range(8)))).ok
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys, list(range(8)))).ok
        assert [_chunk(view, 10_000, i) for i in range(8)] == data
        assert tier.stats().extra["bounce_copies"] == 16


async def test_slab_is_preallocated_and_slots_fixed(tmp_path: Path) -> None:
    p = tmp_path / "pre.slab"
    tier, _ = _make(p, slots=32)
    async with tier:
        assert tier.nslots == 32
        assert tier.stored_size() == 4096 + CHUNK
        assert os.stat(p).st_blocks * 512 >= os.stat(p).st_size  # fallocated, not sparse
        assert tier.stats().used_bytes == 0


@pytest.mark.parametrize("io_engine", ENGINES)
@pytest.mark.parametrize("aligned", [True, False], ids=["direct", "buffered"])
@pytest.mark.usefixtures("atime_updates")
async def test_loads_leave_the_slabs_access_time_alone(tmp_path: Path, io_engine: str, aligned: bool) -> None:
    """The slab is opened with O_NOATIME: a load after a store does not dirty its inode."""
    p = tmp_path / "a.slab"
    tier, view = _make(p, aligned=aligned, io_engine=io_engine)
    data = _fill(view, CHUNK, 5)
    async with tier:
        assert (await tier.offload([b"a", b"b"], [0, 1])).ok
        m = os.stat(p).st_mtime_ns
        os.utime(p, ns=(m, m))  # atime = mtime: relatime would update it on the next read
        res = await tier.load([b"a", b"b"], [2, 3])
        assert res.ok, res.failed
        assert [_chunk(view, CHUNK, 2), _chunk(view, CHUNK, 3)] == data[:2]
        assert os.stat(p).st_atime_ns == m


# -- eviction -------------------------------------------------------------------------------------------
async def test_lru_eviction_when_full(tmp_path: Path) -> None:
    tier, view = _make(tmp_path / "lru.slab", slots=8, evict_batch=1)
    async with tier:
        data = _fill(view, CHUNK, 3)
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
        assert [_chunk(view, CHUNK, i) for i in range(4)] == [data[0], data[1], data[8], data[9]]


async def test_an_eviction_batch_never_empties_a_small_slab(tmp_path: Path) -> None:
    """evict_batch (default 16) on a slab of 12 slots evicted every chunk, those this very
    call had just reported stored among them (found by a crash harness's after-reopen
    check). A batch is at most an eighth of the slots."""
    tier, view = _make(tmp_path / "small.slab", slots=12, evict_batch=16)
    async with tier:
        _fill(view, CHUNK, 5)
        keys = [b"s%d" % i for i in range(14)]
        for i in range(12):
            assert (await tier.offload([keys[i]], [i % 16])).ok
        res = await tier.offload(keys[12:14], [12, 13])
        assert res.ok
        assert tier.stats().stored_chunks == 12 and tier.stats().evictions == 2
        assert await tier.lookup(keys) == [False, False] + [True] * 12


# -- integrity -------------------------------------------------------------------------------------------
def _flip(path: Path, offsets: list[int]) -> None:
    with open(path, "r+b") as f:
        for off in offsets:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0xFF]))


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def _find(path: Path, needle: bytes) -> int:
    with open(path, "rb") as f:
        blob = f.read()
    pos = blob.find(needle)
    assert pos >= 0
    return pos


async def test_corrupt_payload_or_header_is_a_miss_not_garbage(tmp_path: Path) -> None:
    p = tmp_path / "bad.slab"
    tier, view = _make(p)
    data = _fill(view, CHUNK, 4)
    keys = [b"c%d" % i for i in range(3)]
    async with tier:
        assert (await tier.offload(keys, [0, 1, 2])).ok
    # flip a payload byte of chunk 0 and a header byte (the key) of chunk 1
    pay = _find(p, data[0][:64]) + 1000
    hdr_key = _find(p, OffloadingSpec(CHUNK, 1, namespace=NS).layout_digest + keys[1]) + 16
    _flip(p, [pay, hdr_key])
    tier, view = _make(p)
    async with tier:
        # fsck finds both and removes nothing unless asked to
        vres = await tier.verify_chunks(keys)
        assert vres.succeeded == [keys[2]] and set(vres.failed) == {keys[0], keys[1]}
        assert await tier.lookup(keys) == [True, True, True]
        view[:] = bytes(view.nbytes)
        res = await tier.load(keys, [5, 6, 7])
        assert res.succeeded == [keys[2]] and _chunk(view, CHUNK, 7) == data[2]
        assert {failure_kind(e) for e in res.failed.values()} == {"checksum"}
        assert await tier.lookup(keys) == [False, False, True]
        assert tier.stats().failures["checksum"] == 4


async def test_overwritten_slot_is_never_served_for_an_old_mapping(tmp_path: Path) -> None:
    """A checkpoint pointing at a slot rewritten later (a reused slot) yields a miss."""
    p = tmp_path / "stale.slab"
    tier, view = _make(p, slots=4, evict_batch=1)
    _fill(view, CHUNK, 5)
    async with tier:
        assert (await tier.offload([b"old"], [0])).ok
    ck_path = p.with_name(p.name + ".atidx.ckpt")
    stale = ck_path.read_bytes()
    tier, view = _make(p, slots=4, evict_batch=1)
    async with tier:
        assert (await tier.remove([b"old"])).ok
        assert (await tier.offload([b"new"], [1])).ok  # reuses the freed slot
    # roll the index back to the stale checkpoint and drop the journal: "old" -> reused slot
    ck_path.write_bytes(stale)
    for j in p.parent.glob(p.name + ".atidx.journal.*"):
        j.unlink()
    tier, view = _make(p, slots=4, evict_batch=1)
    async with tier:
        assert await tier.lookup([b"old"]) == [True]
        view[:] = bytes(view.nbytes)
        res = await tier.load([b"old"], [2])
        assert not res.ok and failure_kind(res.failed[b"old"]) == "checksum"
        assert await tier.lookup([b"old"]) == [False]


async def test_remove_during_a_store_cancels_it_and_the_key_can_be_stored_again(tmp_path: Path) -> None:
    tier, view = _make(tmp_path / "rw.slab")
    data = _fill(view, CHUNK, 13)
    async with tier:
        # a store in flight, driven by hand: slot taken, not yet published
        slot, seq, _ = tier._allocate(b"k")
        assert (await tier.remove([b"k"])).ok
        assert tier._publish(b"k", slot, seq, 0) == 0  # removed meanwhile: not published
        assert await tier.lookup([b"k"]) == [False]
        assert (await tier.offload([b"k"], [3])).ok  # a later store is a new one
        assert await tier.lookup([b"k"]) == [True]
        view[:] = bytes(view.nbytes)
        assert (await tier.load([b"k"], [0])).ok and _chunk(view, CHUNK, 0) == data[3]
        assert len(tier._idx.free) == tier.nslots - 1  # type: ignore[union-attr]


async def test_a_store_begun_after_a_remove_is_not_cancelled_by_it(tmp_path: Path) -> None:
    """remove() cancels the stores of the key in flight when it runs, not those that begin
    after it returned (one was reported stored and never published while an older one ran)."""
    tier, view = _make(tmp_path / "rw.slab")
    data = _fill(view, CHUNK, 17)
    async with tier:
        old_slot, old_seq, _ = tier._allocate(b"k")  # an older store, still writing
        assert (await tier.remove([b"k"])).ok
        assert (await tier.offload([b"k"], [2])).ok  # begun after the remove: a new store
        assert await tier.lookup([b"k"]) == [True]
        assert tier._publish(b"k", old_slot, old_seq, 0) == 0  # the older one: cancelled
        assert await tier.lookup([b"k"]) == [True]
        view[:CHUNK] = bytes(CHUNK)
        assert (await tier.load([b"k"], [0])).ok and _chunk(view, CHUNK, 0) == data[2]
        assert len(tier._idx.free) == tier.nslots - 1  # type: ignore[union-attr]


def _corrupt_payload(tier: NvmeTier, key: bytes) -> None:
    assert tier._idx is not None and tier._geo is not None
    stripe, off = tier._geo.locate(tier._idx.entries[key])
    fd = os.open(tier.paths[stripe], os.O_RDWR)
    try:
        os.pwrite(fd, b"\xff" * 64, off + tier._geo.hdr_area + 100)
        os.fsync(fd)
    finally:
        os.close(fd)


@pytest.mark.parametrize("grouped", [False, True], ids=["one", "group"])
async def test_a_bad_copy_is_dropped_by_its_slot_not_a_copy_stored_since(tmp_path: Path, grouped: bool) -> None:
    """A load that finds a bad copy drops that copy only: if the key was removed and stored
    again while the load ran (even into the same slot), the new copy stays."""
    tier, view = _make(tmp_path / "rw.slab", io_engine="psync", max_inflight=2)
    data = _fill(view, CHUNK, 19)
    names = [b"a", b"b", b"c", b"d"] if grouped else [b"a"]
    held, go_on = threading.Event(), threading.Event()
    async with tier:
        assert (await tier.offload(names, list(range(len(names))))).ok
        bad_slot = tier._idx.entries[b"a"]  # type: ignore[union-attr]
        _corrupt_payload(tier, b"a")
        if grouped:  # hold the group between its reads and the dropping of its bad slots
            end = tier._end_load_group

            def held_end(ks: list[bytes], *args: Any) -> Any:
                if b"a" in ks:
                    held.set()
                    go_on.wait(30)
                return end(ks, *args)

            tier._end_load_group = held_end  # type: ignore[method-assign]
        else:  # hold the one-chunk load's read
            preadv = tier._preadv

            def held_read(*args: Any) -> Any:
                held.set()
                go_on.wait(30)
                return preadv(*args)

            tier._preadv = held_read  # type: ignore[method-assign]
        loading = asyncio.ensure_future(tier.load(names, list(range(8, 8 + len(names)))))
        assert await asyncio.to_thread(held.wait, 30)
        assert (await tier.remove([b"a"])).ok
        if not grouped:
            tier._preadv = preadv  # type: ignore[method-assign]
        assert (await tier.offload([b"a"], [5])).ok  # a good copy, stored again
        assert grouped is False or tier._idx.entries[b"a"] == bad_slot  # type: ignore[union-attr]
        go_on.set()
        res = await loading
        assert set(res.failed) == {b"a"} and isinstance(res.failed[b"a"], IntegrityError)
        assert await tier.lookup([b"a"]) == [True]
        view[:CHUNK] = bytes(CHUNK)
        assert (await tier.load([b"a"], [0])).ok and _chunk(view, CHUNK, 0) == data[5]


def _hold_first_flush(tier: NvmeTier, held: threading.Event, go_on: threading.Event) -> None:
    """The journal's next flush sets ``held`` and waits for ``go_on`` before it writes."""
    journal = tier._journal
    assert journal is not None
    flush = journal._flush

    def held_flush(*args: Any, **kw: Any) -> None:
        if not held.is_set():
            held.set()
            go_on.wait(30)
        flush(*args, **kw)

    journal._flush = held_flush  # type: ignore[method-assign]


@pytest.mark.parametrize("io_engine", ENGINES)
async def test_a_store_found_stored_is_acknowledged_only_once_journaled(tmp_path: Path, io_engine: str) -> None:
    """A second store of a key whose first store is published but whose record is still
    queued waits for that record to reach the journal: else it acknowledged a chunk that a
    crash right after would lose."""
    tier, _ = _make(tmp_path / "rw.slab", io_engine=io_engine)
    held, go_on = threading.Event(), threading.Event()
    async with tier:
        _hold_first_flush(tier, held, go_on)
        first = asyncio.ensure_future(tier.offload([b"k"], [0]))
        assert await asyncio.to_thread(held.wait, 30)  # published, its record not written yet
        assert await tier.lookup([b"k"]) == [True]
        second = asyncio.ensure_future(tier.offload([b"k"], [1]))
        await asyncio.wait([second], timeout=0.3)
        assert not second.done()  # found stored, but not acknowledged before the record is in
        go_on.set()
        assert (await first).ok and (await second).ok
        assert tier.stats().offloaded >= 1


@pytest.mark.parametrize("io_engine", ENGINES)
@pytest.mark.parametrize("group", [False, True])
async def test_a_store_found_stored_waits_for_its_own_record_only(tmp_path: Path, io_engine: str, group: bool) -> None:
    """A store of a key whose record is in the journal is acknowledged at once, even while
    other stores' records wait for a flush (it used to wait for every record queued, and so
    for a flush, an fdatasync under durability="fsync", that it did not need)."""
    tier, view = _make(tmp_path / "own.slab", io_engine=io_engine, max_inflight=4)
    _fill(view, CHUNK, 43)
    held, go_on = threading.Event(), threading.Event()
    async with tier:
        assert (await tier.offload([b"a", b"a2"], [0, 1])).ok  # journaled
        _hold_first_flush(tier, held, go_on)
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


def _journal_full_once(tier: NvmeTier) -> Callable[[int, memoryview], None]:
    """A ``_write_all`` whose first write to ``tier``'s journal lands half a batch, then fails
    with ENOSPC (simulated, once); every other write goes through."""
    import asynctier.tiers.nvme as nvme_mod

    real_write = nvme_mod._write_all
    faults = [1]

    def once_full(fd: int, mv: memoryview) -> None:
        journal = tier._journal
        if faults[0] and journal is not None and fd == journal.fd:
            faults[0] = 0
            real_write(fd, mv[: len(mv) // 2])  # half a batch reaches the file first
            raise OSError(errno.ENOSPC, "No space left on device (simulated, once)")
        real_write(fd, mv)

    return once_full


@pytest.mark.parametrize("io_engine", ENGINES)
async def test_a_failed_journal_write_is_mended_and_the_tier_goes_on(
    tmp_path: Path, io_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One journal write fails (ENOSPC, as on a full index directory): that store is reported
    failed, what may be half-written is cut off and its records are written by the next
    flush, so stores go on once the fault is gone and everything acknowledged is there after
    a reopen (the journal used to refuse every store for the rest of the tier's life)."""
    import asynctier.tiers.nvme as nvme_mod

    tier, view = _make(tmp_path / "rw.slab", io_engine=io_engine, max_inflight=2)
    data = _fill(view, CHUNK, 29)
    once_full = _journal_full_once(tier)

    async with tier:
        assert (await tier.offload([b"a"], [0])).ok
        monkeypatch.setattr(nvme_mod, "_write_all", once_full)
        res = await tier.offload([b"b"], [1])
        assert failure_kind(res.failed[b"b"]) == "io"
        assert (await tier.offload([b"c", b"d"], [2, 3])).ok  # the fault is gone
        assert tier._journal is not None and tier._journal.mended == 1 and tier._journal.broken is None
        assert (await tier.offload([b"b"], [1])).ok  # its record made it after all: found stored
    again, view2 = _make(tmp_path / "rw.slab", io_engine=io_engine)
    async with again:
        assert await again.lookup([b"a", b"b", b"c", b"d"]) == [True] * 4
        res = await again.load([b"a", b"b", b"c", b"d"], [0, 1, 2, 3])
        assert res.ok and [_chunk(view2, CHUNK, i) for i in range(4)] == data[:4]


def _crash(tier: NvmeTier) -> None:
    """Leave without the closing checkpoint, as a killed process would."""
    assert tier._journal is not None
    tier._ckpt_stop = True
    tier._ckpt_wake.set()
    if tier._ckpt_thread is not None:
        tier._ckpt_thread.join()
    tier._journal.close()
    tier._close_fds()
    tier._state = "closed"


async def test_a_failed_journal_switch_keeps_the_old_generation(tmp_path: Path) -> None:
    """A checkpoint whose new journal generation cannot be created (here a directory holds
    its name: EISDIR) fails, but the journal goes on in the generation it had, and what is
    stored after is there after a crash (it used to refuse every store from then on)."""
    p = tmp_path / "sw.slab"
    tier, view = _make(p, checkpoint_every=1 << 20)
    data = _fill(view, CHUNK, 31)
    await tier.open()
    assert (await tier.offload([b"a"], [0])).ok
    journal = tier._journal
    assert journal is not None
    gen = journal.gen
    squatter = journal.path(gen + 1)
    squatter.mkdir()
    with pytest.raises(IsADirectoryError):
        await asyncio.to_thread(tier.checkpoint)
    assert journal.broken is None and journal.gen == gen
    assert (await tier.offload([b"b", b"c"], [1, 2])).ok
    _crash(tier)
    squatter.rmdir()
    tier, view = _make(p)
    async with tier:
        res = await tier.load([b"a", b"b", b"c"], [3, 4, 5])
        assert res.ok and [_chunk(view, CHUNK, i) for i in (3, 4, 5)] == data[:3]
        await asyncio.to_thread(tier.checkpoint)  # nothing in the way: the switch happens
        assert tier._journal is not None and tier._journal.gen > gen
        assert (await tier.offload([b"d"], [3])).ok
    tier, view = _make(p)
    async with tier:
        assert await tier.lookup([b"a", b"b", b"c", b"d"]) == [True] * 4


async def test_a_failed_write_while_switching_generations_is_mended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last batch of a generation fails to write (ENOSPC) during a checkpoint: the
    checkpoint fails, the batch is cut back and queued again, and the tier goes on."""
    import asynctier.tiers.nvme as nvme_mod

    p = tmp_path / "sw.slab"
    tier, view = _make(p, checkpoint_every=1 << 20)
    data = _fill(view, CHUNK, 37)
    once_full = _journal_full_once(tier)

    await tier.open()
    journal = tier._journal
    assert journal is not None
    gen = journal.gen
    journal.append(nvme_mod._pack_record(nvme_mod._EVICT, b"nothing", 0, 0, 0))  # a batch to write
    monkeypatch.setattr(nvme_mod, "_write_all", once_full)
    with pytest.raises(OSError, match="simulated"):
        await asyncio.to_thread(tier.checkpoint)
    assert journal.broken is None and journal.mended == 1 and journal.gen == gen
    assert tier.stats().extra["journal_mended"] == 1
    assert (await tier.offload([b"a", b"b"], [0, 1])).ok
    _crash(tier)
    tier, view = _make(p)
    async with tier:
        res = await tier.load([b"a", b"b"], [2, 3])
        assert res.ok and [_chunk(view, CHUNK, i) for i in (2, 3)] == data[:2]


async def test_the_checkpointer_retries_a_failed_checkpoint_later(tmp_path: Path) -> None:
    """A checkpoint that keeps failing is retried after a pause, not on every store, and
    succeeds once its cause is gone."""
    p = tmp_path / "rt.slab"
    tier, view = _make(p, checkpoint_every=2)
    _fill(view, CHUNK, 41)
    async with tier:
        journal = tier._journal
        assert journal is not None
        squatter = journal.path(journal.gen + 1)
        squatter.mkdir()
        for i in range(0, 8, 2):
            assert (await tier.offload([b"r%d" % i, b"r%d" % (i + 1)], [i, i + 1])).ok
        for _ in range(1000):
            if tier._ckpt_retrying:
                break
            await asyncio.sleep(0.01)
        extra = tier.stats().extra
        assert tier._ckpt_retrying and extra.get("checkpoints", 0) == 0 and extra["checkpoint_failures"] >= 1
        squatter.rmdir()
        for _ in range(3000):  # the first retry comes after _CKPT_RETRY_MIN_S
            if tier.stats().extra.get("checkpoints"):
                break
            await asyncio.sleep(0.01)
        assert tier.stats().extra.get("checkpoints", 0) >= 1 and not tier._ckpt_retrying
        assert (await tier.offload([b"r8"], [8])).ok
    tier, view = _make(p)
    async with tier:
        assert await tier.lookup([b"r%d" % i for i in range(9)]) == [True] * 9


# -- recovery -------------------------------------------------------------------------------------------
async def test_reopen_recovers_index_and_lru_order(tmp_path: Path) -> None:
    p = tmp_path / "re.slab"
    tier, view = _make(p, slots=8, evict_batch=1)
    data = _fill(view, CHUNK, 6)
    keys = [b"r%d" % i for i in range(8)]
    async with tier:
        assert (await tier.offload(keys, list(range(8)))).ok
        await tier.touch([keys[0]])
    tier, view = _make(p, slots=8, evict_batch=1)
    async with tier:
        assert tier.stats().extra["recovered_chunks"] == 8
        assert await tier.lookup(keys) == [True] * 8
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys, list(range(8)))).ok
        assert [_chunk(view, CHUNK, i) for i in range(8)] == data[:8]
        # LRU order survived: key 1 (the oldest after the touch and the loads in order) goes first
        assert (await tier.offload([b"x"], [9])).ok
        assert await tier.lookup([keys[0], b"x"]) == [False, True]  # loads above touched in order 0..7


async def test_journal_replay_and_torn_tail(tmp_path: Path) -> None:
    """Records after the last checkpoint are replayed; a torn tail is cut, not hiding later records."""
    p = tmp_path / "j.slab"
    tier, view = _make(p, checkpoint_every=1 << 20)
    data = _fill(view, CHUNK, 7)
    await tier.open()
    assert (await tier.offload([b"a", b"b"], [0, 1])).ok
    # leave without the closing checkpoint, as a crash would
    assert tier._journal is not None
    tier._journal.close()
    tier._close_fds()
    journals = sorted(p.parent.glob(p.name + ".atidx.journal.*"))
    assert journals
    _append(journals[-1], b"\x01\x00\x05" + os.urandom(20))  # a torn record
    tier, view = _make(p)
    async with tier:
        assert await tier.lookup([b"a", b"b"]) == [True, True]
        view[:] = bytes(view.nbytes)
        assert (await tier.load([b"a", b"b"], [0, 1])).ok
        assert _chunk(view, CHUNK, 0) == data[0] and _chunk(view, CHUNK, 1) == data[1]
        _fill(view, CHUNK, 8)
        assert (await tier.offload([b"c"], [2])).ok
        c = _chunk(view, CHUNK, 2)
        assert tier._journal is not None
        tier._journal.close()  # crash again: "c" lives only in the journal, after the cut
        tier._close_fds()
        tier._state = "closed"
    tier, view = _make(p)
    async with tier:
        assert (await tier.load([b"c"], [3])).ok and _chunk(view, CHUNK, 3) == c


async def test_checkpoint_rotates_journal(tmp_path: Path) -> None:
    p = tmp_path / "ck.slab"
    tier, view = _make(p, checkpoint_every=4)
    _fill(view, CHUNK, 9)
    keys = [b"ck%d" % i for i in range(16)]
    async with tier:
        for i in range(0, 16, 2):
            assert (await tier.offload(keys[i : i + 2], [i, i + 1])).ok
        await asyncio.sleep(0.05)
    assert tier.stats().extra["checkpoints"] >= 2
    assert len(list(p.parent.glob(p.name + ".atidx.journal.*"))) == 1
    tier, view = _make(p)
    async with tier:
        assert await tier.lookup(keys) == [True] * 16


async def test_other_layout_reformats(tmp_path: Path) -> None:
    p = tmp_path / "lay.slab"
    tier, view = _make(p)
    _fill(view, CHUNK, 10)
    async with tier:
        assert (await tier.offload([b"z"], [0])).ok
    tier, view = _make(p, namespace="another/model")
    async with tier:
        assert await tier.lookup([b"z"]) == [False]
        assert tier.stats().stored_chunks == 0


@pytest.mark.parametrize("io_engine", ENGINES)
async def test_striping_across_paths(tmp_path: Path, io_engine: str) -> None:
    """Slots rotate across the stripes; a grouped call (max_inflight=2) spans all three."""
    paths = [tmp_path / "s0.slab", tmp_path / "s1.slab", tmp_path / "s2.slab"]
    tier, view = _make(paths, slots=30, nchunks=12, io_engine=io_engine, max_inflight=2)
    data = _fill(view, CHUNK, 11)
    keys = [b"s%d" % i for i in range(12)]
    async with tier:
        assert tier.nslots == 30
        assert (await tier.offload(keys, list(range(12)))).ok
    for p in paths:  # every stripe got its share of the chunks
        assert p.read_bytes().count(b"ATKV") == 4
    tier, view = _make(paths, slots=30, nchunks=12, io_engine=io_engine, max_inflight=2)
    async with tier:
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys, list(range(12)))).ok
        assert [_chunk(view, CHUNK, i) for i in range(12)] == data


@pytest.mark.parametrize("io_engine", ENGINES)
async def test_a_stripe_refusing_o_direct_makes_every_stripe_buffered(
    tmp_path: Path, io_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where one of the paths refuses O_DIRECT (EINVAL, as a file system without it does),
    the others drop it too: chunks then go to every stripe unbounced, which a descriptor
    still asking for O_DIRECT failed with EINVAL on an unaligned view."""
    import asynctier.tiers.nvme as nvme_mod

    paths = [tmp_path / "s0.slab", tmp_path / "s1.slab"]
    real_open = nvme_mod._open_noatime

    def first_refuses(p: Path, flags: int) -> int:
        if p == paths[0] and flags & nvme_mod.O_DIRECT:
            raise OSError(errno.EINVAL, "O_DIRECT refused (simulated)")
        return int(real_open(p, flags))

    monkeypatch.setattr(nvme_mod, "_open_noatime", first_refuses)
    tier, view = _make(paths, slots=8, nchunks=4, aligned=False, io_engine=io_engine)
    data = _fill(view, CHUNK, 23)
    ks = [b"m%d" % i for i in range(4)]
    async with tier:
        assert not any(fcntl.fcntl(fd, fcntl.F_GETFL) & nvme_mod.O_DIRECT for fd in tier._fds)
        assert tier.stats().extra.get("direct_io_fallbacks") == 1
        assert (await tier.offload(ks, [0, 1, 2, 3])).ok
        view[:] = bytes(view.nbytes)
        res = await tier.load(ks, [0, 1, 2, 3])
        assert res.ok, res.failed
        assert [_chunk(view, CHUNK, i) for i in range(4)] == data


def test_tier_dropped_without_aclose_is_collected(tmp_path: Path) -> None:
    """The checkpoint thread holds no strong reference: a forgotten tier releases its files."""
    import gc
    import weakref

    async def use() -> weakref.ReferenceType[NvmeTier]:
        tier, view = _make(tmp_path / "gc.slab")
        await tier.open()
        _fill(view, CHUNK, 15)
        assert (await tier.offload([b"g"], [0])).ok
        return weakref.ref(tier)

    before = len(os.listdir("/proc/self/fd"))
    ref = asyncio.run(use())
    for _ in range(3):
        gc.collect()
    assert ref() is None
    assert len(os.listdir("/proc/self/fd")) <= before


def test_block_device(tmp_path: Path) -> None:
    """A real block device (a loop device over a sparse image): size from the device, index elsewhere."""
    if os.geteuid() != 0 or not shutil.which("losetup"):
        pytest.skip("needs root and losetup")
    img = tmp_path / "disk.img"
    with open(img, "wb") as f:
        f.truncate(16 << 20)
    r = subprocess.run(["losetup", "-f", "--show", str(img)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"no loop device: {r.stderr.strip()}")
    dev = r.stdout.strip()
    try:
        asyncio.run(_block_device(tmp_path, dev))
    finally:
        subprocess.run(["losetup", "-d", dev], capture_output=True)


async def _block_device(tmp_path: Path, dev: str) -> None:
    tier, _ = _make(Path(dev), slots=None)
    with pytest.raises(TierConfigError, match="index_dir"):
        await tier.open()
    tier, view = _make(Path(dev), slots=None, index_dir=str(tmp_path / "idx"))
    data = _fill(view, CHUNK, 16)
    keys = [b"bd%d" % i for i in range(16)]
    async with tier:
        assert tier.nslots > 16
        assert (await tier.offload(keys, list(range(16)))).ok
    tier, view = _make(Path(dev), slots=None, index_dir=str(tmp_path / "idx"))
    async with tier:
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys, list(range(16)))).ok
        assert [_chunk(view, CHUNK, i) for i in range(16)] == data


def test_config_errors(tmp_path: Path) -> None:
    spec = OffloadingSpec(CHUNK, 4)
    view = memoryview(bytearray(spec.total_bytes))
    for bad in (
        {},
        {"path": "a", "paths": ["b"]},
        {"paths": []},
        {"paths": ["a", "a"]},
        {"path": "a", "checkpoint_every": 0},
        {"path": "a", "direct_io": "yes"},
        {"path": "a", "durability": "fdatasync"},
    ):
        with pytest.raises(TierConfigError):
            SecondaryTierFactory.create_secondary_tier({"type": "nvme", **bad}, view, spec)


def test_bad_io_engine_names_the_accepted_values(tmp_path: Path) -> None:
    spec = OffloadingSpec(CHUNK, 4)
    view = memoryview(bytearray(spec.total_bytes))
    with pytest.raises(TierConfigError) as ei:
        SecondaryTierFactory.create_secondary_tier({"type": "nvme", "path": "a", "io_engine": "aio"}, view, spec)
    msg = str(ei.value)
    assert "'aio'" in msg and all(repr(v) in msg for v in ("psync", "io_uring", "auto"))


async def test_auto_io_engine_takes_the_ring_where_it_works(tmp_path: Path) -> None:
    tier, view = _make(tmp_path / "kv.slab", io_engine="auto")
    async with tier:
        assert tier.active_io_engine == ("io_uring" if _NO_URING is None else "psync")
        data = _fill(view, CHUNK, 3)
        keys = [b"auto%d" % i for i in range(16)]
        assert (await tier.offload(keys, list(range(16)))).ok
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys, list(range(16)))).ok
        assert [_chunk(view, CHUNK, i) for i in range(16)] == data
    tier, _ = _make(tmp_path / "p.slab")
    async with tier:
        assert tier.active_io_engine == "psync"


async def test_without_io_uring_auto_means_psync_and_io_uring_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a ring cannot be set up (old kernel, seccomp, io_uring_disabled, not x86-64)."""
    monkeypatch.setattr(ioring, "problem", lambda: "io_uring_setup failed: [Errno 1] Operation not permitted")
    tier, view = _make(tmp_path / "kv.slab", io_engine="auto")
    async with tier:
        assert tier.active_io_engine == "psync"
        _fill(view, CHUNK, 5)
        assert (await tier.offload([b"a", b"b"], [0, 1])).ok
    tier, _ = _make(tmp_path / "u.slab", io_engine="io_uring")
    with pytest.raises(TierConfigError, match="io_uring is unavailable here: io_uring_setup failed"):
        await tier.open()
    assert not tier.is_open


@needs_uring
async def test_io_uring_errors_fail_their_chunks_and_the_ring_goes_on(tmp_path: Path) -> None:
    """A failed completion (EBADF: the slab swapped for a read-only descriptor) fails the chunks
    of that I/O with the kernel's error; their slots are freed; the tier then works again."""
    p = tmp_path / "kv.slab"
    tier, view = _make(p, nchunks=32, slots=64, io_engine="io_uring", max_inflight=2)
    data = _fill(view, CHUNK, 8)
    keys = [b"e%d" % i for i in range(32)]
    async with tier:
        good = tier._fds[0]
        ro = os.open(p, os.O_RDONLY)
        tier._fds[0] = ro
        try:
            res = await tier.offload(keys, list(range(32)))
        finally:
            tier._fds[0] = good
            os.close(ro)
        assert set(res.failed) == set(keys)
        assert {getattr(e, "errno", None) for e in res.failed.values()} == {errno.EBADF}
        assert tier.stats().failures["io"] == 32 and await tier.lookup(keys) == [False] * 32
        assert len(tier._idx.free) == tier.nslots  # type: ignore[union-attr]
        assert (await tier.offload(keys, list(range(32)))).ok
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys, list(range(32)))).ok
        assert [_chunk(view, CHUNK, i) for i in range(32)] == data


@needs_uring
async def test_io_uring_cancelled_call_frees_what_it_did_not_publish(tmp_path: Path) -> None:
    """Cancel an offload with chunks on the ring: jobs not started are withdrawn, the caller
    hears once the I/O in flight is done; every key is then stored whole or absent, no slot
    is left allocated, pinned or leaked, and the tier goes on (and reopens to the same index)."""
    p = tmp_path / "kv.slab"
    tier, view = _make(p, nchunks=64, slots=256, io_engine="io_uring", max_inflight=4, durability="fsync")
    data = _fill(view, CHUNK, 9)
    async with tier:
        for round_ in range(4):
            keys = [b"c%d-%d" % (round_, i) for i in range(64)]
            task = asyncio.ensure_future(tier.offload(keys, list(range(64))))
            await asyncio.sleep(0.002 * round_)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            else:  # a later round's call may finish before the cancellation lands
                assert round_ > 0, "a call cancelled right after it started completed"
            held = [k for k, ok in zip(keys, await tier.lookup(keys)) if ok]
            idx = tier._idx
            assert idx is not None and not idx.writing and not idx.pins
            assert len(idx.free) + len(idx.entries) == tier.nslots
            view[:] = bytes(view.nbytes)
            pos = [keys.index(k) for k in held]
            assert (await tier.load(held, pos)).ok
            assert all(_chunk(view, CHUNK, keys.index(k)) == data[keys.index(k)] for k in held)
            _fill(view, CHUNK, 9)
    tier, view = _make(p, nchunks=64, slots=256, io_engine="io_uring")
    async with tier:
        assert len(await tier.stored_keys()) == len(tier._idx.entries)  # type: ignore[union-attr]


@needs_uring
@pytest.mark.parametrize("chunk", [CHUNK, 2 * 1024 * 1024])
async def test_io_uring_calls_cancelled_anywhere_leave_slots_and_buffers_whole(tmp_path: Path, chunk: int) -> None:
    """Cancel offloads and loads at points spread from before their first step to past their
    end: 64 KiB chunks go in coalesced groups, 2 MiB chunks one per job with the checksum on a
    thread. A cancelled call returns only once the kernel and the threads are done with the
    caller's buffer; no slot stays allocated or pinned; what was stored loads whole, and a
    load after a cancelled one fills the buffer exactly."""
    n, depth = (128, 2) if chunk == CHUNK else (8, 4)  # small: 9 groups of 15 slots, 2 running
    tier, view = _make(
        tmp_path / "kv.slab", chunk=chunk, nchunks=n, slots=4 * n, io_engine="io_uring", max_inflight=depth
    )
    data = _fill(view, chunk, 3)
    cids = list(range(n))

    async def cancel_after(coro: Any, delay: float) -> None:
        task = asyncio.ensure_future(coro)
        await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async with tier:
        idx = tier._idx
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
            assert all(_chunk(view, chunk, i) == data[i] for i in held)
            await tier.remove(keys)  # room for the next step without evicting `whole`
            _fill(view, chunk, 3)
        view[:] = bytes(view.nbytes)
        t0 = time.perf_counter()
        assert (await tier.load(whole, cids)).ok
        t_load = time.perf_counter() - t0
        for step in range(12):
            view[:] = bytes(view.nbytes)
            await cancel_after(tier.load(whole, cids), t_load * step / 10)
            assert not idx.pins
            assert (await tier.load(whole, cids)).ok
            assert [_chunk(view, chunk, i) for i in cids] == data


async def test_missing_capacity_for_new_slab(tmp_path: Path) -> None:
    tier, _ = _make(tmp_path / "new.slab", slots=None)
    with pytest.raises(TierConfigError):
        await tier.open()


# -- crash safety -------------------------------------------------------------------------------------
CHILD = Path(__file__).with_name("nvme_crash_child.py")


def test_sigkill_during_offload_stream_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """SIGKILL a child offloading with durability="fsync" at random points, 16 times.

    Room for every key (no eviction; removals free slots that are reused at once). After
    each kill: every key reported stored loads bit-identical; every key reported removed is
    gone; anything served is a key the child tried to store, with its exact bytes.
    """
    _crash_loop(tmp_path / "crash.slab", slots=6000, kills=16, seed=1234, keep_last=None)


def test_sigkill_while_evicting(tmp_path: Path) -> None:
    """The same with a 64-slot slab, so nearly every store evicts: the newest keys survive,
    and nothing served is torn, stale or from a reused slot."""
    _crash_loop(tmp_path / "small.slab", slots=64, kills=6, seed=99, keep_last=24)


def _crash_loop(slab: Path, *, slots: int, kills: int, seed: int, keep_last: int | None) -> None:
    sys.path.insert(0, str(CHILD.parent))
    import nvme_crash_child as child

    chunk = 16 * 1024
    capacity = 4096 + (4096 + chunk) * slots
    rnd = random.Random(seed)
    stored: list[bytes] = []  # reported stored, in order
    doomed: set[bytes] = set()  # a removal started: present or absent are both right
    removed: set[bytes] = set()  # a removal returned success: must be absent
    start = 0
    for run in range(kills):
        # both slot engines, aligned and bounced buffers
        engine = "io_uring" if (run // 2) % 2 and _NO_URING is None else "psync"
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(slab), str(capacity), str(chunk), str(start), str(run % 2), engine],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        want = rnd.randrange(0, 60)
        seen = 0
        while seen < want:
            line = proc.stdout.readline()
            if not line.endswith("\n"):  # end of output, or a record cut short
                break
            seen += 1
            _note(line, stored, doomed, removed)
        time.sleep(rnd.random() * 0.01)
        proc.send_signal(signal.SIGKILL)
        rest = proc.stdout.read()  # lines printed before the kill still count
        proc.wait()
        for line in rest.splitlines(keepends=True):
            if line.endswith("\n"):  # a record cut by the kill claims nothing
                _note(line, stored, doomed, removed)
        start += 10_000
        must = set(stored if keep_last is None else stored[-keep_last:]) - doomed
        asyncio.run(_check_after_crash(slab, capacity, chunk, must, removed, start, child))


def _note(line: str, stored: list[bytes], doomed: set[bytes], removed: set[bytes]) -> None:
    op, hexkey = line.split()
    key = bytes.fromhex(hexkey)
    if op == "P":
        stored.append(key)
    else:
        (doomed if op == "D" else removed).add(key)


async def _check_after_crash(
    slab: Path, capacity: int, chunk: int, stored: set[bytes], removed: set[bytes], limit: int, child: Any
) -> None:
    spec = OffloadingSpec(chunk, 64, namespace="crash-test")
    view = _aligned(spec.total_bytes)
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "nvme", "path": str(slab), "capacity_bytes": capacity}, view, spec
    )
    async with tier:
        held = await tier.stored_keys()
        assert stored <= set(held), f"{len(stored - set(held))} acknowledged keys lost"
        assert not removed & set(held), "a key reported removed came back"
        for k in held:  # only keys the child tried to store
            assert k.startswith(b"crash-key-") and int(k[10:]) < limit, k
        for i in range(0, len(held), 64):
            batch = held[i : i + 64]
            res = await tier.load(batch, list(range(len(batch))))
            for j, k in enumerate(batch):
                if k in res.failed:
                    assert k not in stored, f"acknowledged key failed to load: {res.failed[k]!r}"
                else:
                    assert _chunk(view, chunk, j) == child.chunk_data(k, chunk), "garbage served"


# -- a million slots --------------------------------------------------------------------------------------
def test_reopen_with_a_million_slots_indexed(tmp_path: Path) -> None:
    """1M index entries (built as a checkpoint directly; offloading them would take minutes).

    Real chunks in a few slots load bit-identical; a synthetic entry whose slot was never
    written is a miss, not garbage. Reopen timing is in bench/bench_nvme.py. Runs on one
    loop only: it is about the index, not the loop.
    """
    asyncio.run(_million(tmp_path))


async def _million(tmp_path: Path) -> None:
    n = 1 << 20
    chunk = 4096
    p = tmp_path / "big.slab"
    spec = OffloadingSpec(chunk, 8, namespace=NS)
    view = _aligned(spec.total_bytes)
    cfg = {"type": "nvme", "path": str(p), "capacity_bytes": 4096 + 8192 * n, "preallocate": False, "evict_batch": 1}
    tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
    data = _fill(view, chunk, 12)
    real = [b"real%d" % i for i in range(8)]
    async with tier:
        assert (await tier.offload(real, list(range(8)))).ok
    ck_path = p.with_name(p.name + ".atidx.ckpt")
    ck = read_checkpoint(ck_path)
    assert ck is not None and ck.nslots == n
    real_entries = ck.lru()
    assert [k for k, _ in real_entries] == real or sorted(k for k, _ in real_entries) == sorted(real)
    used = {s for _, s in real_entries}
    synthetic = [(b"synthetic-%07d" % i, s) for i, s in enumerate(s for s in range(n) if s not in used)]
    ck = Checkpoint.from_lru(ck.slab_id, ck.gen, n, synthetic + real_entries, ck.slot_seq, ck.slot_csum)
    write_checkpoint(ck_path, ck)
    tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
    async with tier:
        s = tier.stats()
        assert s.stored_chunks == n and s.extra["recovered_chunks"] == n
        assert await tier.lookup([b"synthetic-0000000", b"synthetic-%07d" % (n - 9), b"nope"]) == [True, True, False]
        view[:] = bytes(view.nbytes)
        assert (await tier.load(real, list(range(8)))).ok
        assert [_chunk(view, chunk, i) for i in range(8)] == data
        # full: a store evicts the least recently used entry
        assert (await tier.offload([b"newest"], [1])).ok
        assert await tier.lookup([b"synthetic-0000000", b"newest"]) == [False, True]
        res = await tier.load([b"synthetic-0000001"], [0])
        assert failure_kind(res.failed[b"synthetic-0000001"]) == "checksum"


# -- coalescing ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("io_engine", ENGINES)
async def test_many_small_chunks_coalesce_into_fewer_ios(tmp_path: Path, io_engine: str) -> None:
    """A 64-chunk call runs as groups (one job, one pwritev/preadv per run of adjacent slots)."""
    for aligned in (True, False):
        tier, view = _make(
            tmp_path / f"co{aligned}.slab", nchunks=64, slots=128, aligned=aligned, max_inflight=4, io_engine=io_engine
        )
        async with tier:
            data = _fill(view, CHUNK, 14)
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
                assert _chunk(view, CHUNK, slot) == data[i]
            assert tier.stats().extra.get("bounce_copies", 0) == (0 if aligned else 127)
            assert tier.stats().loaded == 63


@pytest.mark.parametrize("io_engine", ENGINES)
async def test_grouped_calls_skip_stored_keys_and_fail_bad_slots_one_by_one(tmp_path: Path, io_engine: str) -> None:
    """The group paths book per chunk what the one-chunk paths do: skips, integrity failures
    (a corrupted payload, a corrupted header), bit-exact loads of the rest, stats."""
    for aligned in (True, False):
        p = tmp_path / f"grp{aligned}.slab"
        tier, view = _make(p, nchunks=64, slots=128, aligned=aligned, max_inflight=2, io_engine=io_engine)
        data = _fill(view, CHUNK, 21)
        keys = [b"g%02d" % i for i in range(48)]
        async with tier:
            assert (await tier.offload(keys[:32], list(range(32)))).ok
            res = await tier.offload(keys[16:48], list(range(16, 48)))  # 16 stored already
            assert res.ok and res.succeeded == keys[16:48]
            s = tier.stats()
            assert (s.offloaded, s.skipped, s.offload_latency.count) == (48, 16, 64)
        digest = OffloadingSpec(CHUNK, 1, namespace=NS).layout_digest
        _flip(p, [_find(p, data[3][:64]) + 777, _find(p, digest + keys[5]) + 16 + 1])
        tier, view = _make(p, nchunks=64, slots=128, aligned=aligned, max_inflight=2, io_engine=io_engine)
        async with tier:
            view[:] = bytes(view.nbytes)
            perm = list(range(63, 15, -1))  # other slots than offloaded from
            res = await tier.load(keys, perm)
            assert set(res.failed) == {keys[3], keys[5]}
            assert {failure_kind(e) for e in res.failed.values()} == {"checksum"}
            for i, cid in enumerate(perm):
                if i not in (3, 5):
                    assert _chunk(view, CHUNK, cid) == data[i], i
            assert await tier.lookup([keys[3], keys[5], keys[4]]) == [False, False, True]
            s = tier.stats()
            assert (s.loaded, s.failures["checksum"], s.load_latency.count) == (46, 2, 46)
            assert s.extra.get("bounce_copies", 0) == (0 if aligned else 46)
