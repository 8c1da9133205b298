"""Group jobs of the native workers (``nativeio.GROUP``): several files read, or written and
recycled, in one slot, each as if alone, spread over the workers, reported once; and the fs tier's loads
that run as such jobs when a call has at least twice as many chunks as its share of
``max_inflight``, and its stores into a full tier (each then recycles a victim's file)."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
from pathlib import Path
from typing import Any

import pytest
from fs_helpers import chunk_file, damage_file
from native_helpers import GroupSpy

from asynctier import ChunkNotFoundError, IntegrityError, OffloadingSpec, SecondaryTierFactory
from asynctier.core import Op
from asynctier.engines import native as nativeio
from asynctier.integrity import checksum
from asynctier.posix_io import aligned_buffer
from asynctier.tiers.fs import HEADER_BLOCK, FsTier
from asynctier.tiers.fs.native import GROUP_CHUNKS, NativeIO

native_only = pytest.mark.skipif(nativeio.problem() is not None, reason=f"no native workers: {nativeio.problem()}")

HB = 64
N = 4096


Buf = ctypes.Array[ctypes.c_char]


def _read(dfd: int, name: bytes, hb: Buf, buf: Buf) -> nativeio.JobFields:
    return nativeio.fields(nativeio.READ, 0, dfd, name, flags=os.O_RDONLY, hb=ctypes.addressof(hb), hb_len=HB,
                           buf=ctypes.addressof(buf), n=N, hashed=True)  # fmt: skip


def _write(dfd: int, name: bytes, hb: Buf, buf: Buf) -> nativeio.JobFields:
    return nativeio.fields(nativeio.WRITE, 0, dfd, name, flags=os.O_WRONLY, hb=ctypes.addressof(hb), hb_len=HB,
                           buf=ctypes.addressof(buf), n=N)  # fmt: skip


@native_only
async def test_a_group_reads_each_file_as_if_alone_and_reports_each_outcome(tmp_path: Path) -> None:
    """Reads (hashed) in one group, one of a missing file and one of a short file: each
    outcome is its own; a failure does not stop the reads after it."""
    (tmp_path / "one").write_bytes(b"h" * HB + b"1" * N)
    (tmp_path / "two").write_bytes(b"h" * HB + b"2" * 100)  # short: read ends at EOF
    (tmp_path / "three").write_bytes(b"h" * HB + b"3" * N)
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=2, bound=1, slots=2)
    pool.attach()
    hbs = [ctypes.create_string_buffer(HB) for _ in range(4)]
    bufs = [ctypes.create_string_buffer(N) for _ in range(4)]
    names = [b"one", b"missing", b"two", b"three"]
    subs = [_read(dfd, name, hbs[i], bufs[i]) for i, name in enumerate(names)]
    try:
        res = await pool.run(1, nativeio.Job(-1, 0, *pool.group(1, 0, subs)))
        assert (res.result, res.stage) == (4, 0)
        out = pool.group_outcomes(1, 4)
        assert out[0] == (HB + N, checksum(b"1" * N), 0, 0)
        assert out[1][0] == -errno.ENOENT and out[1][2] == nativeio.ST_OPEN
        assert out[2][0] == HB + 100 and out[2][1] == 0 and out[2][2] == 0  # short: not hashed
        assert out[3] == (HB + N, checksum(b"3" * N), 0, 0)
        assert bufs[0].raw == b"1" * N and bufs[3].raw == b"3" * N
        assert pool.counts()[:2] == (0, 1)  # (one token: its jobs one at a time)
    finally:
        await pool.aclose()
        os.close(dfd)


@native_only
async def test_at_depth_one_each_reads_checksum_lands_in_its_own_outcome(tmp_path: Path) -> None:
    """With one token, a worker leaves a group read's checksum to another worker and goes on
    to the next read: two full groups and two lone reads, all at once, each file's checksum
    in its own outcome (the list of reads to hash mixes the groups' jobs and lone slots),
    each group reported once."""
    n = nativeio.GROUP_MAX
    for i in range(2 * n + 2):
        (tmp_path / f"f{i}").write_bytes(b"h" * HB + bytes([i]) * N)
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=2, bound=1, slots=4)
    pool.attach()
    hbs = [ctypes.create_string_buffer(HB) for _ in range(2 * n + 2)]
    bufs = [ctypes.create_string_buffer(N) for _ in range(2 * n + 2)]
    reads = [_read(dfd, f"f{i}".encode(), hbs[i], bufs[i]) for i in range(2 * n + 2)]
    try:
        runs = [
            pool.run(0, nativeio.Job(-1, 0, *pool.group(0, 0, reads[:n]))),
            pool.run(1, nativeio.Job(-1, 0, *reads[n])),
            pool.run(2, nativeio.Job(-1, 0, *pool.group(2, 0, reads[n + 1 : 2 * n + 1]))),
            pool.run(3, nativeio.Job(-1, 0, *reads[2 * n + 1])),
        ]
        first, lone, second, last = await asyncio.gather(*runs)
        assert (first.result, second.result) == (n, n)
        for res, i in ((lone, n), (last, 2 * n + 1)):
            assert (res.result, res.csum, res.stage) == (HB + N, checksum(bytes([i]) * N), 0)
        outcomes = pool.group_outcomes(0, n) + pool.group_outcomes(2, n)
        files = list(range(n)) + list(range(n + 1, 2 * n + 1))
        assert outcomes == [(HB + N, checksum(bytes([i]) * N), 0, 0) for i in files]
        assert all(bufs[i].raw == bytes([i]) * N for i in range(2 * n + 2))
        assert pool.counts()[:2] == (0, 1)
    finally:
        await pool.aclose()
        os.close(dfd)


async def _reader_of(fifo: Path, within: float = 60.0) -> int:
    """A write end of ``fifo`` once it has a reader (never blocking the loop)."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:  # ENXIO: no reader yet
            if e.errno != errno.ENXIO or asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(0.005)


@native_only
async def test_a_groups_jobs_run_on_several_workers_at_once(tmp_path: Path) -> None:
    """A group's jobs are spread over the workers, each holding a token of its own: its second
    read opens its FIFO while its first still waits in ``open`` for a writer, which the test
    gives it only after that. Each then ends as a read of a file that is not regular does
    (``ENXIO``), in its own outcome; the group reports once and held both tokens at once."""
    fifos = [tmp_path / "first", tmp_path / "second"]
    for f in fifos:
        os.mkfifo(f)
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=3, bound=2, slots=2)
    pool.attach()
    hbs = [ctypes.create_string_buffer(HB) for _ in range(2)]
    bufs = [ctypes.create_string_buffer(N) for _ in range(2)]
    subs = [_read(dfd, f.name.encode(), hbs[i], bufs[i]) for i, f in enumerate(fifos)]
    ran = asyncio.ensure_future(pool.run(1, nativeio.Job(-1, 0, *pool.group(1, 0, subs))))
    fed: list[int] = []
    try:
        for i in (1, 0):  # (one job at a time would wait for "first" for ever: no reader of "second")
            os.close(await _reader_of(fifos[i]))
            fed.append(i)
        res = await ran
        assert (res.result, res.stage) == (2, 0)
        assert pool.group_outcomes(1, 2) == [(-errno.ENXIO, 0, nativeio.ST_OPEN, 0)] * 2
        assert pool.counts()[:2] == (0, 2)  # a token each, at once
    finally:
        for i in {0, 1} - set(fed):  # (failing: let the jobs end, so that the pool can close)
            os.close(os.open(fifos[i], os.O_RDWR))
        await ran
        await pool.aclose()
        os.close(dfd)


