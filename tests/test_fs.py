"""The ``fs`` tier: the conformance suite, plus real faults on real files and file systems.

Faults are made for real: bytes flipped and files cut short on disk, a read-only bind mount,
a directory without write permission (seen by a process without CAP_DAC_OVERRIDE), a small
tmpfs filled up, EIO from a loop device whose image lost its tail, a second process storing
into the same root. Checks that need ``mount``, ``losetup`` or ``setpriv`` skip with the
reason where the machine does not allow them.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from disk_helpers import OnDisk
from fs_helpers import chunk_file, damage_file, swap_files
from native_helpers import GroupSpy

from asynctier import (
    CapacityError,
    IntegrityError,
    OffloadingSpec,
    SecondaryTierFactory,
    TierConfigError,
)
from asynctier.cli.benchkit import drop_page_cache
from asynctier.core import Op
from asynctier.engines import native as nativeio
from asynctier.errors import failure_kind
from asynctier.integrity import key_token
from asynctier.posix_io import aligned_buffer
from asynctier.testing import Harness, TierConformance
from asynctier.tiers.fs import HEADER_BLOCK, FsTier
from asynctier.tiers.fs.fast import StorePath
from asynctier.tiers.fs.layout import shard_of
from asynctier.tiers.fs.native import NativeIO
from asynctier.tiers.fs.pool import TmpfilePool
from asynctier.tiers.fs.protocol import ChunkProtocol

REPO = Path(__file__).resolve().parent.parent
CHUNK = 64 * 1024
NCHUNKS = 16


class TestFsConformance(TierConformance):
    """Defaults (``io_engine="auto"``: the native workers where built): O_DIRECT where aligned
    (the suite's bytearray is not: buffered, counted). On asyncio, uvloop and trio."""

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "fs", "root": str(tmp_path / "kv")}

    def chunk_path(self, h: Harness, key: bytes) -> Path:
        assert isinstance(h.tier, FsTier)
        return chunk_file(h.tier, key)

    async def corrupt_stored(self, h: Harness, key: bytes, how: str) -> None:
        assert isinstance(h.tier, FsTier)
        await anyio.to_thread.run_sync(damage_file, chunk_file(h.tier, key), how)

    async def swap_stored(self, h: Harness, key_a: bytes, key_b: bytes) -> None:
        assert isinstance(h.tier, FsTier)
        await anyio.to_thread.run_sync(swap_files, chunk_file(h.tier, key_a), chunk_file(h.tier, key_b))


class TestFsConformanceDirectIO(OnDisk, TestFsConformance):
    """A page-aligned primary buffer: chunks move with O_DIRECT straight from and into it,
    on a disk's file system (not the suite's tmpfs). The I/O path differs, not the loop: one
    backend."""

    page_aligned_buffer = True
    backends = ("asyncio",)


_NO_NATIVE = nativeio.problem()


class TestFsConformanceThreads(TestFsConformance):
    """The threads engine (what ``"auto"`` takes where the native workers are not built),
    buffered."""

    backends = ("asyncio", "trio")  # uvloop: covered by the memory, native fs, nvme and chain classes

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {**super().tier_config(tmp_path), "io_engine": "threads"}


class TestFsConformanceThreadsDirectIO(OnDisk, TestFsConformanceThreads):
    """The threads engine with O_DIRECT, on a disk (one backend, as above)."""

    page_aligned_buffer = True
    backends = ("asyncio",)


