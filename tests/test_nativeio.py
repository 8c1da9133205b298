"""The native I/O workers (asynctier.nativeio): the pool's bound, queue and cancellation
against real blocking files (FIFOs), and the fs tier on them: files it writes are the
files the other engines write, byte for byte, with or without the workers hashing."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from asynctier import IntegrityError, OffloadingSpec, SecondaryTierFactory, TierConfigError, nativeio
from asynctier.integrity import checksum, key_token
from asynctier.tiers.fs import HEADER_BLOCK, FsTier, _shard_of

pytestmark = pytest.mark.skipif(nativeio.problem() is not None, reason=f"no native workers: {nativeio.problem()}")

CHUNK = 64 * 1024
HB = 64  # header block of the pool-level tests (any size: the pool does not parse it)


class Bufs:
    """A header block and a payload buffer per slot, at fixed addresses."""

    def __init__(self, slots: int, n: int) -> None:
        self.hb = [ctypes.create_string_buffer(HB) for _ in range(slots)]
        self.buf = [ctypes.create_string_buffer(n) for _ in range(slots)]
        self.n = n

    def read(self, pool: nativeio.NativePool, slot: int, dfd: int, name: str) -> Any:
        return pool.read(slot, 0, dfd, name.encode(), os.O_RDONLY, ctypes.addressof(self.hb[slot]), HB,
                         ctypes.addressof(self.buf[slot]), self.n, hashed=True)  # fmt: skip


async def wait_for(cond: Any, what: str) -> None:
    for _ in range(3000):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


def open_fifo(path: Path) -> threading.Thread:
    """Open ``path`` (a FIFO) for writing and close it: its reader's open() returns (and
    its preadv fails: a pipe has no offsets)."""

    def run() -> None:
        os.close(os.open(path, os.O_WRONLY))

    t = threading.Thread(target=run)
    t.start()
    return t


async def test_the_bound_queues_jobs_and_a_queued_job_is_taken_back_on_cancel(tmp_path: Path) -> None:
    """One token: a job stuck opening a FIFO holds it, the next jobs queue behind it; a
    cancelled queued job never runs; the stuck one runs on the caller's buffers to its end
    even when its caller is cancelled, and only then does the cancellation reach the caller."""
    n = 1000
    (tmp_path / "plain").write_bytes(b"h" * HB + b"p" * n)
    os.mkfifo(tmp_path / "fifo")
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=2, bound=1, slots=4)
    pool.attach(asyncio.get_running_loop())
    bufs = Bufs(4, n)
    try:
        stuck = asyncio.ensure_future(bufs.read(pool, 0, dfd, "fifo"))
        await wait_for(lambda: pool.counts()[0] == 1, "the FIFO job holds the token")
        queued = asyncio.ensure_future(bufs.read(pool, 1, dfd, "plain"))
        after = asyncio.ensure_future(bufs.read(pool, 2, dfd, "plain"))
        await wait_for(lambda: pool.counts()[2] == 2, "two jobs queued behind it")
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert pool.counts()[2] == 1  # taken back: it will never run
        stuck.cancel()
        await asyncio.sleep(0.05)
        assert not stuck.done(), "a cancelled caller must wait for the job writing its buffers"
        opener = open_fifo(tmp_path / "fifo")
        with pytest.raises(asyncio.CancelledError):
            await stuck
        await asyncio.to_thread(opener.join)
        res = await after
        assert (res.result, res.stage) == (HB + n, 0)
        assert res.csum == checksum(b"p" * n)
        assert bufs.buf[2].raw == b"p" * n and bufs.buf[1].raw == b"\0" * n  # slot 1 never read
        assert pool.counts() == (0, 1, 0)  # never more than one in flight
        # a slot whose job was taken back is free again
        res = await bufs.read(pool, 1, dfd, "plain")
        assert res.result == HB + n and bufs.buf[1].raw == b"p" * n
    finally:
        await pool.aclose()
        os.close(dfd)


async def test_failures_report_the_step_and_errno(tmp_path: Path) -> None:
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=1, bound=1, slots=2)
    pool.attach(asyncio.get_running_loop())
    bufs = Bufs(2, 100)
    try:
        res = await bufs.read(pool, 0, dfd, "missing")
        assert (res.result, res.stage) == (-errno.ENOENT, nativeio.ST_OPEN)
        (tmp_path / "dir").mkdir()
        res = await bufs.read(pool, 0, dfd, "dir")  # opens; reading a directory fails
        assert (res.result, res.stage) == (-errno.EISDIR, nativeio.ST_IO)
        hb, buf = ctypes.addressof(bufs.hb[1]), ctypes.addressof(bufs.buf[1])
        (tmp_path / "taken").write_bytes(b"first")
        res = await pool.write(1, 0, dfd, b"taken", os.O_WRONLY, -1, False, hb, HB, buf, 100, 0)
        assert (res.stage, res.info) == (0, 1)  # the name was taken: the first copy stays
        assert (tmp_path / "taken").read_bytes() == b"first"
        res = await pool.write(1, 0, dfd, b"new", os.O_WRONLY, -1, True, hb, HB, buf, 100, 0)
        assert (res.result, res.stage, res.info) == (HB + 100, 0, 0)
        assert (tmp_path / "new").stat().st_size == HB + 100
        with pytest.raises(OSError, match="refused"):  # a name too long for the job table
            await pool.write(1, 0, dfd, b"x" * 300, os.O_WRONLY, -1, False, hb, HB, buf, 100, 0)
    finally:
        await pool.aclose()
        os.close(dfd)
    with pytest.raises(RuntimeError, match="not running"):
        await bufs.read(pool, 0, dfd, "missing")


async def test_a_slow_path_waiting_for_a_token_gets_the_next_one(tmp_path: Path) -> None:
    """A worker that gives its token back must not take it again while a slow-path thread
    waits in hold(): with the queue kept full, each hold() gets a token after at most the
    jobs already running or picked (it once waited behind ~1200 jobs, seconds)."""
    n = 4096
    (tmp_path / "f").write_bytes(b"x" * (HB + n))
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=3, bound=1, slots=6)
    pool.attach(asyncio.get_running_loop())
    bufs = Bufs(6, n)
    jobs = 0
    stop = False

    async def keep_busy(slot: int) -> None:
        nonlocal jobs
        while not stop:
            assert (await bufs.read(pool, slot, dfd, "f")).stage == 0
            jobs += 1

    busy = [asyncio.ensure_future(keep_busy(s)) for s in range(6)]
    ahead: list[int] = []

    def slow_path() -> None:
        for _ in range(20):
            asked = jobs
            pool.hold(lambda asked=asked: ahead.append(jobs - asked))

    try:
        await wait_for(lambda: jobs > 50, "the queue is kept full")
        await asyncio.to_thread(slow_path)
    finally:
        stop = True
        await asyncio.gather(*busy)
        await pool.aclose()
        os.close(dfd)
    # the counter is the loop's, behind the workers by at most one job per slot (6), plus the
    # job running when hold() asked; without the fix: hundreds
    assert len(ahead) == 20 and max(ahead) <= 6 + 2, ahead


def _native_workers() -> dict[int, int]:
    """tid -> nice value of this process's native I/O workers (they name themselves)."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == "asynctier-nio":
                out[int(task.name)] = os.getpriority(os.PRIO_PROCESS, int(task.name))
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return out