def _recycle(dfd: int, name: bytes, victim: bytes, temp: bytes, lock_fd: int, hb: Buf, buf: Buf) -> nativeio.JobFields:
    f = nativeio.fields(nativeio.RECYCLE, 0, dfd, name, flags=os.O_WRONLY, fd=lock_fd, dfd2=dfd, name2=victim,
                        hb=ctypes.addressof(hb), hb_len=HB, buf=ctypes.addressof(buf), n=N, body_len=BODY)  # fmt: skip
    return (*f[:-1], temp)


BODY = 28  # a header body whose payload checksum sits at CSUM_OFFSET (20); its own follows it


def _sums(hb: bytes, payload: bytes) -> bool:
    """Whether a written header block carries the payload's checksum and its own."""
    return int.from_bytes(hb[20:28], "little") == checksum(payload) and int.from_bytes(
        hb[BODY : BODY + 8], "little"
    ) == checksum(hb[:BODY])


@native_only
async def test_a_group_writes_and_recycles_each_file_as_if_alone(tmp_path: Path) -> None:
    """A store group: a new file, a victim's file recycled under a new name, a recycle
    whose victim is gone and one more recycle. Each has its own outcome and its header's
    checksums filled in; the failed one stops nothing and leaves nothing behind."""
    (tmp_path / "victim1").write_bytes(b"old" * 100)
    (tmp_path / "victim3").write_bytes(b"older" * 100)
    (tmp_path / "lock").write_bytes(b"")
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    lock_fd = os.open(tmp_path / "lock", os.O_RDONLY)
    pool = nativeio.NativePool(threads=2, bound=1, slots=2)
    pool.attach()
    hbs = [ctypes.create_string_buffer(b"h" * HB, HB) for _ in range(4)]
    bufs = [ctypes.create_string_buffer(bytes([65 + i]) * N, N) for i in range(4)]
    w = nativeio.fields(nativeio.WRITE, 0, dfd, b"new0", flags=os.O_WRONLY, hb=ctypes.addressof(hbs[0]), hb_len=HB,
                        buf=ctypes.addressof(bufs[0]), n=N, body_len=BODY)  # fmt: skip
    subs = [w, _recycle(dfd, b"new1", b"victim1", b"t1", lock_fd, hbs[1], bufs[1]),
            _recycle(dfd, b"new2", b"victim2", b"t2", lock_fd, hbs[2], bufs[2]),
            _recycle(dfd, b"new3", b"victim3", b"t3", lock_fd, hbs[3], bufs[3])]  # fmt: skip
    try:
        res = await pool.run(1, nativeio.Job(-1, 0, *pool.group(1, 0, subs)))
        assert (res.result, res.stage) == (4, 0)
        out = pool.group_outcomes(1, 4)
        for i in (0, 1, 3):
            assert out[i] == (HB + N, checksum(bufs[i].raw), 0, 0), (i, out[i])
            got = (tmp_path / f"new{i}").read_bytes()
            assert got[HB:] == bufs[i].raw and _sums(got[:HB], bufs[i].raw), i
        assert out[2][0] == -errno.ENOENT and out[2][2] == nativeio.ST_OPEN
        assert sorted(os.listdir(tmp_path)) == ["lock", "new0", "new1", "new3"]
        assert pool.counts()[:2] == (0, 1)  # (one token: its jobs one at a time)
    finally:
        await pool.aclose()
        os.close(dfd)
        os.close(lock_fd)