# -- helpers ---------------------------------------------------------------------------------
_ENGINE = {"name": "threads"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test function below runs on both engines (the conformance classes pick theirs)."""
    if metafunc.cls is None and "io_engine" in metafunc.fixturenames:
        native = pytest.param(
            "native", marks=pytest.mark.skipif(_NO_NATIVE is not None, reason=f"no native workers: {_NO_NATIVE}")
        )
        metafunc.parametrize("io_engine", ["threads", native], indirect=True)


@pytest.fixture(autouse=True)
def io_engine(request: pytest.FixtureRequest) -> Any:
    """The engine make_tier() uses unless a test says otherwise."""
    _ENGINE["name"] = getattr(request, "param", "threads")
    yield _ENGINE["name"]
    _ENGINE["name"] = "threads"


def make_tier(root: Path, view: memoryview | None = None, **config: Any) -> tuple[FsTier, memoryview]:
    spec = OffloadingSpec(CHUNK, NCHUNKS, namespace="test/fs")
    if view is None:
        view = memoryview(bytearray(spec.total_bytes))
    config.setdefault("io_engine", _ENGINE["name"])
    tier = SecondaryTierFactory.create_secondary_tier({"type": "fs", "root": str(root), **config}, view, spec)
    assert isinstance(tier, FsTier)
    return tier, view


def fill(view: memoryview, seed: int) -> list[bytes]:
    rnd = random.Random(seed)
    out = []
    for i in range(NCHUNKS):
        data = rnd.randbytes(CHUNK)
        view[i * CHUNK : (i + 1) * CHUNK] = data
        out.append(data)
    return out


def chunk(view: memoryview, i: int) -> bytes:
    return bytes(view[i * CHUNK : (i + 1) * CHUNK])


def keys(n: int, tag: str = "k") -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(n)]


def chunk_files(tier: FsTier) -> list[Path]:
    return [p for p in tier.dir.glob("??/*") if p.is_file()]


def sh(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def mounted(target: Path, *args: str) -> Iterator[Path]:
    target.mkdir(parents=True, exist_ok=True)
    r = sh("mount", *args, str(target))
    if r.returncode != 0:
        pytest.skip(f"cannot mount here ({r.stderr.strip()}); this check needs root and mount")
    try:
        yield target
    finally:
        for _ in range(50):  # a tier's descriptors may close a moment later
            if sh("umount", str(target)).returncode == 0:
                break
            time.sleep(0.1)


def fill_up(path: Path, step: int) -> None:
    """Write zeros to ``path`` until the file system is full."""
    with open(path, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * step)


def run_python(code: str, *prefix: str, timeout: float = 30) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter (optionally under ``prefix``, e.g. setpriv); it prints JSON."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [*prefix, sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    result: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


# -- layout and integrity ----------------------------------------------------------------------
async def test_layout_names_are_encoded_and_header_leads(tmp_path: Path) -> None:
    tier, view = make_tier(tmp_path)
    data = fill(view, 1)
    raw = b"../../etc/passwd\x00/ \xff"
    long_key = b"L" * 200
    async with tier:
        assert (await tier.offload([raw, long_key], [0, 1])).ok
        names = [p.name for p in chunk_files(tier)]
        assert sorted(names) == sorted([key_token(raw), key_token(long_key)])
        assert all("/" not in n and "." not in n for n in names)
        f = chunk_file(tier, raw)
        assert f.stat().st_size == HEADER_BLOCK + CHUNK
        assert f.read_bytes()[HEADER_BLOCK:] == data[0]
        assert (tier.dir / "LAYOUT").read_text().startswith("asynctier fs tier")
    # a restart finds both, the hashed name through its header
    tier2, view2 = make_tier(tmp_path)
    async with tier2:
        assert sorted(await tier2.stored_keys()) == sorted([raw, long_key])
        assert (await tier2.load([raw, long_key], [3, 4])).ok
        assert chunk(view2, 3) == data[0] and chunk(view2, 4) == data[1]


@pytest.mark.parametrize("damage", ["payload", "header", "truncate", "empty", "other_key"])
async def test_bad_file_fails_only_its_key_and_is_removed(tmp_path: Path, damage: str, io_engine: str) -> None:
    tier, view = make_tier(tmp_path)
    data = fill(view, 2)
    k = keys(3)
    async with tier:
        assert (await tier.offload(k, [0, 1, 2])).ok
        f = chunk_file(tier, k[1])
        raw = bytearray(f.read_bytes())
        if damage == "payload":
            raw[HEADER_BLOCK + 1234] ^= 0x40
        elif damage == "header":
            raw[20] ^= 0x01
        elif damage == "truncate":
            raw = raw[: HEADER_BLOCK + CHUNK // 2]
        elif damage == "empty":
            raw = bytearray()
        else:  # a valid chunk of another key under this key's name
            raw = bytearray(chunk_file(tier, k[2]).read_bytes())
        f.write_bytes(bytes(raw))
        res = await tier.load(k, [5, 6, 7])
        assert res.succeeded == [k[0], k[2]]
        assert isinstance(res.failed[k[1]], IntegrityError), repr(res.failed[k[1]])
        assert failure_kind(res.failed[k[1]]) == "checksum"
        assert chunk(view, 5) == data[0] and chunk(view, 7) == data[2]
        assert not f.exists(), "the bad copy was not removed"
        assert await tier.lookup(k) == [True, False, True]
        assert tier.stats().failures["checksum"] == 1
        # the tier keeps working: store it again and load it
        assert (await tier.offload([k[1]], [1])).ok
        assert (await tier.load([k[1]], [8])).ok and chunk(view, 8) == data[1]


async def test_healthy_loads_take_the_fast_header_check(
    tmp_path: Path, io_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load whose header is exactly what was stored is accepted by one compare; the
    field-by-field parse runs only for a bad file (its precise error) or verify=False."""
    slow: list[bytes] = []
    parse = ChunkProtocol.check_slow

    def counted(self: ChunkProtocol, key: bytes, *args: Any) -> None:
        slow.append(key)
        parse(self, key, *args)

    monkeypatch.setattr(ChunkProtocol, "check_slow", counted)
    tier, view = make_tier(tmp_path)
    data = fill(view, 4)
    k = keys(4)
    async with tier:
        assert (await tier.offload(k, [0, 1, 2, 3])).ok
        assert (await tier.load(k, [4, 5, 6, 7])).ok
        assert [chunk(view, 4 + i) for i in range(4)] == data[:4]
        assert slow == []
        raw = bytearray(chunk_file(tier, k[2]).read_bytes())
        raw[HEADER_BLOCK + 7] ^= 0x20
        chunk_file(tier, k[2]).write_bytes(bytes(raw))
        res = await tier.load(k, [4, 5, 6, 7])
        assert res.succeeded == [k[0], k[1], k[3]] and slow == [k[2]]


async def test_verify_off_still_catches_truncation_and_header(tmp_path: Path) -> None:
    tier, view = make_tier(tmp_path, verify=False)
    fill(view, 3)
    k = keys(2)
    async with tier:
        assert (await tier.offload(k, [0, 1])).ok
        f0 = chunk_file(tier, k[0])
        f0.write_bytes(f0.read_bytes()[:-1])
        f1 = chunk_file(tier, k[1])
        raw = bytearray(f1.read_bytes())
        raw[HEADER_BLOCK + 10] ^= 1  # payload damage goes unseen without verify: that is the point of it
        f1.write_bytes(bytes(raw))
        res = await tier.load(k, [2, 3])
        assert isinstance(res.failed[k[0]], IntegrityError)
        assert res.succeeded == [k[1]]


async def test_file_that_vanished_fails_its_key_not_found(tmp_path: Path) -> None:
    tier, view = make_tier(tmp_path)
    data = fill(view, 4)
    k = keys(2)
    async with tier:
        assert (await tier.offload(k, [0, 1])).ok
        chunk_file(tier, k[0]).unlink()
        res = await tier.load(k, [2, 3])
        assert failure_kind(res.failed[k[0]]) == "not_found"
        assert res.succeeded == [k[1]] and chunk(view, 3) == data[1]
        assert await tier.lookup(k) == [False, True]


# -- capacity --------------------------------------------------------------------------------
async def test_capacity_lru_eviction_keeps_disk_within_bound(tmp_path: Path) -> None:
    per = HEADER_BLOCK + CHUNK
    tier, view = make_tier(tmp_path, capacity_bytes=8 * per)
    data = fill(view, 5)
    k = keys(12)
    async with tier:
        for i in range(8):  # one at a time: LRU order is commit order
            assert (await tier.offload([k[i]], [i])).ok
        await tier.touch(k[:2])  # 0,1 become most recent: 2,3 are the oldest now
        assert (await tier.load([k[4]], [12])).ok  # a load counts as use too
        assert (await tier.offload(k[8:10], [8, 9])).ok
        assert await tier.lookup(k[:10]) == [True, True, False, False] + [True] * 6
        assert (await tier.offload(k[10:12], [10, 11])).ok  # next oldest: 5, 6
        assert await tier.lookup([k[4], k[5], k[6], k[7]]) == [True, False, False, True]
        s = tier.stats()
        assert s.evictions == 4 and (s.used_bytes or 0) <= 8 * per and s.stored_chunks == 8
        files = chunk_files(tier)
        assert len(files) == 8
        assert sum(f.stat().st_blocks * 512 for f in files) <= 8 * per, "bytes on disk exceed capacity"
        res = await tier.load(k[8:12], [12, 13, 14, 15])
        assert res.ok and [chunk(view, 12 + i) for i in range(4)] == data[8:12]


async def test_a_failed_eviction_is_reported_not_taken_for_success(
    tmp_path: Path, io_engine: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An evicted chunk whose file cannot be unlinked (here: a directory stands in its name,
    EISDIR) is logged as a failed eviction on both engines; the store that evicted it goes
    on."""
    per = HEADER_BLOCK + CHUNK
    tier, view = make_tier(tmp_path, capacity_bytes=per)
    fill(view, 22)
    caplog.set_level(logging.WARNING)
    async with tier:
        assert (await tier.offload([b"old"], [0])).ok
        f = chunk_file(tier, b"old")
        f.unlink()
        f.mkdir()
        (f / "x").write_bytes(b"x")
        assert (await tier.offload([b"new"], [1])).ok  # evicts "old": its unlink fails
        assert tier.stats().evictions == 1
        failed = [r for r in caplog.records if "evicting" in r.getMessage() and "failed" in r.getMessage()]
        assert len(failed) == 1 and "Is a directory" in failed[0].getMessage(), [r.getMessage() for r in caplog.records]
        assert await tier.lookup([b"new", b"old"]) == [True, False]


async def test_eviction_never_deletes_a_chunk_being_read(tmp_path: Path) -> None:
    per = HEADER_BLOCK + CHUNK
    tier, view = make_tier(tmp_path, capacity_bytes=4 * per, max_inflight=8)
    data = fill(view, 6)
    async with tier:
        for rnd in range(5):
            old = keys(4, f"r{rnd}")
            assert (await tier.offload(old, [0, 1, 2, 3])).ok
            # loads of the old keys race stores that must evict them
            load = asyncio.ensure_future(tier.load(old, [8, 9, 10, 11]))
            store = asyncio.ensure_future(tier.offload(keys(4, f"n{rnd}"), [4, 5, 6, 7]))
            lres, sres = await asyncio.gather(load, store)
            for i, key in enumerate(old):
                if key in lres.succeeded:
                    assert chunk(view, 8 + i) == data[i], "a load returned bytes of an evicted file"
                else:
                    assert failure_kind(lres.failed[key]) == "not_found"
            for exc in sres.failed.values():
                assert failure_kind(exc) == "capacity", repr(exc)  # all four pinned: no room
            assert len(chunk_files(tier)) <= 4


# -- restart -----------------------------------------------------------------------------------
@pytest.mark.parametrize("background", [False, True])
async def test_restart_rebuilds_index_cleans_debris_restores_lru(tmp_path: Path, background: bool) -> None:
    per = HEADER_BLOCK + CHUNK
    tier, view = make_tier(tmp_path)
    data = fill(view, 7)
    k = keys(6)
    async with tier:
        assert (await tier.offload(k, list(range(6)))).ok
    # LRU order from file times: make k[3] the oldest, then k[0], then the rest in order
    base = time.time() - 1000
    for rank, i in enumerate([3, 0, 1, 2, 4, 5]):
        os.utime(chunk_file(tier, k[i]), (base + rank, base + rank))
    shard = chunk_file(tier, k[0]).parent
    dead = shard / f".tmp~{tier.names.host}~999999~0~1"  # a writer that died mid-write
    dead.write_bytes(b"x" * 100)
    live = shard / f".tmp~{tier.names.host}~{os.getpid()}~99~1"  # a live writer of this process: kept
    live.write_bytes(b"x")
    old_foreign = shard / ".tmp~otherhost~1~0~1"  # another host's, long abandoned
    old_foreign.write_bytes(b"x")
    os.utime(old_foreign, (base - 7200, base - 7200))
    (shard / "not-a-chunk.txt").write_text("hello")  # foreign files are left alone
    truncated = chunk_file(tier, b"cut")
    truncated.write_bytes(b"\0" * 100)  # a truncated chunk: never served, removed

    tier2, view2 = make_tier(tmp_path, capacity_bytes=6 * per, background_scan=background)
    async with tier2:
        # during a background scan, answers come from disk: none is wrong
        assert await tier2.lookup([*k, b"cut", b"never"]) == [True] * 6 + [False, False]
        res = await tier2.load([k[5]], [10])
        assert res.ok and chunk(view2, 10) == data[5]
        assert sorted(await tier2.stored_keys()) == sorted(k)  # waits for the scan
        assert not dead.exists() and not old_foreign.exists() and not truncated.exists()
        assert live.exists() and (shard / "not-a-chunk.txt").exists()
        s = tier2.stats()
        assert s.stored_chunks == 6 and s.used_bytes == 6 * per
        assert s.extra["scan_removed_tmp"] == 2 and s.extra["scan_removed_bad"] == 1
        # the oldest go first: k[3] then k[0]
        assert (await tier2.offload([b"new1", b"new2"], [0, 1])).ok
        assert await tier2.lookup(k) == [False, True, True, False, True, True]
        res = await tier2.load([k[1], k[2]], [11, 12])
        assert res.ok and chunk(view2, 11) == data[1] and chunk(view2, 12) == data[2]
    live.unlink()


async def test_restart_restores_lru_order_of_loads_and_touches(tmp_path: Path) -> None:
    per = HEADER_BLOCK + CHUNK
    tier, view = make_tier(tmp_path)
    fill(view, 16)
    k = keys(4)
    async with tier:
        for i in range(4):
            assert (await tier.offload([k[i]], [i])).ok
            await asyncio.sleep(0.02)  # file times are coarse: keep the writes apart
        assert (await tier.load([k[0]], [8])).ok
        await tier.touch([k[1]])
    tier2, _ = make_tier(tmp_path, capacity_bytes=4 * per)
    async with tier2:
        assert (await tier2.offload([b"n1", b"n2"], [4, 5])).ok
        assert await tier2.lookup(k) == [True, True, False, False], "k2, k3 were the least recently used"


@pytest.mark.parametrize("background", [True, False])
async def test_restart_orders_every_shard_by_file_time_merged_in_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, background: bool
) -> None:
    """The scan sorts each shard's files and merges the shards lazily, a few entries per hold
    of the index's lock: the order across shards is still the files' times, oldest first."""
    from asynctier import lru

    monkeypatch.setattr(lru, "MERGE_STEP", 3)
    per = HEADER_BLOCK + CHUNK
    tier, view = make_tier(tmp_path)
    fill(view, 16)
    k = keys(24)
    assert len({shard_of(key) for key in k}) > 8  # files in many shards
    order = random.Random(4).sample(range(len(k)), len(k))  # k[order[0]] the oldest
    async with tier:
        assert (await tier.offload(k, [i % 16 for i in range(len(k))])).ok
        base = time.time_ns() - 10**12
        for rank, i in enumerate(order):
            fd, name = tier.protocol.name(k[i])
            os.utime(name, ns=(base + rank * 10**9, base + rank * 10**9), dir_fd=fd)
    tier2, _ = make_tier(tmp_path, capacity_bytes=len(k) * per, background_scan=background)
    async with tier2:
        assert (await tier2.lookup(k)) == [True] * len(k)
        if tier2.recovery.thread is not None:  # the index whole: the stores below evict from it
            await anyio.to_thread.run_sync(tier2.recovery.thread.join)
        assert (await tier2.offload([b"n%d" % i for i in range(5)], list(range(5)))).ok
        gone = {k[i] for i in order[:5]}
        assert await tier2.lookup(k) == [key not in gone for key in k], "the five oldest files go first"


def test_a_stepped_merge_leaves_out_keys_gone_between_its_steps() -> None:
    """Between the merge's steps the lock is free: a key noted gone then (its file deleted
    by another call) is not brought back by a later step."""
    from asynctier import lru

    idx = lru.LRUIndex(None)
    skip: set[bytes] = set()
    found = [(100 - i, b"k%d" % i, 1) for i in range(2 * lru.MERGE_STEP + 5)]  # newest first

    def feed() -> Iterator[tuple[int, bytes, int]]:
        for n, item in enumerate(found):
            if n == lru.MERGE_STEP + 1:  # the first step is in; the second is being gathered
                skip.add(b"k%d" % (2 * lru.MERGE_STEP))
            yield item

    added = idx.merge_older_newest_first(feed(), skip)
    assert added == len(found) - 1 and b"k%d" % (2 * lru.MERGE_STEP) not in idx
    # oldest first, as merge_older orders them
    assert idx.keys() == [key for _, key, _ in reversed(found) if key != b"k%d" % (2 * lru.MERGE_STEP)]


async def test_auto_scans_large_namespace_in_background(tmp_path: Path) -> None:
    tier, view = make_tier(tmp_path)
    data = fill(view, 17)
    k = [key for key in keys(4000) if shard_of(key) == 0][:2] + keys(6, "x")  # shard 00 is sampled
    async with tier:
        assert (await tier.offload(k, list(range(len(k))))).ok
    tier2, view2 = make_tier(tmp_path, scan_sync_limit=100)  # 2 files in shard 00 -> ~512 estimated
    async with tier2:
        assert tier2.recovery.thread is not None, "auto did not choose a background scan"
        assert await tier2.lookup(k) == [True] * len(k)
        assert (await tier2.load(k[:2], [10, 11])).ok and chunk(view2, 10) == data[0]
        assert sorted(await tier2.stored_keys()) == sorted(k)


async def test_restart_with_smaller_capacity_evicts_down(tmp_path: Path) -> None:
    per = HEADER_BLOCK + CHUNK
    tier, view = make_tier(tmp_path)
    fill(view, 8)
    async with tier:
        assert (await tier.offload(keys(10), list(range(10)))).ok
    tier2, _ = make_tier(tmp_path, capacity_bytes=4 * per)
    async with tier2:
        assert (tier2.stats().used_bytes or 0) <= 4 * per
        assert len(chunk_files(tier2)) == 4


# -- O_DIRECT ----------------------------------------------------------------------------------
async def test_direct_io_aligned_has_no_fallbacks_unaligned_counts_and_logs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spec_bytes = CHUNK * NCHUNKS
    aligned = aligned_buffer(spec_bytes)
    try:
        tier, view = make_tier(tmp_path / "a", aligned, direct_io=True)
    except TierConfigError as e:  # pragma: no cover - depends on the file system under tmp_path
        pytest.skip(str(e))
    data = fill(view, 9)
    try:
        async with tier:
            if not tier.protocol.use_direct:
                pytest.skip("the file system under tmp_path refuses O_DIRECT")
            assert (await tier.offload(keys(4), [0, 1, 2, 3])).ok
            view[: 4 * CHUNK] = bytes(4 * CHUNK)
            assert (await tier.load(keys(4), [0, 1, 2, 3])).ok
            assert [chunk(view, i) for i in range(4)] == data[:4]
            assert tier.stats().extra.get("direct_io_fallbacks", 0) == 0
    finally:
        view.release()

    backing = bytearray(spec_bytes + 1)
    unaligned = memoryview(backing)[1:]  # an odd address: O_DIRECT impossible
    tier, view = make_tier(tmp_path / "u", unaligned, direct_io=True)
    data = fill(view, 10)
    caplog.set_level(logging.WARNING, logger="asynctier.tiers.fs")
    async with tier:
        assert (await tier.offload(keys(4), [0, 1, 2, 3])).ok
        res = await tier.load(keys(4), [4, 5, 6, 7])
        assert res.ok and [chunk(view, 4 + i) for i in range(4)] == data[:4]
        assert tier.stats().extra["direct_io_fallbacks"] == 8
    assert len([r for r in caplog.records if "direct_io_fallbacks" in r.getMessage()]) == 1


async def test_direct_io_off_and_bad_config(tmp_path: Path) -> None:
    tier, view = make_tier(tmp_path, direct_io=False)
    fill(view, 11)
    async with tier:
        assert (await tier.offload(keys(2), [0, 1])).ok
        assert (await tier.load(keys(2), [2, 3])).ok
        assert "direct_io_fallbacks" not in tier.stats().extra
    for bad in ({"direct_io": "yes"}, {"publish": "copy"}, {"durability": "sync"}, {"shared": 1}, {"bogus": 1}):
        with pytest.raises(TierConfigError):
            make_tier(tmp_path, **bad)


async def test_files_made_ahead_are_used_and_closed(tmp_path: Path, io_engine: str) -> None:
    """tmpfile_pool: a thread makes unnamed files ahead of need; writes use them; aclose()
    closes the ones left; nothing of them shows on disk."""
    fds_before = set(os.listdir("/proc/self/fd"))
    tier, view = make_tier(tmp_path, max_inflight=1, publish="tmpfile", tmpfile_pool=8)
    data = fill(view, 21)
    k = keys(8)
    async with tier:
        pool = tier.protocol.pool
        assert pool is not None
        for _ in range(200):  # the thread fills it in the background
            if pool.ready == 8:
                break
            await asyncio.sleep(0.01)
        assert pool.ready == 8 and tier.stats().extra["tmpfile_pool_ready"] == 8
        assert (await tier.offload(k[:4], [0, 1, 2, 3])).ok
        assert tier.stats().extra.get("tmpfile_pool_empty", 0) == 0, "four writes found files ready"
        assert (await tier.offload(k[4:], [4, 5, 6, 7])).ok
        res = await tier.load(k, list(range(8, 16)))
        assert res.ok and [chunk(view, 8 + i) for i in range(8)] == data[:8]
        assert sorted(p.name for p in chunk_files(tier)) == sorted(chunk_file(tier, key).name for key in k)
    assert tier.protocol.pool is None and not pool._thread.is_alive()
    # (fds other tests leaked may be closed by the garbage collector meanwhile: only new ones count)
    assert not set(os.listdir("/proc/self/fd")) - fds_before, "pooled files and shard directories are closed"
    for depth in (1, 4, 16):  # on by default at every depth: 64 files
        tier, _ = make_tier(tmp_path, max_inflight=depth, io_engine="threads")
        async with tier:
            assert tier.protocol.pool is not None and tier.protocol.pool._target == 64
    tier, _ = make_tier(tmp_path, max_inflight=4, tmpfile_pool=0, io_engine="threads")
    async with tier:
        assert tier.protocol.pool is None
    for bad in (-1, 4097, 10**6):  # (a million pooled files took every descriptor the process had)
        with pytest.raises(TierConfigError, match=r"tmpfile_pool must be an int from 0 to 4096 or None"):
            make_tier(tmp_path, tmpfile_pool=bad)


def test_a_held_pool_makes_no_files_until_released(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("asynctier.tiers.fs.pool.POOL_HOLD_POLL_S", 0.05)  # how often a held pool asks again
    held = True
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = TmpfilePool([dfd], os.O_WRONLY, 4, "test-pool", lambda: held)
    try:
        time.sleep(0.3)  # unheld, the thread makes 4 files in well under a millisecond each
        assert pool.ready == 0, "made files while held"
        held = False
        for _ in range(500):
            if pool.ready == 4:
                break
            time.sleep(0.01)
        assert pool.ready == 4, "did not fill once released"
        fd = pool.take()
        assert fd is not None
        os.close(fd)
        for _ in range(500):  # a take from a full pool wakes the thread to make one more
            if pool.ready == 4:
                break
            time.sleep(0.01)
        assert pool.ready == 4
    finally:
        pool.close()
        os.close(dfd)
    assert not pool._thread.is_alive() and pool.ready == 0


@pytest.mark.skipif(_NO_NATIVE is not None, reason=f"no native workers: {_NO_NATIVE}")
async def test_removals_and_verification_run_on_threads_beside_the_native_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the native engine, stores and loads are C worker jobs; removals and verification
    are blocking bodies, run by the threads engine beside it (each holding one of the pool's
    I/O tokens), not a coroutine and two thread hand-offs per chunk on the native engine."""
    from asynctier.engines.native_engine import NativeEngine

    continued: list[Op] = []
    real = NativeEngine._continue

    def spy(self: NativeEngine, job: Any, body: Any) -> None:
        continued.append(job.op)
        real(self, job, body)

    monkeypatch.setattr(NativeEngine, "_continue", spy)
    tier, view = make_tier(tmp_path, memoryview(aligned_buffer(NCHUNKS * CHUNK)), io_engine="native", max_inflight=4)
    data = fill(view, 43)
    k = keys(6, "R")
    async with tier:
        assert (await tier.offload(k, list(range(6)))).ok
        assert (await tier.verify_chunks(k)).ok
        res = await tier.remove(k[:4])
        assert res.ok and sorted(res.succeeded) == sorted(k[:4])
        assert await tier.lookup(k) == [False] * 4 + [True] * 2
        assert (await tier.load(k[4:], [10, 11])).ok and chunk(view, 10) == data[4]
        assert tier.stats().removed == 4
    assert Op.REMOVE not in continued and Op.VERIFY not in continued


@pytest.mark.skipif(_NO_NATIVE is not None, reason=f"no native workers: {_NO_NATIVE}")
async def test_the_native_engines_pool_refills_only_once_the_tier_has_been_idle_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread making files takes the GIL from the event loop that the native workers leave
    alone (and from the application's threads); their pool is held while a call is in
    progress and for POOL_QUIET_S after the last one ends (the thread engine's is not held)."""
    monkeypatch.setattr("asynctier.tiers.fs.pool.POOL_HOLD_POLL_S", 0.01)
    monkeypatch.setattr("asynctier.tiers.fs.tier.POOL_QUIET_S", 3600.0)  # quiet for certain until lowered
    # 512 bytes past a page: no chunk can go O_DIRECT, so the call's writes never take the
    # pool's files (a bytearray may happen to be page-aligned)
    raw = aligned_buffer(NCHUNKS * CHUNK + 4096)
    tier, view = make_tier(tmp_path, raw[512 : 512 + NCHUNKS * CHUNK], max_inflight=8, io_engine="native",
                           tmpfile_pool=8)  # fmt: skip
    fill(view, 41)
    ks = keys(8, "H")
    async with tier:
        pool = tier.protocol.pool
        assert pool is not None and pool._hold is not None
        for _ in range(500):  # no call yet: it fills at open
            if pool.ready == 8:
                break
            await asyncio.sleep(0.01)
        assert pool.ready == 8 and not pool._hold()
        call = asyncio.ensure_future(tier.offload(ks, list(range(8))))
        await asyncio.sleep(0)  # the call is in progress
        assert pool._hold(), "not held during a call"
        assert (await call).ok
        assert pool._hold(), "not held right after a call"
        for _ in range(8):  # the call's writes took none of them (unaligned view)
            fd = pool.take()
            assert fd is not None
            os.close(fd)
        for _ in range(500):
            if pool._held:
                break
            await asyncio.sleep(0.01)
        for _ in range(20):  # it looks again every POOL_HOLD_POLL_S: still held
            await asyncio.sleep(0.01)
        assert pool._held and pool.ready == 0, "refilled while the tier was quiet for less than POOL_QUIET_S"
        monkeypatch.setattr("asynctier.tiers.fs.tier.POOL_QUIET_S", 0.0)  # now idle long enough
        assert not pool._hold()
        for _ in range(500):
            if pool.ready == 8:
                break
            await asyncio.sleep(0.01)
        assert pool.ready == 8, "did not refill once the tier had been idle for POOL_QUIET_S"
        tier._active += 1  # a call in progress, as the runtime counts them: held whatever the quiet
        assert pool._hold()
        tier._active -= 1
    threads, _ = make_tier(tmp_path, max_inflight=8, io_engine="threads", tmpfile_pool=8)
    async with threads:
        assert threads.protocol.pool is not None and threads.protocol.pool._hold is None


async def test_io_engine_choice_and_bad_config(tmp_path: Path, io_engine: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tier, view = make_tier(tmp_path, io_engine="threads")
    spec = tier.offloading_spec
    big = OffloadingSpec(1 << 20, 2, namespace="test/fs")
    default = SecondaryTierFactory.create_secondary_tier({"type": "fs", "root": str(tmp_path)}, view, spec)
    async with default:  # io_engine="auto": the native workers wherever they are built
        assert default.active_io_engine == ("native" if _NO_NATIVE is None else "threads")  # type: ignore[attr-defined]
    async with tier:
        assert tier.active_io_engine == "threads"
    if _NO_NATIVE is None:  # at any depth, publication and chunk size
        for config in ({"max_inflight": 1}, {"publish": "tmpfile"}, {"publish": "rename", "durability": "fsync"}):
            for engine in ("auto", "native"):
                tier, _ = make_tier(tmp_path, io_engine=engine, **config)
                async with tier:
                    assert tier.active_io_engine == "native"
        big_tier = SecondaryTierFactory.create_secondary_tier(
            {"type": "fs", "root": str(tmp_path)}, aligned_buffer(big.total_bytes), big
        )
        async with big_tier:
            assert big_tier.active_io_engine == "native"  # type: ignore[attr-defined]
    # where the extension is not built, "auto" takes threads at any depth and size; "native" says why not
    monkeypatch.setattr(nativeio, "_PROBLEM", "asynctier/engines/_nativeio was not built")
    for depth in (1, 4, 16):
        tier, _ = make_tier(tmp_path, io_engine="auto", max_inflight=depth)
        async with tier:
            assert tier.active_io_engine == "threads"
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "fs", "root": str(tmp_path), "max_inflight": 16}, aligned_buffer(big.total_bytes), big
    )
    async with tier:
        assert tier.active_io_engine == "threads"  # type: ignore[attr-defined]
    tier, _ = make_tier(tmp_path, io_engine="native")
    with pytest.raises(TierConfigError, match=r"io_engine='native' but native I/O workers are unavailable.*not built"):
        await tier.open()
    monkeypatch.undo()
    accepted = "'auto', 'threads', 'native'"
    with pytest.raises(TierConfigError, match=f"io_engine must be one of {accepted}; got 'aio'"):
        make_tier(tmp_path, io_engine="aio")
    with pytest.raises(TierConfigError, match=f"io_engine='io_uring' was retired.*accepted: {accepted}"):
        make_tier(tmp_path, io_engine="io_uring")
    with pytest.raises(TierConfigError, match="io_engine must be a str"):
        make_tier(tmp_path, io_engine=None)
    with pytest.warns(DeprecationWarning, match="io_engine='psync' is deprecated"):
        tier, _ = make_tier(tmp_path, io_engine="psync")
    assert tier.io_engine == "threads"


async def test_fsync_durability_and_rename_leave_no_temporaries(tmp_path: Path) -> None:
    tier, view = make_tier(tmp_path, durability="fsync", publish="rename")
    data = fill(view, 12)
    async with tier:
        assert (await tier.offload(keys(8), list(range(8)))).ok
        assert not list(tier.dir.glob("??/.tmp*"))
        assert (await tier.load(keys(8), list(range(8, 16)))).ok
        assert [chunk(view, 8 + i) for i in range(8)] == data[:8]


# -- faults of the file system -----------------------------------------------------------------
@pytest.mark.skipif(nativeio.problem() is not None, reason=f"no native workers: {nativeio.problem()}")
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
async def test_a_store_group_on_a_full_file_system_fails_each_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aligned: bool
) -> None:
    """A call of 8 new files as one group job on the native engine, on a file system full of
    someone else's data with nothing of ours to evict: every chunk fails with ENOSPC, none
    is reported stored or left behind; once the space is back, the same call stores them.
    (An aligned buffer's group is packed in bulk, an unaligned one's chunk by chunk.)"""
    spy = GroupSpy(monkeypatch)
    per = HEADER_BLOCK + CHUNK
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", f"size={24 * per}", "tmpfs") as mnt:
        view = aligned_buffer(CHUNK * NCHUNKS) if aligned else None
        tier, view = make_tier(mnt, view, io_engine="native", max_inflight=1)
        data = fill(view, 14)
        k = keys(8, "g")
        async with tier:
            ballast = mnt / "ballast"
            fill_up(ballast, per)
            res = await tier.offload(k, list(range(8)))
            assert spy.sizes == [8]
            assert not res.succeeded and set(res.failed) == set(k)
            assert all(getattr(e, "errno", None) == errno.ENOSPC for e in res.failed.values()), res.failed
            assert await tier.lookup(k) == [False] * 8 and not chunk_files(tier)
            ballast.unlink()
            assert (await tier.offload(k, list(range(8)))).ok
            assert (await tier.load(k, list(range(8, 16)))).ok
            assert [chunk(view, 8 + i) for i in range(8)] == data[:8]


async def test_full_filesystem_evicts_instead_of_failing(tmp_path: Path, io_engine: str) -> None:
    per = HEADER_BLOCK + CHUNK
    with mounted(tmp_path / "small", "-t", "tmpfs", "-o", f"size={24 * per}", "tmpfs") as mnt:
        tier, view = make_tier(mnt)  # no capacity_bytes: only the disk bounds it
        data = fill(view, 13)
        k = keys(80)
        async with tier:
            for i in range(0, 80, 8):  # 80 chunks into room for ~23
                res = await tier.offload(k[i : i + 8], list(range(8)))
                assert res.ok, {key: repr(e) for key, e in res.failed.items()}
            s = tier.stats()
            assert s.extra["enospc_evictions"] > 0 and s.evictions > 0
            # on the native engine, ENOSPC goes to the blocking path, which evicts and retries
            assert (s.extra.get("native_retries", 0) > 0) == (io_engine == "native")
            res = await tier.load(k[-8:], list(range(8, 16)))  # the newest survived
            assert res.ok and [chunk(view, 8 + i) for i in range(8)] == data[:8]

            # full of someone else's data, nothing of ours left to evict: that key fails, ENOSPC
            assert (await tier.remove(await tier.stored_keys())).ok
            ballast = mnt / "ballast"
            fill_up(ballast, per)
            res = await tier.offload([b"nospace"], [0])
            assert isinstance(res.failed[b"nospace"], OSError)
            assert res.failed[b"nospace"].errno == errno.ENOSPC  # type: ignore[attr-defined]
            assert failure_kind(res.failed[b"nospace"]) == "io"
            assert await tier.lookup([b"nospace"]) == [False]
            ballast.unlink()  # the fault clears: the same tier works again
            assert (await tier.offload([b"nospace"], [0])).ok
            assert (await tier.load([b"nospace"], [1])).ok and chunk(view, 1) == data[0]


@pytest.mark.parametrize("pool", [None, 4])
async def test_read_only_mount_fails_stores_serves_loads_recovers(tmp_path: Path, pool: int | None) -> None:
    src = tmp_path / "src"
    tier, view = make_tier(src)
    data = fill(view, 14)
    async with tier:
        assert (await tier.offload(keys(4), [0, 1, 2, 3])).ok
    with mounted(tmp_path / "ro", "--bind", str(src)) as mnt:
        r = sh("mount", "-o", "remount,ro,bind", str(mnt))
        if r.returncode != 0:
            pytest.skip(f"cannot remount read-only: {r.stderr.strip()}")
        tier, view = make_tier(mnt, tmpfile_pool=pool)  # a pool's thread cannot make files either
        fill(view, 14)
        async with tier:
            res = await tier.offload([b"new"], [5])
            assert failure_kind(res.failed[b"new"]) == "io"
            assert res.failed[b"new"].errno == errno.EROFS  # type: ignore[attr-defined]
            view[: 4 * CHUNK] = bytes(4 * CHUNK)
            res = await tier.load(keys(4), [0, 1, 2, 3])
            assert res.ok and [chunk(view, i) for i in range(4)] == data[:4]
            assert (await tier.remove(keys(1))).failed  # cannot delete either
            assert sh("mount", "-o", "remount,rw,bind", str(mnt)).returncode == 0
            assert (await tier.offload([b"new"], [5])).ok  # fault cleared, same tier
            assert (await tier.load([b"new"], [6])).ok and chunk(view, 6) == data[5]


def physical_start(path: Path) -> int:
    """Byte offset on the device of the first data block of ``path`` (filefrag -v)."""
    out = sh("filefrag", "-v", str(path)).stdout
    unit = int(re.search(r"blocks of (\d+) bytes", out).group(1))  # type: ignore[union-attr]
    starts = [int(m.group(1)) for m in re.finditer(r"^\s*\d+:\s+\d+\.\.\s*\d+:\s+(\d+)\.\.", out, re.M)]
    return min(starts) * unit


def cut_image(img: Path, cut: int) -> bytes:
    """Cut ``img`` short at ``cut``; return what was cut off."""
    with open(img, "r+b") as f:
        f.seek(cut)
        tail = f.read()
        f.truncate(cut)
    return tail


def restore_image(img: Path, cut: int, tail: bytes) -> None:
    with open(img, "r+b") as f:
        f.seek(cut)
        f.write(tail)


@contextlib.contextmanager
def loop_ext4(tmp_path: Path, size: int) -> Iterator[tuple[Path, Path]]:
    """An ext4 file system on a direct-I/O loop device over a sparse image: (image, mount point).

    Reading device blocks past the end of the image fails with EIO (the loop driver's short
    read), which is how a test makes real I/O errors without device-mapper.
    """
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("losetup", "mkfs.ext4", "filefrag")):
        pytest.skip("needs root, losetup, mkfs.ext4 and filefrag")
    img = tmp_path / "disk.img"
    with open(img, "wb") as f:
        f.truncate(size)
    r = sh("losetup", "--direct-io=on", "-f", "--show", str(img))
    if r.returncode != 0:
        pytest.skip(f"no loop device: {r.stderr.strip()}")
    dev = r.stdout.strip()
    try:
        if sh("mkfs.ext4", "-q", "-F", dev).returncode != 0:
            pytest.skip("mkfs.ext4 failed")
        with mounted(tmp_path / "mnt", dev) as mnt:
            yield img, mnt
    finally:
        sh("losetup", "-d", dev)