async def test_workers_told_to_stop_end_once_the_queue_drains(tmp_path: Path) -> None:
    """at_shutdown (what a pool dropped without aclose does) with jobs queued behind a stuck
    one: every worker ends when the last job does, none stays parked."""
    os.mkfifo(tmp_path / "fifo")
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    threads_before = len(_native_workers())
    pool = nativeio.NativePool(threads=4, bound=1, slots=4)
    pool.attach(asyncio.get_running_loop())
    bufs = Bufs(4, 64)
    try:
        stuck = asyncio.ensure_future(bufs.read(pool, 0, dfd, "fifo"))
        await wait_for(lambda: pool.counts()[0] == 1, "the FIFO job holds the token")
        queued = [asyncio.ensure_future(pool.unlink(s, 0, dfd, b"absent%d" % s)) for s in (1, 2)]
        await wait_for(lambda: pool.counts()[2] == 2, "two jobs queued behind it")
        pool._lib.at_shutdown(pool._h)
        opener = open_fifo(tmp_path / "fifo")
        await asyncio.gather(stuck, *queued)
        await asyncio.to_thread(opener.join)
        await wait_for(lambda: len(_native_workers()) == threads_before, "every worker ended")
    finally:
        await pool.aclose()
        os.close(dfd)


def test_a_pool_that_cannot_start_says_why() -> None:
    with pytest.raises(OSError) as e:
        nativeio.NativePool(threads=0, bound=1, slots=1)
    assert e.value.errno == errno.EINVAL