@native_only
def test_a_group_out_of_bounds_is_refused() -> None:
    pool = nativeio.NativePool(threads=1, bound=1, slots=1)
    try:
        with pytest.raises(ValueError, match=f"1 to {nativeio.GROUP_MAX}"):
            pool.group(0, 0, [])
        with pytest.raises(ValueError, match=f"1 to {nativeio.GROUP_MAX}"):
            pool.group(0, 0, [nativeio.fields(nativeio.READ, 0, -1, b"x")] * (nativeio.GROUP_MAX + 1))
    finally:
        pool.abandon()


@native_only
def test_a_library_built_for_another_layout_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The library's tables are read and written with descriptors.py's layout: a library
    built with another GROUP_MAX or job size (left from another version) is refused with the
    reason and how to rebuild, and so is one that lacks a call this source makes."""
    from asynctier.engines import native_lib

    lib, _, why = native_lib.find_library()
    assert why is None and lib is not None and lib.at_group_max() == nativeio.GROUP_MAX
    monkeypatch.setattr(native_lib, "GROUP_MAX", nativeio.GROUP_MAX // 2)
    lib, gil_lib, why = native_lib.find_library()
    assert lib is None and gil_lib is None and why is not None
    assert f"groups of {nativeio.GROUP_MAX}" in why and "rebuild" in why
    monkeypatch.undo()
    sigs = native_lib._signatures()
    monkeypatch.setattr(native_lib, "_signatures", lambda: {**sigs, "at_not_there": ([], ctypes.c_int)})
    lib, _, why = native_lib.find_library()
    assert lib is None and why is not None and "another version" in why and "at_not_there" in why


@native_only
async def test_one_job_goes_alone_and_a_refused_group_gives_each_job_its_own_failure(tmp_path: Path) -> None:
    """``one_or_group``: a lone job is submitted as itself (its outcome is the job's own), more
    as a GROUP; ``group_outcomes`` of a group the pool refused is that failure for each job."""
    (tmp_path / "one").write_bytes(b"h" * HB + b"1" * N)
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=1, bound=1, slots=1)
    pool.attach()
    hb, buf = ctypes.create_string_buffer(HB), ctypes.create_string_buffer(N)
    read = _read(dfd, b"one", hb, buf)
    try:
        alone = pool.one_or_group(0, 0, [read])
        assert alone == read
        res = await pool.run(0, nativeio.Job(-1, 0, *alone))
        own = (res.result, res.csum, res.stage, res.info)
        assert pool.group_outcomes(0, 1, own) == [own] and own[:3] == (HB + N, checksum(b"1" * N), 0)
        assert pool.one_or_group(0, 0, [read, read])[0] == nativeio.GROUP
        refused = (-errno.ESHUTDOWN, 0, nativeio.ST_OPEN, 0)
        assert pool.group_outcomes(0, 3, refused) == [refused] * 3
    finally:
        await pool.aclose()
        os.close(dfd)


@native_only
async def test_the_workers_refuse_a_group_of_other_kinds(tmp_path: Path) -> None:
    """Reads, or writes and recycles, go in a group: a read beside a write, an unlink, a
    nested group are refused, nothing done."""
    (tmp_path / "x").write_bytes(b"kept")
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=1, bound=1, slots=1)
    pool.attach()
    hb, buf = ctypes.create_string_buffer(HB), ctypes.create_string_buffer(N)
    read, write = _read(dfd, b"x", hb, buf), _write(dfd, b"new", hb, buf)
    try:
        inner = pool.group(0, 0, [read])
        for subs in ([read, write], [write, read], [nativeio.fields(nativeio.UNLINK, 0, dfd, b"x")], [inner]):
            bad = pool.group(0, 0, subs)
            with pytest.raises(OSError, match="refused"):
                await pool.run(0, nativeio.Job(-1, 0, *bad))
        assert not (tmp_path / "new").exists() and (tmp_path / "x").read_bytes() == b"kept"
    finally:
        await pool.aclose()
        os.close(dfd)


# -- the fs tier's group jobs --------------------------------------------------------------

CHUNK = 64 * 1024


def fs_tier(
    root: Path, engine: str = "native", chunks: int = 16, chunk: int = CHUNK, aligned: bool = False, **config: Any
) -> tuple[FsTier, memoryview]:
    """``aligned``: a page-aligned view (the native loads' one-pass group plan needs one)."""
    spec = OffloadingSpec(chunk, chunks, namespace="test/groups")
    view = aligned_buffer(spec.total_bytes) if aligned else memoryview(bytearray(spec.total_bytes))
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "fs", "root": str(root), "io_engine": engine, **config}, view, spec
    )
    assert isinstance(tier, FsTier)
    return tier, view