async def test_eio_fails_only_those_keys_and_clears(tmp_path: Path, io_engine: str) -> None:
    """Real EIO: chunk blocks cut off the end of a loop device's image; restored, they load again."""
    with loop_ext4(tmp_path, 64 << 20) as (img, mnt):
        tier, view = make_tier(mnt)
        data = fill(view, 15)
        k = keys(8)
        async with tier:
            assert (await tier.offload(k, list(range(8)))).ok
            await asyncio.to_thread(os.sync)
            files = [chunk_file(tier, key) for key in k]
            cut = max(physical_start(f) for f in files)  # the chunk stored last on the device
            victim = k[max(range(8), key=lambda i: physical_start(files[i]))]
            tail = cut_image(img, cut)
            drop_page_cache([str(f) for f in files])
            res = await tier.load(k, list(range(8, 16)))
            assert set(res.failed) == {victim}, {key: repr(e) for key, e in res.failed.items()}
            exc = res.failed[victim]
            assert isinstance(exc, OSError) and exc.errno == errno.EIO, repr(exc)
            assert failure_kind(exc) == "io" and tier.stats().failures["io"] == 1
            if io_engine == "native":  # the failed job was retried on a thread, which reported it
                assert tier.stats().extra["native_retries"] == 1
            assert await tier.lookup([victim]) == [True], "an I/O error is not proof the chunk is bad"
            restore_image(img, cut, tail)  # the fault clears
            drop_page_cache([str(f) for f in files])
            res = await tier.load(k, list(range(8, 16)))
            assert res.ok, res.failed
            assert [chunk(view, 8 + i) for i in range(8)] == data[:8]
            assert (await tier.offload([b"after"], [0])).ok