async def test_a_cancelled_spare_job_leaves_no_descriptor_and_hands_back_its_outcome(tmp_path: Path) -> None:
    """A spare job (open the victim, rename it away) cancelled while running ends anyway;
    its caller's CancelledError carries the outcome (the open descriptor) to undo."""
    os.mkfifo(tmp_path / "victim")
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=2, bound=1, slots=2)
    pool.attach(asyncio.get_running_loop())
    try:
        job = asyncio.ensure_future(pool.spare(0, 0, dfd, b"victim", os.O_RDONLY, dfd, b"spare"))
        await wait_for(lambda: pool.counts()[0] == 1, "the worker is in openat")
        job.cancel()
        opener = open_fifo(tmp_path / "victim")
        with pytest.raises(asyncio.CancelledError) as e:
            await job
        await asyncio.to_thread(opener.join)
        done = getattr(e.value, nativeio.CANCELLED_OUTCOME)
        assert done.stage == 0 and done.result >= 0
        held, spare = os.fstat(done.result), (tmp_path / "spare").stat()
        assert (held.st_dev, held.st_ino) == (spare.st_dev, spare.st_ino)
        os.close(done.result)
        pool.put_slot(0)
    finally:
        await pool.aclose()
        os.close(dfd)


# -- the fs tier on native workers ----------------------------------------------------------
def chunk_file(tier: FsTier, key: bytes) -> Path:
    return tier.dir / f"{_shard_of(key):02x}" / key_token(key)


def make_tier(root: Path, engine: str, view: memoryview | None = None, **config: Any) -> tuple[FsTier, memoryview]:
    spec = OffloadingSpec(CHUNK, 8, namespace="test/native")
    if view is None:
        view = memoryview(bytearray(spec.total_bytes))
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "fs", "root": str(root), "io_engine": engine, **config}, view, spec
    )
    assert isinstance(tier, FsTier)
    return tier, view