@native_only
async def test_a_call_runs_as_group_jobs_of_up_to_group_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """40 chunks at max_inflight=2: stores and loads in two jobs of 20 files (evened out, each
    up to GROUP_CHUNKS; each store a new file), each chunk its own bytes (in the order asked),
    the stats counting each; 32 chunks go as one job, whatever the depth."""
    spy = GroupSpy(monkeypatch)
    tier, view = fs_tier(tmp_path, chunks=40, max_inflight=2)
    data = os.urandom(40 * CHUNK)
    view[:] = data
    keys = [b"key-%d" % i for i in range(40)]
    async with tier:
        assert GROUP_CHUNKS == nativeio.GROUP_MAX == 32
        assert [tier.group_size(op, n) for op in (Op.LOAD, Op.STORE) for n in (2, 32, 33, 40)] == [2, 32, 17, 20] * 2
        assert (await tier.offload(keys, list(range(40)))).ok
        assert spy.sizes == [20, 20]
        spy.sizes.clear()
        view[:] = bytes(len(view))
        res = await tier.load(keys[::-1], list(range(40)))
        assert res.ok and res.bytes_transferred == 40 * CHUNK
        assert spy.sizes == [20, 20]
        for i, k in enumerate(keys[::-1]):
            j = keys.index(k)
            assert bytes(view[i * CHUNK : (i + 1) * CHUNK]) == data[j * CHUNK : (j + 1) * CHUNK]
        s = tier.stats()
        assert (s.offloaded, s.loaded, s.stored_chunks) == (40, 40, 40)


@native_only
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
async def test_each_chunk_of_a_group_fails_or_succeeds_on_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aligned: bool
) -> None:
    """In one group job: a key never stored, a file removed behind the tier's back and a
    damaged file fail their own chunks (the damaged copy dropped, on the slow path); the
    others load."""
    spy = GroupSpy(monkeypatch)
    tier, view = fs_tier(tmp_path, max_inflight=1, aligned=aligned)
    view[:] = os.urandom(len(view))
    expect = bytes(view)
    keys = [b"k%d" % i for i in range(6)]
    async with tier:
        assert (await tier.offload(keys, list(range(6)))).ok
        assert spy.sizes == [6]  # the store too: one job for the call
        spy.sizes.clear()
        chunk_file(tier, b"k1").unlink()
        damage_file(chunk_file(tier, b"k3"), "flip")
        view[:] = bytes(len(view))
        asked = [*keys, b"never"]
        res = await tier.load(asked, list(range(7)))
        assert spy.sizes == [6]  # one job for the call (max_inflight=1); "never" fails as planned
        assert set(res.succeeded) == {b"k0", b"k2", b"k4", b"k5"}
        assert isinstance(res.failed[b"k1"], ChunkNotFoundError)
        assert isinstance(res.failed[b"never"], ChunkNotFoundError)
        assert isinstance(res.failed[b"k3"], IntegrityError)
        for i in (0, 2, 4, 5):
            assert bytes(view[i * CHUNK : (i + 1) * CHUNK]) == expect[i * CHUNK : (i + 1) * CHUNK]
        assert b"k3" not in tier.index and not chunk_file(tier, b"k3").exists()