def test_permission_denied_directory(tmp_path: Path) -> None:
    """EACCES for real: root without CAP_DAC_OVERRIDE obeys mode bits, so a 0555 directory refuses it."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to drop CAP_DAC_OVERRIDE")
    root = tmp_path / "kv"
    code = f"""
        import asyncio, json, os, random
        from pathlib import Path
        from asynctier import OffloadingSpec, SecondaryTierFactory
        from asynctier.errors import failure_kind

        async def main():
            spec = OffloadingSpec({CHUNK}, {NCHUNKS}, namespace="test/fs")
            buf = bytearray(random.Random(1).randbytes(spec.total_bytes))
            make = lambda: SecondaryTierFactory.create_secondary_tier(
                {{"type": "fs", "root": {str(root)!r}}}, memoryview(buf), spec)
            out = {{}}
            async with make() as tier:
                assert (await tier.offload([b"a", b"b"], [0, 1])).ok
                dirs = [tier.dir, *tier.dir.glob("??")]
            for d in dirs:
                os.chmod(d, 0o555)
            async with make() as tier:
                res = await tier.offload([b"c"], [2])
                e = res.failed[b"c"]
                out["store"] = [type(e).__name__, getattr(e, "errno", None), failure_kind(e)]
                out["load_ok"] = (await tier.load([b"a", b"b"], [5, 6])).ok
                out["same"] = buf[5 * spec.chunk_bytes : 6 * spec.chunk_bytes] == buf[: spec.chunk_bytes]
                for d in dirs:
                    os.chmod(d, 0o755)  # the fault clears
                out["after"] = (await tier.offload([b"c"], [2])).ok
            print(json.dumps(out))

        asyncio.run(main())
    """
    out = run_python(code, "setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--")
    assert out == {"store": ["PermissionError", errno.EACCES, "io"], "load_ok": True, "same": True, "after": True}


# -- access times -----------------------------------------------------------------------------
def _reset_atime(p: Path) -> int:
    """atime = mtime: relatime updates it on the next read that does not ask O_NOATIME."""
    m = p.stat().st_mtime_ns
    os.utime(p, ns=(m, m))
    return m


@pytest.mark.usefixtures("atime_updates")
async def test_loads_leave_access_times_alone(tmp_path: Path, io_engine: str) -> None:
    """A load opens with O_NOATIME: the inode is not dirtied (recency lives in mtime)."""
    tier, view = make_tier(tmp_path, max_inflight=4, lru_times=False)
    data = fill(view, 21)
    async with tier:
        assert (await tier.offload(keys(3), [0, 1, 2])).ok
        files = sorted(tier.dir.glob("??/*"))
        assert len(files) == 3
        stamps = {p: _reset_atime(p) for p in files}
        drop_page_cache([str(p) for p in files])
        res = await tier.load(keys(3), [8, 9, 10])
        assert res.ok, res.failed
        assert [chunk(view, 8 + i) for i in range(3)] == data[:3]
        assert {p: p.stat().st_atime_ns for p in files} == stamps
        assert "noatime_refused" not in tier.stats().extra


def test_loads_of_another_users_files_go_on_without_noatime(tmp_path: Path, io_engine: str) -> None:
    """O_NOATIME is the owner's (or CAP_FOWNER's) to ask: a process that may not gets EPERM,
    drops the flag once, counts it, and every load still succeeds. A file its mode bits deny
    (EACCES) fails its load and leaves the flag alone."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root (chown) and setpriv to drop CAP_FOWNER")
    root = tmp_path / "kv"
    code = f"""
        import asyncio, json, os, random
        from asynctier import OffloadingSpec, SecondaryTierFactory

        async def main():
            spec = OffloadingSpec({CHUNK}, {NCHUNKS}, namespace="test/fs")
            buf = bytearray(random.Random(2).randbytes(spec.total_bytes))
            conf = {{"type": "fs", "root": {str(root)!r}, "io_engine": {io_engine!r}, "max_inflight": 4,
                     "file_mode": 0o644, "dir_mode": 0o755}}  # shared with another user on purpose
            out = {{}}
            async with SecondaryTierFactory.create_secondary_tier(conf, memoryview(buf), spec) as tier:
                keys = [b"k%d" % i for i in range(4)]
                if os.environ.get("STEP") == "store":
                    out["ok"] = (await tier.offload(keys, [0, 1, 2, 3])).ok
                elif os.environ.get("STEP") == "denied":
                    e = (await tier.load(keys[:1], [4])).failed[keys[0]]
                    out["error"] = [type(e).__name__, getattr(e, "errno", None)]
                    out["refused"] = tier.stats().extra.get("noatime_refused", 0)
                else:
                    buf[4 * spec.chunk_bytes : 8 * spec.chunk_bytes] = bytes(4 * spec.chunk_bytes)
                    out["ok"] = (await tier.load(keys, [4, 5, 6, 7])).ok
                    out["same"] = buf[: 4 * spec.chunk_bytes] == buf[4 * spec.chunk_bytes : 8 * spec.chunk_bytes]
                    out["refused"] = tier.stats().extra.get("noatime_refused", 0)
            print(json.dumps(out))

        asyncio.run(main())
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STEP", "store")
        assert run_python(code) == {"ok": True}
    files = sorted(root.glob("v1-*/??/*"))
    assert len(files) == 4
    for p in files:
        os.chown(p, 65534, 65534)  # another user's files, readable by all (0644)
    no_caps = ("setpriv", "--bounding-set", "-fowner,-dac_override,-dac_read_search", "--")
    assert run_python(code, *no_caps) == {"ok": True, "same": True, "refused": 1}
    for p in files:
        os.chmod(p, 0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STEP", "denied")
        out = run_python(code, *no_caps)
    assert out == {"error": ["PermissionError", errno.EACCES], "refused": 0}


# -- sharing -----------------------------------------------------------------------------------
async def test_second_process_same_root_no_torn_reads(tmp_path: Path) -> None:
    """Another process stores and removes the same keys over and over while this one loads them:
    every load is the exact chunk or not found, never a mix; its new keys are found (shared=True)."""
    root = tmp_path / "kv"
    code = f"""
        import asyncio, json, random
        from asynctier import OffloadingSpec, SecondaryTierFactory

        async def main():
            spec = OffloadingSpec({CHUNK}, {NCHUNKS}, namespace="test/fs")
            buf = bytearray(spec.total_bytes)
            rnd = random.Random(77)
            for i in range({NCHUNKS}):
                buf[i * {CHUNK} : (i + 1) * {CHUNK}] = rnd.randbytes({CHUNK})
            tier = SecondaryTierFactory.create_secondary_tier(
                {{"type": "fs", "root": {str(root)!r}, "max_inflight": 4}}, memoryview(buf), spec)
            hot = [f"hot-{{i}}".encode() for i in range(8)]
            async with tier:
                for rnd_ in range(60):
                    assert (await tier.offload(hot, list(range(8)))).ok
                    assert (await tier.remove(hot)).ok
                assert (await tier.offload([b"theirs-1", b"theirs-2"], [8, 9])).ok
                assert (await tier.offload(hot, list(range(8)))).ok
            print(json.dumps({{"ok": True}}))

        asyncio.run(main())
    """
    tier, view = make_tier(root, shared=True, max_inflight=4)
    rnd = random.Random(77)
    expect = [rnd.randbytes(CHUNK) for _ in range(NCHUNKS)]
    hot = [f"hot-{i}".encode() for i in range(8)]
    async with tier:
        other = asyncio.ensure_future(asyncio.to_thread(run_python, code))
        ok = torn = 0
        while not other.done():
            res = await tier.load(hot, list(range(8)))
            for i, key in enumerate(hot):
                if key in res.succeeded:
                    ok += 1
                    torn += chunk(view, i) != expect[i]
                else:
                    assert failure_kind(res.failed[key]) == "not_found", repr(res.failed[key])
        assert (await other) == {"ok": True}
        assert torn == 0
        assert await tier.lookup([b"theirs-1", b"theirs-2", b"nobody"]) == [True, True, False]
        res = await tier.load([b"theirs-1", b"theirs-2", *hot], list(range(10)))
        assert res.ok, res.failed
        assert [chunk(view, i) for i in range(10)] == [expect[8], expect[9], *expect[:8]]
        # the same keys stored here too: one copy, nothing torn
        fill(view, 77 + 1000)
        view[: 8 * CHUNK] = b"".join(expect[:8])
        assert (await tier.offload(hot, list(range(8)))).ok
        assert len(chunk_files(tier)) == 10


async def test_dropped_without_aclose_releases_directory_descriptors(tmp_path: Path) -> None:
    """Its directories' descriptors, and the native engine's eventfd (registered with the
    event loop, it must not stay for the life of the process)."""
    import gc

    ring_kinds = ("anon_inode:[eventfd]",)

    def targets() -> list[str]:
        out = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                out.append(os.readlink(f"/proc/self/fd/{fd}"))
            except OSError:
                pass
        return out

    rings_before = sum(t in ring_kinds for t in targets())

    def open_fds() -> int:
        """Descriptors of this process that point into this test's directory, or eventfds new since."""
        ts = targets()
        return sum(t.startswith(str(tmp_path)) for t in ts) + sum(t in ring_kinds for t in ts) - rings_before

    tier, view = make_tier(tmp_path)
    await tier.open()
    fill(view, 5)
    assert (await tier.offload([b"a", b"b"], [0, 1])).ok
    assert open_fds() >= 256
    del tier
    # the worker thread that ran open() may hold its work item (and so the tier) for a
    # moment after the result is delivered; wait for that, not for a fixed time
    for _ in range(500):
        gc.collect()
        if open_fds() == 0:
            break
        await asyncio.sleep(0.01)
    assert open_fds() == 0