@pytest.mark.parametrize("hashing", ["workers", "python"])
@pytest.mark.parametrize("durability", ["none", "fsync"])
async def test_files_are_those_of_the_threads_engine(
    tmp_path: Path, hashing: str, durability: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Native writes are byte for byte what the threads engine writes (the workers fill in
    both header checksums, or Python does where the pool has no xxh3), and each engine loads
    the other's files; a damaged payload fails its key either way."""
    if hashing == "python":
        monkeypatch.setattr(nativeio, "_XXH3", None)
    view = memoryview(bytearray(8 * CHUNK))
    for i in range(4):
        view[i * CHUNK : (i + 1) * CHUNK] = os.urandom(CHUNK)
    keys = [b"k%d" % i for i in range(4)]
    native, _ = make_tier(tmp_path / "n", "native", view, durability=durability)
    threads, _ = make_tier(tmp_path / "t", "threads", view, durability=durability)
    async with native, threads:
        assert native.active_io_engine == "native"
        assert native._nengine is not None and native._nengine.pool is not None
        assert native._nengine.pool.hashes is (hashing == "workers")
        assert (await native.offload(keys, [0, 1, 2, 3])).ok
        assert (await threads.offload(keys, [0, 1, 2, 3])).ok
        for k in keys:
            assert chunk_file(native, k).read_bytes() == chunk_file(threads, k).read_bytes()
        assert native.stats().extra.get("native_retries", 0) == 0
    # each loads the other's files (same root, same namespace)
    for engine, root in (("native", tmp_path / "t"), ("threads", tmp_path / "n")):
        tier, _ = make_tier(root, engine, view)
        async with tier:
            view[4 * CHUNK :] = b"\0" * (4 * CHUNK)
            assert (await tier.load(keys, [4, 5, 6, 7])).ok
            assert view[4 * CHUNK :] == view[: 4 * CHUNK]
    tier, _ = make_tier(tmp_path / "t", "native", view)
    raw = bytearray(chunk_file(tier, keys[1]).read_bytes())
    raw[HEADER_BLOCK + 99] ^= 1
    chunk_file(tier, keys[1]).write_bytes(bytes(raw))
    async with tier:
        res = await tier.load(keys, [4, 5, 6, 7])
        assert list(res.failed) == [keys[1]] and isinstance(res.failed[keys[1]], IntegrityError)


@pytest.mark.parametrize("nice", [0, 7])
async def test_workers_run_below_the_event_loop_by_worker_nice(tmp_path: Path, nice: int) -> None:
    """On a 2-core machine 18 busy workers took the loop's p99 lag to 12-17 ms during a
    256 KiB offload stream, 3.6-5.6 ms once they ran at nice 5-19 (bench/README.md)."""
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    before = set(_native_workers())
    tier, _ = make_tier(tmp_path, "native", max_inflight=3, worker_nice=nice)
    async with tier:
        workers = {t: n for t, n in _native_workers().items() if t not in before}
        assert len(workers) == 3 + min(3, os.cpu_count() or 1)
        assert set(workers.values()) == {min(19, mine + nice)}
        assert os.getpriority(os.PRIO_PROCESS, 0) == mine  # the loop's thread is left as it was
    for bad in (-1, 20, 2.5, True, "5"):
        with pytest.raises(TierConfigError, match="worker_nice must be an int from 0 to 19"):
            make_tier(tmp_path, "native", worker_nice=bad)


async def test_an_engine_cancelled_while_an_eviction_runs_leaves_no_file_nor_descriptor(tmp_path: Path) -> None:
    """At capacity a store first takes the victim's file (open, rename away: a native job).
    If the engine's worker is cancelled while that job runs (what ``asyncio.run`` does to the
    tasks of a tier never closed), the job still ends, and the file it took is closed and
    removed; the store fails, it is not reported stored. (A cancelled offload call does not
    cancel a running chunk: it waits for it.)"""
    tier, _ = make_tier(tmp_path, "native", capacity_bytes=HEADER_BLOCK + CHUNK, max_inflight=1, tmpfile_pool=0)
    async with tier:
        assert (await tier.offload([b"victim"], [0])).ok
        victim = chunk_file(tier, b"victim")
        victim.unlink()
        os.mkfifo(victim)  # the eviction's open (for writing) waits for a reader
        fds_before = set(os.listdir("/proc/self/fd"))
        store = asyncio.ensure_future(tier.offload([b"new"], [1]))
        engine = tier._nengine
        assert engine is not None and engine.pool is not None
        pool = engine.pool
        await wait_for(lambda: pool.counts()[0] == 1, "the eviction's open waits on the FIFO")
        for task in engine._tasks:
            task.cancel()
        await asyncio.sleep(0.05)
        assert not store.done(), "the job runs on: the store must wait for it"
        reader = threading.Thread(target=lambda: os.close(os.open(victim, os.O_RDONLY)))
        reader.start()
        res = await store
        await asyncio.to_thread(reader.join)
        assert list(res.failed) == [b"new"] and isinstance(res.failed[b"new"], ConnectionAbortedError)
        assert set(os.listdir("/proc/self/fd")) <= fds_before  # the spare's descriptor is closed
        assert list(tier.dir.glob("??/.tmp~*")) == []  # and the file it renamed away is gone
        assert not victim.exists() and not chunk_file(tier, b"new").exists()
        assert tier.stats().evictions == 1


async def test_unavailable_native_workers_say_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nativeio, "_PROBLEM", "asynctier/_nativeio was not built (no C compiler)")
    tier, _ = make_tier(tmp_path, "native")
    with pytest.raises(TierConfigError, match=r"io_engine='native'.*not built"):
        await tier.open()
    tier, _ = make_tier(tmp_path, "auto")  # auto never picks what is not there
    async with tier:
        assert tier.active_io_engine != "native"