@native_only
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
async def test_a_cancelled_call_of_group_jobs_waits_for_those_running(tmp_path: Path, aligned: bool) -> None:
    """Cancelled while its group jobs run: jobs not started are withdrawn, those running end
    before the cancellation comes back (nothing stays pinned); afterwards every chunk loads its
    own bytes and the tier closes."""
    tier, view = fs_tier(tmp_path, chunks=128, max_inflight=1, aligned=aligned)
    view[:] = os.urandom(len(view))
    expect = bytes(view)
    keys = [b"c%d" % i for i in range(128)]
    async with tier:
        assert (await tier.offload(keys, list(range(128)))).ok
        assert tier.group_size(Op.LOAD, 128) == 32  # four jobs
        view[:] = bytes(len(view))
        task = asyncio.ensure_future(tier.load(keys, list(range(128))))
        await asyncio.sleep(0)  # it submits its jobs and waits for them
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert tier.stats().in_flight == 0  # nothing runs on the buffer any more
        assert tier.index is not None and all(e.pins == 0 for e in tier.index._entries.values())
        view[:] = bytes(len(view))
        assert (await tier.load(keys, list(range(128)))).ok
        assert bytes(view) == expect


@native_only
async def test_group_sizes(tmp_path: Path) -> None:
    """A load: jobs of up to GROUP_CHUNKS chunks, evened out, whatever the depth, the chunk
    size and the calls in progress (the pool spreads a job's files over its workers); stores
    the same where each chunk makes a new file or recycles its victim's, not where a call
    would evict without recycling; other operations and the threads engine: one chunk a job."""
    tier, _ = fs_tier(tmp_path, max_inflight=4)
    threads, _ = fs_tier(tmp_path / "t", "threads", max_inflight=4)
    big, _ = fs_tier(tmp_path / "b", max_inflight=4, chunk=512 * 1024)
    bounded, _ = fs_tier(tmp_path / "c", max_inflight=4, capacity_bytes=2 * PER)
    unrecycled, _ = fs_tier(tmp_path / "u", max_inflight=4, capacity_bytes=64 * PER, recycle=False)
    assert GROUP_CHUNKS <= nativeio.GROUP_MAX  # a group the fs tier plans always fits the pool's
    async with tier, threads, big, bounded, unrecycled:
        assert [tier.group_size(Op.LOAD, n) for n in (1, 2, 7, 32, 33, 40, 80)] == [1, 2, 7, 32, 17, 20, 27]
        assert tier.group_size(Op.STORE, 64) == GROUP_CHUNKS  # no capacity: every chunk a new file
        assert tier.group_size(Op.REMOVE, 64) == 1
        assert bounded.group_size(Op.STORE, 64) == GROUP_CHUNKS  # room left: new files
        assert (await bounded.offload([b"a", b"b"], [0, 1])).ok
        assert bounded.group_size(Op.STORE, 64) == GROUP_CHUNKS  # full: each chunk recycles
        assert unrecycled.group_size(Op.STORE, 64) == GROUP_CHUNKS  # it fits: new files
        assert unrecycled.group_size(Op.STORE, 65) == 1  # it would evict, deleting files first
        assert threads.group_size(Op.LOAD, 64) == 1
        tier._active = 3  # other calls in progress change nothing
        assert tier.group_size(Op.LOAD, 32) == 32
        assert big.group_size(Op.LOAD, 64) == GROUP_CHUNKS  # nor does a large chunk
        tier._active = 0  # (no call was in progress: the close waits for those)


PER = HEADER_BLOCK + CHUNK  # a chunk's bytes on disk


def full_tier(
    root: Path, n: int, max_inflight: int, aligned: bool = False
) -> tuple[FsTier, memoryview, bytes, list[bytes], list[bytes]]:
    """A tier with room for ``n`` chunks and a buffer of ``2 n`` random ones: the tier, the
    buffer, its bytes, ``n`` keys to fill it with (slots 0..n-1), ``n`` more for what follows.
    ``aligned``: a page-aligned buffer, whose full-tier store groups are planned in bulk."""
    tier, view = fs_tier(root, chunks=2 * n, max_inflight=max_inflight, aligned=aligned, capacity_bytes=n * PER)
    data = os.urandom(len(view))
    view[:] = data
    return tier, view, data, [b"old-%d" % i for i in range(n)], [b"new-%d" % i for i in range(n)]