# -- recycling evicted files ----------------------------------------------------------------
def spares(tier: FsTier) -> list[Path]:
    return list(tier.dir.glob("??/.tmp~*"))


async def test_evicted_files_are_recycled_in_place(tmp_path: Path, io_engine: str) -> None:
    """At capacity each store overwrites the file of the chunk it evicts and renames it into
    place: the same inodes carry the new chunks, loads are exact (also after a restart), and
    nothing is left under a temporary name."""
    per = HEADER_BLOCK + CHUNK
    aligned = aligned_buffer(CHUNK * NCHUNKS)  # O_DIRECT where the file system has it
    tier, view = make_tier(tmp_path, aligned, capacity_bytes=4 * per, max_inflight=4)
    data = fill(view, 31)
    async with tier:
        assert (await tier.offload(keys(4, "a"), [0, 1, 2, 3])).ok
        inodes = {p.stat().st_ino for p in chunk_files(tier)}
        assert (await tier.offload(keys(4, "b"), [4, 5, 6, 7])).ok
        st = tier.stats()
        assert st.extra.get("recycled") == 4 and st.evictions == 4, st.extra
        assert "direct_io_fallbacks" not in st.extra
        assert {p.stat().st_ino for p in chunk_files(tier)} == inodes
        assert sorted(p.name for p in chunk_files(tier)) == sorted(key_token(k) for k in keys(4, "b"))
        assert spares(tier) == []
        assert await tier.lookup(keys(4, "a") + keys(4, "b")) == [False] * 4 + [True] * 4
        res = await tier.load(keys(4, "b"), [8, 9, 10, 11])
        assert res.ok and [chunk(view, 8 + i) for i in range(4)] == data[4:8]
    again, view2 = make_tier(tmp_path, capacity_bytes=4 * per)
    async with again:
        res = await again.load(keys(4, "b"), [0, 1, 2, 3])
        assert res.ok and [chunk(view2, i) for i in range(4)] == data[4:8]