async def test_a_failed_job_goes_to_the_slow_path_which_owns_errors(tmp_path: Path) -> None:
    """A job that fails past open (here: the chunk's name is a directory, EISDIR on read)
    is counted and handed to the blocking path: that key fails with the error the threads
    engine gives, the others load."""
    tier, view = make_tier(tmp_path, "native")
    view[: 2 * CHUNK] = os.urandom(2 * CHUNK)
    async with tier:
        assert (await tier.offload([b"a", b"b"], [0, 1])).ok
        path = chunk_file(tier, b"a")
        path.unlink()
        path.mkdir()
        res = await tier.load([b"a", b"b"], [2, 3])
        assert res.succeeded == [b"b"] and view[3 * CHUNK : 4 * CHUNK] == view[CHUNK : 2 * CHUNK]
        assert isinstance(res.failed[b"a"], OSError), repr(res.failed[b"a"])
        assert tier.stats().extra["native_retries"] == 1


@pytest.mark.parametrize("recycle", [True, False], ids=["recycle", "unlink"])
async def test_evictions_run_as_native_jobs(tmp_path: Path, recycle: bool) -> None:
    """Stores into a full tier evict as native jobs: the victim's file recycled (opened,
    renamed away, overwritten, renamed into place) or unlinked; no retry on a thread, and
    the disk holds exactly the chunks the index counts."""
    per = HEADER_BLOCK + CHUNK
    tier, view = make_tier(tmp_path, "native", capacity_bytes=4 * per, max_inflight=2, recycle=recycle)
    view[:] = os.urandom(8 * CHUNK)
    keys = [b"k%d" % i for i in range(8)]
    async with tier:
        for i in range(8):  # one at a time: each store past the fourth evicts the oldest
            assert (await tier.offload([keys[i]], [i])).ok
        extra = tier.stats().extra
        assert tier.stats().evictions == 4 and extra.get("native_retries", 0) == 0
        assert extra.get("recycled", 0) == (4 if recycle else 0)
        assert await tier.lookup(keys) == [False] * 4 + [True] * 4
        expect = bytes(view[4 * CHUNK :])
        view[4 * CHUNK :] = bytes(4 * CHUNK)
        assert (await tier.load(keys[4:], [4, 5, 6, 7])).ok
        assert view[4 * CHUNK :] == expect
        files = sorted(p.name for p in tier.dir.glob("??/*") if p.is_file())
        assert files == sorted(key_token(k) for k in keys[4:])


async def test_publish_by_rename_runs_as_native_jobs(tmp_path: Path) -> None:
    """publish="rename" (as where unnamed files cannot be made): each write creates a
    temporary file, fills it and renames it into place in one job; none is left behind."""
    tier, view = make_tier(tmp_path, "native", publish="rename", durability="fsync")
    view[: 4 * CHUNK] = os.urandom(4 * CHUNK)
    keys = [b"k%d" % i for i in range(4)]
    async with tier:
        assert (await tier.offload(keys, [0, 1, 2, 3])).ok
        assert tier.stats().extra.get("native_retries", 0) == 0
        assert sorted(p.name for p in tier.dir.glob("??/*")) == sorted(key_token(k) for k in keys)
        assert (await tier.load(keys, [4, 5, 6, 7])).ok
        assert view[4 * CHUNK :] == view[: 4 * CHUNK]