@native_only
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
async def test_stores_that_fill_the_tier_run_as_group_jobs_each_recycling_a_victim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aligned: bool
) -> None:
    """Into a tier with room, stores go as group jobs of new files; once a call fills it, as
    group jobs whose every chunk takes a victim's file: each key then loads its own bytes,
    each eviction is counted once, and the disk holds the new chunks only."""
    spy = GroupSpy(monkeypatch)
    tier, view, data, old, new = full_tier(tmp_path, 16, max_inflight=2, aligned=aligned)
    async with tier:
        assert (await tier.offload(old, list(range(16)))).ok
        assert spy.sizes == [16] and tier.stats().evictions == 0  # it fitted: new files
        spy.sizes.clear()
        assert tier.group_size(Op.STORE, 16) == 16
        inodes = {chunk_file(tier, k).stat().st_ino for k in old}
        assert (await tier.offload(new, list(range(16, 32)))).ok
        assert spy.sizes == [16]
        s = tier.stats()
        assert (s.evictions, s.extra.get("recycled"), s.stored_chunks) == (16, 16, 16), s.extra
        assert {chunk_file(tier, k).stat().st_ino for k in new} == inodes  # the victims' files
        assert await tier.lookup(old) == [False] * 16
        view[:] = bytes(len(view))
        assert (await tier.load(new, list(range(16)))).ok
        assert bytes(view[: 16 * CHUNK]) == data[16 * CHUNK :]


@native_only
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
async def test_a_store_group_chunk_whose_victim_vanished_goes_on_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aligned: bool
) -> None:
    """A victim's file deleted behind the tier's back fails that chunk's recycle in the
    group; the chunk is stored on the slow path, the others recycled; all load back."""
    spy = GroupSpy(monkeypatch)
    tier, view, data, old, new = full_tier(tmp_path, 8, max_inflight=1, aligned=aligned)
    async with tier:
        assert (await tier.offload(old, list(range(8)))).ok
        spy.sizes.clear()
        chunk_file(tier, old[2]).unlink()  # the third store's victim (least recently used first)
        assert (await tier.offload(new, list(range(8, 16)))).ok
        assert spy.sizes == [8]
        s = tier.stats()
        assert s.evictions == 8 and s.extra.get("recycled") == 7 and s.stored_chunks == 8, s.extra
        view[:] = bytes(len(view))
        assert (await tier.load(new, list(range(8)))).ok
        assert bytes(view[: 8 * CHUNK]) == data[8 * CHUNK :]
        # the chunks' files and nothing else: no victim's, no temporary name left behind
        on_disk = sorted(p for p in tier.dir.glob("??/*") if p.is_file())
        assert on_disk == sorted(chunk_file(tier, k) for k in new)


@native_only
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
async def test_a_group_storing_its_own_victim_does_not_wait_behind_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, aligned: bool
) -> None:
    """A full tier, and a call that stores new keys and the oldest key again: a new key's
    store evicts the oldest, whose own store then waits for that deletion. With recycling
    refused (another tier holds the root), the step that reports the deletion over was queued
    behind the waiting one: every such call stalled for REMOVAL_WAIT_S (30 s)."""
    from asynctier.core import bookkeeping

    monkeypatch.setattr(bookkeeping, "REMOVAL_WAIT_S", 5.0)
    tier, view, data, old, new = full_tier(tmp_path, 8, max_inflight=4, aligned=aligned)
    other, _ = fs_tier(tmp_path)  # holds the namespace: recycling is refused
    async with tier, other:
        assert (await tier.offload(old, list(range(8)))).ok
        ks = [*new[:7], old[0]]
        with caplog.at_level("ERROR", logger="asynctier"):
            res = await tier.offload(ks, [*range(8, 15), 0])
        assert res.ok, res.failed
        assert not [r for r in caplog.records if "not reported over" in r.getMessage()], caplog.text
        assert tier.stats().extra.get("recycle_refused")
        view[:] = bytes(len(view))
        assert (await tier.load(ks, list(range(8)))).ok
        assert (
            bytes(view[: 7 * CHUNK]) == data[8 * CHUNK : 15 * CHUNK]
            and bytes(view[7 * CHUNK : 8 * CHUNK]) == data[:CHUNK]
        )