async def test_a_victim_whose_file_vanished_is_evicted_once(tmp_path: Path, io_engine: str) -> None:
    """A victim's file deleted behind the tier's back cannot be recycled: the store writes a
    new file, the eviction is counted once, and nothing is left under a temporary name."""
    per = HEADER_BLOCK + CHUNK
    tier, view = make_tier(tmp_path, capacity_bytes=2 * per, max_inflight=2)
    data = fill(view, 33)
    async with tier:
        assert (await tier.offload(keys(2, "a"), [0, 1])).ok
        for p in chunk_files(tier):
            p.unlink()
        assert (await tier.offload(keys(2, "b"), [2, 3])).ok
        st = tier.stats()
        assert st.evictions == 2 and "recycled" not in st.extra, (st.evictions, st.extra)
        assert spares(tier) == []
        res = await tier.load(keys(2, "b"), [4, 5])
        assert res.ok and [chunk(view, 4 + i) for i in range(2)] == data[2:4]


async def test_on_a_network_file_system_the_recycle_check_stays_off_the_loop(
    tmp_path: Path, io_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check that no other tier holds the namespace queries a lock; on NFS or Lustre that
    is a round trip to the server, so there it runs on a thread, never on the event loop."""
    import asynctier.tiers.fs.tier as fs_mod

    monkeypatch.setattr(fs_mod, "network_fs", lambda path: "nfs")  # what statfs would say there
    loop_thread = threading.get_ident()
    where: list[int] = []
    real_alone = FsTier._alone

    def alone(self: FsTier) -> bool:
        where.append(threading.get_ident())
        return real_alone(self)

    monkeypatch.setattr(FsTier, "_alone", alone)
    per = HEADER_BLOCK + CHUNK
    tier, view = make_tier(tmp_path, aligned_buffer(CHUNK * NCHUNKS), capacity_bytes=4 * per, max_inflight=4)
    data = fill(view, 33)
    async with tier:
        assert tier.network_fs == "nfs"
        assert (await tier.offload(keys(4, "a"), [0, 1, 2, 3])).ok
        assert (await tier.offload(keys(4, "b"), [4, 5, 6, 7])).ok
        assert tier.stats().extra.get("recycled") == 4
        assert len(where) == 4 and loop_thread not in where
        res = await tier.load(keys(4, "b"), [8, 9, 10, 11])
        assert res.ok and [chunk(view, 8 + i) for i in range(4)] == data[4:8]


@pytest.mark.skipif(_NO_NATIVE is not None, reason=f"no native workers: {_NO_NATIVE}")
async def test_a_recycle_check_cancelled_on_its_thread_leaves_no_stray_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a network file system the native engine asks on a thread whether an evicted file
    may be recycled, with that file already open under a temporary name. A store cancelled
    there (a job body is shielded from its caller; this cancels it directly) closes and
    removes the file before the cancellation goes on."""
    import asynctier.tiers.fs.tier as fs_mod

    monkeypatch.setattr(fs_mod, "network_fs", lambda path: "nfs")
    entered, release = threading.Event(), threading.Event()
    real_alone = FsTier._alone

    def slow_alone(self: FsTier) -> bool:
        entered.set()
        release.wait(10)
        return real_alone(self)

    per = HEADER_BLOCK + CHUNK
    tier, view = make_tier(
        tmp_path,
        aligned_buffer(CHUNK * NCHUNKS),
        capacity_bytes=per,
        max_inflight=8,
        io_engine="native",
        tmpfile_pool=0,  # no pool refilling meanwhile: every new descriptor would be a leak
    )
    fill(view, 37)
    async with tier:
        assert (await tier.offload([b"victim"], [0])).ok
        victims = tier.index.reserve(b"new", per)  # what a store at capacity does first
        assert victims == [b"victim"]
        monkeypatch.setattr(FsTier, "_alone", slow_alone)
        native = tier._native
        assert native is not None
        fds_before = set(os.listdir("/proc/self/fd"))
        task = asyncio.ensure_future(native.store(b"new", 1, victims))
        assert await asyncio.to_thread(entered.wait, 10)
        task.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        tier.index.removed(victims)
        tier.index.abort(b"new")
        assert [p.name for p in tier.dir.glob("??/*")] == []  # the victim's file, renamed away, is gone
        assert not set(os.listdir("/proc/self/fd")) - fds_before  # and its descriptor closed
        assert tier.stats().evictions == 1
        monkeypatch.setattr(FsTier, "_alone", real_alone)
        assert (await tier.offload(keys(1), [1])).ok


async def test_no_recycling_while_another_tier_has_the_namespace_open(tmp_path: Path, io_engine: str) -> None:
    """Another tier on the same root (here in this process) might be reading an evicted file:
    while it is open, evicted files are deleted, not overwritten; once it closes, recycled."""
    per = HEADER_BLOCK + CHUNK
    tier, view = make_tier(tmp_path, capacity_bytes=4 * per, max_inflight=4)
    data = fill(view, 32)
    other, _ = make_tier(tmp_path, io_engine="threads")
    async with tier:
        assert (await tier.offload(keys(4, "a"), [0, 1, 2, 3])).ok
        async with other:
            before = {p.stat().st_ino for p in chunk_files(tier)}
            held = [os.open(p, os.O_RDONLY) for p in chunk_files(tier)]  # as a reader would
            try:
                assert (await tier.offload(keys(4, "b"), [4, 5, 6, 7])).ok
                st = tier.stats()
                assert "recycled" not in st.extra and st.extra.get("recycle_refused") == 4, st.extra
                assert spares(tier) == []
                got = [os.pread(fd, CHUNK, HEADER_BLOCK) for fd in held]
                assert sorted(got) == sorted(data[:4])  # the evicted files were left whole
            finally:
                for fd in held:
                    os.close(fd)
            assert not before & {p.stat().st_ino for p in chunk_files(tier)}
        assert (await tier.offload(keys(4, "c"), [0, 1, 2, 3])).ok
        assert tier.stats().extra.get("recycled") == 4
        res = await tier.load(keys(4, "c"), [8, 9, 10, 11])
        assert res.ok and [chunk(view, 8 + i) for i in range(4)] == data[:4]


async def test_no_recycling_while_another_process_has_the_namespace_open(tmp_path: Path) -> None:
    """The same across processes: a second process with the root open (its tier holds the
    namespace's lock) stops this one from overwriting the files it evicts."""
    per = HEADER_BLOCK + CHUNK
    root = tmp_path / "kv"
    code = f"""
        import asyncio, sys
        from asynctier import OffloadingSpec, SecondaryTierFactory

        async def main():
            spec = OffloadingSpec({CHUNK}, {NCHUNKS}, namespace="test/fs")
            tier = SecondaryTierFactory.create_secondary_tier(
                {{"type": "fs", "root": {str(root)!r}}}, memoryview(bytearray(spec.total_bytes)), spec)
            async with tier:
                print("open", flush=True)
                await asyncio.to_thread(sys.stdin.read)  # until the test closes our stdin

        asyncio.run(main())
    """
    tier, view = make_tier(root, capacity_bytes=2 * per, max_inflight=2)
    data = fill(view, 33)
    async with tier:
        assert (await tier.offload(keys(2, "a"), [0, 1])).ok
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            textwrap.dedent(code),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            cwd=REPO,
        )
        assert child.stdin is not None and child.stdout is not None
        try:
            assert (await asyncio.wait_for(child.stdout.readline(), 30)).strip() == b"open"
            assert (await tier.offload(keys(2, "b"), [2, 3])).ok
            st = tier.stats()
            assert "recycled" not in st.extra and st.extra.get("recycle_refused") == 2, st.extra
        finally:
            child.stdin.close()
            assert await asyncio.wait_for(child.wait(), 30) == 0
        assert (await tier.offload(keys(2, "c"), [4, 5])).ok
        assert tier.stats().extra.get("recycled") == 2
        res = await tier.load(keys(2, "c"), [6, 7])
        assert res.ok and [chunk(view, 6), chunk(view, 7)] == data[4:6]