@native_only
@pytest.mark.parametrize("into", ["full", "full-aligned", "room", "room-aligned"])
async def test_a_cancelled_call_of_store_groups_leaves_each_key_whole_or_absent(tmp_path: Path, into: str) -> None:
    """Cancelled while its store groups run or wait (each chunk recycling a victim's file, or
    making a new one): the groups not started are withdrawn (the first too, when no worker had
    started it), the call comes back once none runs; every key it stored loads the bytes it
    had when the call began, the others are absent."""
    # "room": capacity for all 128 chunks, so each store makes a new file
    tier, view, data, old, new = full_tier(tmp_path, 128 if into.startswith("room") else 64, max_inflight=1,
                                           aligned=into.endswith("aligned"))  # fmt: skip
    old, new = old[:64], new[:64]
    async with tier:
        assert (await tier.offload(old, list(range(64)))).ok
        assert tier.group_size(Op.STORE, 64) == 32  # two groups
        task = asyncio.ensure_future(tier.offload(new, list(range(64, 128))))
        await asyncio.sleep(0)  # it plans its first group (32 chunks a turn) and waits for it
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert tier.stats().in_flight == 0
        view[64 * CHUNK : 128 * CHUNK] = bytes(64 * CHUNK)  # the caller reuses its slots at once
        stored = [k for k, hit in zip(new, await tier.lookup(new)) if hit]
        assert len(stored) < 64  # groups were withdrawn
        assert (tier.stats().evictions > 0) == (into.startswith("full") and bool(stored))
        res = await tier.load(stored, list(range(len(stored))))
        assert res.ok, res.failed
        for slot, k in enumerate(stored):
            i = 64 + new.index(k)
            assert bytes(view[slot * CHUNK : (slot + 1) * CHUNK]) == data[i * CHUNK : (i + 1) * CHUNK]
        # the victims of the stores withdrawn are still there (their files were never taken)
        kept = [k for k, hit in zip(old, await tier.lookup(old)) if hit]
        assert len(kept) == (64 - len(stored) if into.startswith("full") else 64)
        assert (await tier.load(kept, list(range(len(kept))))).ok
        for slot, k in enumerate(kept):
            i = old.index(k)
            assert bytes(view[slot * CHUNK : (slot + 1) * CHUNK]) == data[i * CHUNK : (i + 1) * CHUNK]


@native_only
async def test_a_group_body_run_as_a_coroutine_gives_each_chunks_outcome(tmp_path: Path) -> None:
    """The body a group job has where no fast path runs it (the contract's ``group_body``):
    each chunk loaded as a lone job would be, one outcome per chunk."""
    tier, view = fs_tier(tmp_path, max_inflight=2)
    view[:] = os.urandom(len(view))
    expect = bytes(view[: 2 * CHUNK])
    async with tier:
        assert (await tier.offload([b"a", b"b"], [0, 1])).ok
        view[:] = bytes(len(view))
        out = await tier.group_body(Op.LOAD)([b"a", b"missing", b"b"], [0, 5, 1], 0.0)
        assert out[0] is None and out[2] is None and isinstance(out[1], ChunkNotFoundError)
        assert bytes(view[: 2 * CHUNK]) == expect


@native_only
async def test_a_group_of_loads_books_each_chunk_as_a_load_alone_would(tmp_path: Path) -> None:
    """Loads checked and booked for a whole group at once: the keys loaded become the most
    recently used (the next stores evict the others), their files are stamped with their time
    of use at close (``lru_times``), and nothing stays pinned."""
    tier, view = fs_tier(tmp_path, max_inflight=1, aligned=True, capacity_bytes=16 * (HEADER_BLOCK + CHUNK))
    view[:] = os.urandom(len(view))
    keys = [b"k%d" % i for i in range(16)]
    async with tier:
        assert tier.stored_size() == HEADER_BLOCK + CHUNK and tier.lru_times
        assert (await tier.offload(keys, list(range(16)))).ok
        for k in keys:
            os.utime(chunk_file(tier, k), ns=(10**9, 10**9))
        assert tier.group_size(Op.LOAD, 8) == 8
        assert (await tier.load(keys[:8], list(range(8)))).ok
        new = [b"n%d" % i for i in range(8)]
        assert (await tier.offload(new, list(range(8)))).ok  # evicts the 8 least recently used
        assert await tier.lookup(keys) == [True] * 8 + [False] * 8
        assert tier.index is not None and tier.index.evict_over_capacity() == []
        assert all(e.pins == 0 for e in tier.index._entries.values())
    assert all(chunk_file(tier, k).stat().st_mtime_ns > 10**9 for k in keys[:8])
    assert [chunk_file(tier, k).stat().st_mtime_ns for k in new] != [10**9] * 8


@native_only
@pytest.mark.parametrize("config", [{"verify": False}, {"shared": True}], ids=["unverified", "shared"])
async def test_group_loads_without_the_header_compare_or_a_complete_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: dict[str, Any]
) -> None:
    """``verify=False`` (each header parsed field by field) and ``shared=True`` (an index that
    may miss another process's chunks: each chunk planned alone) still go as group jobs, and
    each chunk gets its own bytes or its own failure."""
    spy = GroupSpy(monkeypatch)
    tier, view = fs_tier(tmp_path, max_inflight=1, aligned=True, **config)
    view[:] = os.urandom(len(view))
    expect = bytes(view)
    keys = [b"k%d" % i for i in range(6)]
    async with tier:
        assert (await tier.offload(keys, list(range(6)))).ok
        spy.sizes.clear()
        chunk_file(tier, b"k2").unlink()
        view[:] = bytes(len(view))
        res = await tier.load([*keys, b"never"], list(range(7)))
        assert spy.sizes == ([6] if "verify" in config else [])  # shared: each chunk alone, on a thread
        assert set(res.succeeded) == {b"k0", b"k1", b"k3", b"k4", b"k5"}
        assert isinstance(res.failed[b"k2"], ChunkNotFoundError)
        assert isinstance(res.failed[b"never"], ChunkNotFoundError)
        for i in (0, 1, 3, 4, 5):
            assert bytes(view[i * CHUNK : (i + 1) * CHUNK]) == expect[i * CHUNK : (i + 1) * CHUNK]
        s = tier.stats()
        assert (s.loaded, s.failed) == (5, 2)