async def test_recycle_config(tmp_path: Path) -> None:
    """``recycle``: "auto" needs verify=True (a crash mid-overwrite leaves a file only the
    checksum can tell from a good one); True recycles regardless; False never; bad values say
    what is accepted."""
    per = HEADER_BLOCK + CHUNK
    for i, (conf, expect) in enumerate(
        [({}, 2), ({"verify": False}, 0), ({"verify": False, "recycle": True}, 2), ({"recycle": False}, 0)]
    ):
        tier, view = make_tier(tmp_path / str(i), capacity_bytes=2 * per, **conf)
        fill(view, 34)
        async with tier:
            assert (await tier.offload(keys(2, "a"), [0, 1])).ok
            assert (await tier.offload(keys(2, "b"), [2, 3])).ok
            assert tier.stats().extra.get("recycled", 0) == expect, conf
            assert len(chunk_files(tier)) == 2 and spares(tier) == []
    with pytest.raises(TierConfigError, match=r"recycle must be 'auto', True or False; got 'yes'"):
        make_tier(tmp_path, recycle="yes")


# -- eviction, removal and stores of the same key, racing ----------------------------------
def hold_victim_deletion(
    tier: FsTier, io_engine: str, victim: bytes, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Event, threading.Event]:
    """Stop the store that evicts ``victim`` after the index let go of it and before its file
    goes (unlink, or rename to be recycled); returns (stopped there, let it go on)."""
    stopped, go_on = threading.Event(), threading.Event()
    if io_engine == "threads":
        note_gone = tier._note_gone  # called on the worker thread just before the unlink or rename

        def held(key: bytes) -> None:
            if key == victim and not stopped.is_set():
                stopped.set()
                go_on.wait(30)
            note_gone(key)

        monkeypatch.setattr(tier, "_note_gone", held)
    else:
        # the native jobs unlink or rename the victims
        async_write = NativeIO.store

        async def held_write(self: NativeIO, key: bytes, cid: int, victims: list[bytes]) -> None:
            if victim in victims and not stopped.is_set():
                stopped.set()
                await asyncio.to_thread(go_on.wait, 30)
            await async_write(self, key, cid, victims)

        monkeypatch.setattr(NativeIO, "store", held_write)
        stores_as_coroutines(monkeypatch)
    return stopped, go_on


def stores_as_coroutines(monkeypatch: pytest.MonkeyPatch) -> None:
    """The native engine's stores off its fast path (planned on the loop thread), onto the
    coroutine path (NativeIO.store) where a test can hold one."""

    def plan(self: StorePath, job: Any, slot: int) -> Any:
        io = self._io()
        assert io is not None
        if job.grouped:  # (each chunk's coroutine in turn)
            return partial(io.live_tier().group_body(Op.STORE), *job.args)
        return partial(io.store_job, *job.args)

    monkeypatch.setattr(StorePath, "plan", plan)


def disk_matches_index(tier: FsTier) -> None:
    assert sorted(p.name for p in chunk_files(tier)) == sorted(key_token(k) for k in tier.index)
    assert spares(tier) == []


@pytest.mark.parametrize("recycle", [True, False], ids=["recycle", "unlink"])
async def test_a_key_stored_again_while_its_old_copy_is_evicted_stays_loadable(
    tmp_path: Path, io_engine: str, recycle: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server re-offloads a chunk that lookup() just called gone, while the store that
    evicted it has not deleted its file yet. The re-store waits for that deletion, so it
    does not publish a copy that the eviction then takes away (found reported stored and
    lost: offload ok, lookup True, load not found)."""
    per = HEADER_BLOCK + CHUNK
    tier, view = make_tier(tmp_path, capacity_bytes=2 * per, max_inflight=4, recycle=recycle)
    data = fill(view, 41)
    victim = b"victim"
    stopped, go_on = hold_victim_deletion(tier, io_engine, victim, monkeypatch)
    async with tier:
        assert (await tier.offload([victim], [0])).ok
        assert (await tier.offload([b"other"], [1])).ok
        evicting = asyncio.ensure_future(tier.offload([b"newer"], [2]))  # evicts the victim (LRU)
        assert await asyncio.to_thread(stopped.wait, 30)
        assert await tier.lookup([victim]) == [False]
        again = asyncio.ensure_future(tier.offload([victim], [0]))
        await asyncio.wait([again], timeout=0.3)  # without the wait it was published by now
        go_on.set()
        assert (await evicting).ok and (await again).ok
        assert await tier.lookup([victim, b"other", b"newer"]) == [True, False, True]
        res = await tier.load([victim, b"newer"], [3, 4])
        assert res.ok, res.failed
        assert chunk(view, 3) == data[0] and chunk(view, 4) == data[2]
        disk_matches_index(tier)


@pytest.mark.parametrize("recycle", [True, False], ids=["recycle", "unlink"])
async def test_racing_stores_at_capacity_never_report_a_chunk_that_is_gone(
    tmp_path: Path, io_engine: str, recycle: bool
) -> None:
    """Many concurrent offloads of a few keys into a small tier, each key's bytes its own:
    after every round each key lookup() reports loads, with its own bytes, and the disk holds
    exactly the indexed files; a store finding no room (everything is being written or read)
    fails with CapacityError. (Before evictions waited for writers of the same key, a store
    of a key stored twice at once recycled the second copy under another key's name, and an
    eviction could unlink a copy stored again meanwhile: 4% of rounds lost a chunk.)"""
    small = 16 * 1024
    spec = OffloadingSpec(small, 16, namespace="test/fs-race")
    view = aligned_buffer(spec.total_bytes)
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "fs", "root": str(tmp_path), "io_engine": io_engine, "max_inflight": 16, "recycle": recycle,
         "capacity_bytes": 6 * (HEADER_BLOCK + small)}, view, spec)  # fmt: skip
    assert isinstance(tier, FsTier)
    names = [b"key-%d" % i for i in range(12)]
    content = {k: (k * small)[:small] for k in names}
    rnd = random.Random(7)
    async with tier:
        for _ in range(150):
            calls = []
            for j in range(8):
                pair = rnd.sample(names, 2)
                for i, k in enumerate(pair):
                    view[(2 * j + i) * small : (2 * j + i + 1) * small] = content[k]
                calls.append(tier.offload(pair, [2 * j, 2 * j + 1]))
            for r in await asyncio.gather(*calls):
                # 16 writes in flight into room for 6: at times all six are being written or read
                assert all(isinstance(e, CapacityError) for e in r.failed.values()), r.failed
            stored = [k for k, hit in zip(names, await tier.lookup(names)) if hit]
            res = await tier.load(stored, list(range(len(stored))))
            assert res.ok, {k: repr(e) for k, e in res.failed.items()}
            for i, k in enumerate(stored):
                assert bytes(view[i * small : (i + 1) * small]) == content[k], k
        disk_matches_index(tier)


async def test_a_remove_while_the_same_key_is_stored_leaves_disk_and_index_agreeing(
    tmp_path: Path, io_engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """remove(K) while offload(K) is writing: the write wins (as if the removal came first),
    and no file is left on disk that the index does not count (beyond capacity)."""
    per = HEADER_BLOCK + CHUNK
    tier, view = make_tier(tmp_path, capacity_bytes=4 * per, max_inflight=4)
    data = fill(view, 43)
    writing, go_on = threading.Event(), threading.Event()
    if io_engine == "threads":
        real_store = tier.threads.store

        def held(key: bytes, data: memoryview, spare: Any = None) -> None:
            if key == b"K":
                writing.set()
                go_on.wait(30)
            real_store(key, data, spare)

        monkeypatch.setattr(tier.threads, "store", held)
    else:
        async_write = NativeIO.store

        async def held_write(self: NativeIO, key: bytes, cid: int, victims: list[bytes]) -> None:
            if key == b"K":
                writing.set()
                await asyncio.to_thread(go_on.wait, 30)
            await async_write(self, key, cid, victims)

        monkeypatch.setattr(NativeIO, "store", held_write)
        stores_as_coroutines(monkeypatch)
    async with tier:
        store = asyncio.ensure_future(tier.offload([b"K"], [0]))
        assert await asyncio.to_thread(writing.wait, 30)
        assert (await tier.remove([b"K"])).ok
        go_on.set()
        assert (await store).ok
        assert await tier.lookup([b"K"]) == [True]
        assert (await tier.load([b"K"], [5])).ok and chunk(view, 5) == data[0]
        assert (await tier.offload(keys(4), [1, 2, 3, 4])).ok  # fills up: K is evicted, as it counted
        disk_matches_index(tier)
        assert len(chunk_files(tier)) == 4
        assert (await tier.remove([b"k-0"])).ok and await tier.lookup([b"k-0"]) == [False]
        disk_matches_index(tier)


async def test_a_cancelled_open_leaves_no_descriptors_or_threads_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """open() cancelled while the medium is being set up on its thread: the setup runs to its
    end and is undone before the cancellation reaches the caller (shard descriptors, the
    namespace lock, the pool's thread and files); a later open() starts clean."""

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    def tier_threads() -> list[str]:
        return [t.name for t in threading.enumerate() if t.name.startswith("asynctier-fs")]

    tier, _ = make_tier(tmp_path)
    started, go_on = threading.Event(), threading.Event()
    open_medium = tier.open_medium

    def held() -> None:
        started.set()
        go_on.wait(30)
        open_medium()

    monkeypatch.setattr(tier, "open_medium", held)
    before, threads_before = open_fds(), tier_threads()
    opening = asyncio.ensure_future(tier.open())
    assert await asyncio.to_thread(started.wait, 30)
    opening.cancel()
    await asyncio.sleep(0.05)
    assert not opening.done()  # the cancellation waits for the setup, which still runs
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await opening
    assert not tier.is_open
    assert open_fds() == before
    assert tier_threads() == threads_before
    async with tier:  # the same tier opens cleanly after all
        assert (await tier.offload([b"a"], [0])).ok and tier._alone()
    assert open_fds() == before