@native_only
async def test_a_group_that_cannot_be_planned_fails_each_chunk_and_leaves_no_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier, _ = fs_tier(tmp_path, max_inflight=1, aligned=True)
    keys = [b"k%d" % i for i in range(6)]
    async with tier:
        assert (await tier.offload(keys, list(range(6)))).ok
        real = NativeIO.pack_reads

        def pack_reads(*args: Any) -> Any:
            raise OSError(errno.EIO, "no descriptors today")

        monkeypatch.setattr(NativeIO, "pack_reads", pack_reads)
        res = await tier.load([*keys, b"never"], list(range(7)))
        assert not res.succeeded and set(res.failed) == {*keys, b"never"}
        assert all(isinstance(res.failed[k], OSError) and "no descriptors" in str(res.failed[k]) for k in keys)
        assert isinstance(res.failed[b"never"], ChunkNotFoundError)
        assert tier.index is not None and all(e.pins == 0 for e in tier.index._entries.values())
        monkeypatch.setattr(NativeIO, "pack_reads", real)
        assert (await tier.load(keys, list(range(6)))).ok
        assert await tier.lookup(keys) == [True] * 6


@native_only
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
async def test_a_new_file_whose_name_is_taken_fails_alone_in_its_group(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aligned: bool
) -> None:
    """In a group of new files (packed in bulk, or chunk by chunk), one whose name a file that
    is not its chunk holds already is checked alone on the slow path and refused
    (FileExistsError), that file left as it was; the others are stored, and no temporary
    name is left."""
    spy = GroupSpy(monkeypatch)
    tier, view = fs_tier(tmp_path, max_inflight=1, aligned=aligned)
    view[:] = data = os.urandom(len(view))
    keys = [b"k%d" % i for i in range(8)]
    async with tier:
        assert (await tier.offload(keys[:1], [0])).ok  # the shard directories exist
        stray = chunk_file(tier, b"k4")
        stray.parent.mkdir(exist_ok=True)
        stray.write_bytes(b"someone else's" * 100)
        spy.sizes.clear()
        res = await tier.offload(keys[1:], list(range(1, 8)))
        assert spy.sizes == [7]
        assert list(res.failed) == [b"k4"] and isinstance(res.failed[b"k4"], FileExistsError)
        assert stray.read_bytes() == b"someone else's" * 100
        ok = [k for k in keys if k != b"k4"]
        view[:] = bytes(len(view))
        assert (await tier.load(ok, list(range(7)))).ok
        assert bytes(view[: 7 * CHUNK]) == b"".join(data[int(k[1:]) * CHUNK : (int(k[1:]) + 1) * CHUNK] for k in ok)
        assert sorted(p for p in tier.dir.glob("??/*") if p.is_file()) == sorted(chunk_file(tier, k) for k in keys)


def test_a_groups_header_blocks_are_its_chunks_blocks_each_marked_in_use() -> None:
    """NativeIO._take_blocks gives what block() gives for chunks first.. of a group job and
    marks those blocks as holding a header (a later store there zeroes it): the blocks only
    group jobs use are marked from the start, a slot's own once a group job takes it."""
    io = NativeIO.__new__(NativeIO)
    slots = 5
    for slot in range(slots):
        for first in range(GROUP_CHUNKS):
            for m in range(GROUP_CHUNKS - first + 1):
                io._lay_out(slots)
                assert io._hb_used[:slots] == [0] * slots
                got = io._take_blocks(slot, first, m)
                assert got == [io.block(slot, i) for i in range(first, first + m)]
                assert len(set(got)) == m
                assert all(io._hb_used[b] == HEADER_BLOCK for b in got)
                assert [s for s in range(slots) if io._hb_used[s]] == ([slot] if first == 0 and m else [])
                assert all(used in (0, HEADER_BLOCK) for used in io._hb_used)
                assert io._hb_used[slots:] == [HEADER_BLOCK] * (slots * (GROUP_CHUNKS - 1))
