"""The native I/O workers (asynctier.engines.native): the pool's bound, queue and cancellation
against real blocking files (FIFOs), its hash (the system xxHash library's), and the fs
tier on them: files it writes are the files the threads engine writes, byte for byte; where
the extension or the library is missing, "auto" takes threads and "native" says why."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest
from fs_helpers import chunk_file
from native_helpers import native_workers

from asynctier import IntegrityError, OffloadingSpec, SecondaryTierFactory, TierConfigError
from asynctier.core.ops import PRIO_STORE
from asynctier.engines import native as nativeio
from asynctier.integrity import checksum, key_token
from asynctier.tiers.fs import HEADER_BLOCK, FsTier

native_only = pytest.mark.skipif(nativeio.problem() is not None, reason=f"no native workers: {nativeio.problem()}")

CHUNK = 64 * 1024
HB = 64  # header block of the pool-level tests (any size: the pool does not parse it)


class Bufs:
    """A header block and a payload buffer per slot, at fixed addresses."""

    def __init__(self, slots: int, n: int) -> None:
        self.hb = [ctypes.create_string_buffer(HB) for _ in range(slots)]
        self.buf = [ctypes.create_string_buffer(n) for _ in range(slots)]
        self.n = n

    def read(self, pool: nativeio.NativePool, slot: int, dfd: int, name: str) -> Any:
        job = nativeio.job(nativeio.READ, 0, dfd, name.encode(), flags=os.O_RDONLY,
                           hb=ctypes.addressof(self.hb[slot]), hb_len=HB, buf=ctypes.addressof(self.buf[slot]),
                           n=self.n, hashed=True)  # fmt: skip
        return pool.run(slot, job)

    def write(self, pool: nativeio.NativePool, slot: int, dfd: int, name: bytes, sync: bool = False) -> Any:
        job = nativeio.job(nativeio.WRITE, 0, dfd, name, flags=os.O_WRONLY, sync=sync,
                           hb=ctypes.addressof(self.hb[slot]), hb_len=HB, buf=ctypes.addressof(self.buf[slot]),
                           n=self.n)  # fmt: skip
        return pool.run(slot, job)


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


@native_only
async def test_the_bound_queues_jobs_and_a_queued_job_is_taken_back_on_cancel(tmp_path: Path) -> None:
    """One token: a job stuck opening a FIFO holds it, the next jobs queue behind it; a
    cancelled queued job never runs; the stuck one runs on the caller's buffers to its end
    even when its caller is cancelled, and only then does the cancellation reach the caller."""
    n = 1000
    (tmp_path / "plain").write_bytes(b"h" * HB + b"p" * n)
    os.mkfifo(tmp_path / "fifo")
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=2, bound=1, slots=4)
    pool.attach()
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


@native_only
async def test_failures_report_the_step_and_errno(tmp_path: Path) -> None:
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=1, bound=1, slots=2)
    pool.attach()
    bufs = Bufs(2, 100)
    try:
        res = await bufs.read(pool, 0, dfd, "missing")
        assert (res.result, res.stage) == (-errno.ENOENT, nativeio.ST_OPEN)
        (tmp_path / "dir").mkdir()
        res = await bufs.read(pool, 0, dfd, "dir")  # opens; reading a directory fails
        assert (res.result, res.stage) == (-errno.EISDIR, nativeio.ST_IO)
        (tmp_path / "taken").write_bytes(b"first")
        res = await bufs.write(pool, 1, dfd, b"taken")
        assert (res.stage, res.info) == (0, 1)  # the name was taken: the first copy stays
        assert (tmp_path / "taken").read_bytes() == b"first"
        res = await bufs.write(pool, 1, dfd, b"new", sync=True)
        assert (res.result, res.stage, res.info) == (HB + 100, 0, 0)
        assert (tmp_path / "new").stat().st_size == HB + 100
        with pytest.raises(OSError, match="refused"):  # a name too long for the job descriptor
            await bufs.write(pool, 1, dfd, b"x" * 300)
        unterminated = nativeio.job(nativeio.UNLINK, 0, dfd, b"x")
        unterminated.name = b"y" * 256  # no room for its end: the workers refuse it, not overrun it
        with pytest.raises(OSError, match="submit refused"):
            await pool.run(1, unterminated)
        fd = os.open(tmp_path / "journal", os.O_RDWR | os.O_CREAT, 0o600)
        try:  # descriptors the workers refuse whatever their kind: a wake-up group out of range, ...
            for kind in (nativeio.UNLINK, nativeio.COMMIT):
                bad = nativeio.job(kind, 0, dfd, b"x", fd=fd)
                bad.group = pool.slots
                with pytest.raises(OSError, match="submit refused"):
                    await pool.run(1, bad)
            many = nativeio.job(nativeio.COMMIT, 0, -1, b"", fd=fd)  # ... a commit of too many descriptors
            many.hb, many.hb_len = ctypes.addressof(bufs.hb[0]), nativeio.COMMIT_FDS_MAX + 1
            with pytest.raises(OSError, match="submit refused"):
                await pool.run(1, many)
            assert os.fstat(fd).st_size == 0
            for kind in (nativeio.WRITE, nativeio.RECYCLE):  # ... a header too short for its checksum,
                # which the worker writes at CSUM_OFFSET: it would land past the header block
                hb, buf = ctypes.addressof(bufs.hb[1]), ctypes.addressof(bufs.buf[1])
                short = nativeio.job(kind, 0, dfd, b"short", name2=b"v", flags=os.O_WRONLY, n=8, body_len=1,
                                     hb=hb, hb_len=9, buf=buf)  # fmt: skip
                short.name3 = b"t"
                with pytest.raises(OSError, match="submit refused"):
                    await pool.run(1, short)
            assert not (tmp_path / "short").exists()
        finally:
            os.close(fd)
    finally:
        await pool.aclose()
        os.close(dfd)
    with pytest.raises(RuntimeError, match="not running"):
        await bufs.read(pool, 0, dfd, "missing")


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as e:
        assert e.errno == errno.EBADF
        return False
    return True


@native_only
async def test_a_write_of_a_file_handed_over_closes_it_whatever_happened(tmp_path: Path) -> None:
    """MODE_CLOSE: the worker closes the WRITE job's file once done, written and linked or
    failed; without it the file stays the caller's, open. (Nothing else opens files here, so
    a number closed is not reused meanwhile.)"""
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=1, bound=1, slots=2)
    pool.attach()
    bufs = Bufs(2, 100)

    def write(name: bytes, fd: int, mode: int) -> Any:
        job = nativeio.job(nativeio.WRITE, 0, dfd, name, fd=fd, mode=mode, hb=ctypes.addressof(bufs.hb[0]),
                           hb_len=HB, buf=ctypes.addressof(bufs.buf[0]), n=100)  # fmt: skip
        return pool.run(0, job)

    try:
        kept = os.open(tmp_path, os.O_TMPFILE | os.O_WRONLY, 0o644)
        res = await write(b"kept", kept, 0)
        assert (res.result, res.stage) == (HB + 100, 0) and _is_open(kept)
        os.close(kept)
        given = os.open(tmp_path, os.O_TMPFILE | os.O_WRONLY, 0o644)
        res = await write(b"given", given, nativeio.MODE_CLOSE)
        assert (res.result, res.stage) == (HB + 100, 0) and not _is_open(given)
        assert (tmp_path / "given").stat().st_size == HB + 100
        (tmp_path / "taken").write_bytes(b"first")  # the name is taken: the file is closed all the same
        given = os.open(tmp_path, os.O_TMPFILE | os.O_WRONLY, 0o644)
        res = await write(b"taken", given, nativeio.MODE_CLOSE)
        assert (res.stage, res.info) == (0, 1) and not _is_open(given)
        unwritable = os.open(tmp_path / "given", os.O_RDONLY)  # its write fails
        res = await write(b"other", unwritable, nativeio.MODE_CLOSE)
        assert (res.result, res.stage) == (-errno.EBADF, nativeio.ST_IO) and not _is_open(unwritable)
        assert not (tmp_path / "other").exists()
    finally:
        await pool.aclose()
        os.close(dfd)


@native_only
async def test_a_slow_path_waiting_for_a_token_gets_the_next_one(tmp_path: Path) -> None:
    """A worker that gives its token back must not take it again while a slow-path thread
    waits in hold(): with the queue kept full, each hold() gets a token after at most the
    jobs already running or picked (it once waited behind ~1200 jobs, seconds)."""
    n = 4096
    (tmp_path / "f").write_bytes(b"x" * (HB + n))
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=3, bound=1, slots=6)
    pool.attach()
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


@native_only
async def test_a_store_slow_path_lets_queued_loads_go_first(tmp_path: Path) -> None:
    """hold() at a store's priority waits behind a queued load (a job of a higher priority),
    where one at priority 0 goes ahead of it: the split engine's stores on threads must not
    take every freed token from the loads queued for the workers."""
    n = 4096
    (tmp_path / "f").write_bytes(b"x" * (HB + n))
    os.mkfifo(tmp_path / "fifo")
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=3, bound=1, slots=4)
    pool.attach()
    bufs = Bufs(4, n)
    seen: dict[str, int] = {}
    try:
        stuck = asyncio.ensure_future(bufs.read(pool, 0, dfd, "fifo"))  # holds the one token
        await wait_for(lambda: pool.counts()[0] == 1, "the FIFO's reader holds the token")

        def store() -> None:
            pool.hold(lambda: seen.setdefault("store", pool.counts()[2]), prio=PRIO_STORE)

        holder = asyncio.ensure_future(asyncio.to_thread(store))
        await wait_for(lambda: pool.holds_waiting() == 1, "the store waits for a token")
        load = asyncio.ensure_future(bufs.read(pool, 1, dfd, "f"))  # priority 0: queued
        await wait_for(lambda: pool.counts()[2] == 1, "the load is queued")
        opener = open_fifo(tmp_path / "fifo")
        await stuck
        opener.join()
        assert (await load).stage == 0
        await holder
        assert seen == {"store": 0}  # it got its token with no load left queued
        with pytest.raises(ValueError, match="prio"):
            pool.hold(lambda: None, prio=7)
    finally:
        await pool.aclose()
        os.close(dfd)


@native_only
async def test_a_commit_runs_while_slow_paths_hold_every_token_waiting_for_it(tmp_path: Path) -> None:
    """A COMMIT job (the nvme journal's records) takes no I/O token: slow paths that hold
    every token may be waiting for the journal, so one that needed a token would never run."""
    pool = nativeio.NativePool(threads=2, bound=1, slots=2)
    pool.attach()
    fd = os.open(tmp_path / "journal", os.O_RDWR | os.O_CREAT, 0o600)
    records = ctypes.create_string_buffer(b"records", 7)
    fds = (ctypes.c_int32 * 1)(fd)
    committed = threading.Event()
    try:
        holder = asyncio.ensure_future(asyncio.to_thread(pool.hold, committed.wait, 30))  # the one token
        await wait_for(lambda: pool.counts()[0] == 1, "the slow path holds the token")
        job = nativeio.job(nativeio.COMMIT, 0, -1, b"", fd=fd, sync=True, hb=ctypes.addressof(fds), hb_len=1,
                           buf=ctypes.addressof(records), n=7, off=5)  # fmt: skip
        out = await asyncio.wait_for(pool.run(0, job), 20)
        committed.set()
        assert out.result == 7 and out.stage == 0
        assert await holder  # its wait ended: the commit ran while it held the token
        assert (tmp_path / "journal").read_bytes() == bytes(5) + b"records"
    finally:
        committed.set()
        await pool.aclose()
        os.close(fd)


@native_only
async def test_workers_told_to_stop_end_once_the_queue_drains(tmp_path: Path) -> None:
    """at_shutdown (what a pool dropped without aclose does) with jobs queued behind a stuck
    one: every worker ends when the last job does, none stays parked."""
    os.mkfifo(tmp_path / "fifo")
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    threads_before = len(native_workers())
    pool = nativeio.NativePool(threads=4, bound=1, slots=4)
    pool.attach()
    bufs = Bufs(4, 64)
    try:
        stuck = asyncio.ensure_future(bufs.read(pool, 0, dfd, "fifo"))
        await wait_for(lambda: pool.counts()[0] == 1, "the FIFO job holds the token")
        queued = [
            asyncio.ensure_future(pool.run(s, nativeio.job(nativeio.UNLINK, 0, dfd, b"absent%d" % s))) for s in (1, 2)
        ]
        await wait_for(lambda: pool.counts()[2] == 2, "two jobs queued behind it")
        pool._lib.at_shutdown(pool._h)
        opener = open_fifo(tmp_path / "fifo")
        await asyncio.gather(stuck, *queued)
        await asyncio.to_thread(opener.join)
        await wait_for(lambda: len(native_workers()) == threads_before, "every worker ended")
    finally:
        await pool.aclose()
        os.close(dfd)


@native_only
def test_a_pool_that_cannot_start_says_why() -> None:
    with pytest.raises(OSError) as e:
        nativeio.NativePool(threads=0, bound=1, slots=1)
    assert e.value.errno == errno.EINVAL


@native_only
async def test_a_cancelled_job_still_queued_is_taken_back_and_never_runs(tmp_path: Path) -> None:
    """A spare job (open the victim, rename it away) whose wait is cancelled while it is still
    queued (the pool's only I/O token held elsewhere) is taken back: it never runs, the
    victim keeps its name, no descriptor is opened, and ``on_cancelled`` is not called.

    (A job cancelled *while running* runs to its end and hands its outcome to
    ``on_cancelled``; no system call the workers make can be held open on purpose any more —
    chunk files are opened O_NONBLOCK and must be regular — so that path is not driven here.)"""
    (tmp_path / "victim").write_bytes(b"x")
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=2, bound=1, slots=2)
    pool.attach()
    release = threading.Event()
    holder = threading.Thread(target=pool.hold, args=(release.wait,))
    holder.start()
    try:
        await wait_for(lambda: pool.counts()[0] == 1, "the token is held")
        fds_before = set(os.listdir("/proc/self/fd"))
        spare = nativeio.job(nativeio.SPARE, 0, dfd, b"victim", flags=os.O_WRONLY, dfd2=dfd, name2=b"spare")
        ran: list[nativeio.Outcome] = []
        job = asyncio.ensure_future(pool.run(0, spare, on_cancelled=ran.append))
        await wait_for(lambda: pool.counts()[2] == 1, "the job is queued behind the held token")
        job.cancel()
        with pytest.raises(asyncio.CancelledError) as e:
            await job
        assert not hasattr(e.value, "native_outcome")  # nothing rides on the exception
        assert ran == [] and pool.counts()[2] == 0
        assert (tmp_path / "victim").exists() and not (tmp_path / "spare").exists()
        assert set(os.listdir("/proc/self/fd")) <= fds_before
        pool.put_slot(0)
    finally:
        release.set()
        await asyncio.to_thread(holder.join)
        await pool.aclose()
        os.close(dfd)


# -- the fs tier on native workers ----------------------------------------------------------


def make_tier(root: Path, engine: str, view: memoryview | None = None, **config: Any) -> tuple[FsTier, memoryview]:
    spec = OffloadingSpec(CHUNK, 8, namespace="test/native")
    if view is None:
        view = memoryview(bytearray(spec.total_bytes))
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "fs", "root": str(root), "io_engine": engine, **config}, view, spec
    )
    assert isinstance(tier, FsTier)
    return tier, view


@native_only
@pytest.mark.parametrize("durability", ["none", "fsync"])
@pytest.mark.parametrize("publish", ["auto", "rename"])
async def test_files_are_those_of_the_threads_engine(tmp_path: Path, durability: str, publish: str) -> None:
    """Native writes are byte for byte what the threads engine writes (the workers fill in
    both header checksums), and each engine loads the other's files; a damaged payload
    fails its key either way."""
    view = memoryview(bytearray(8 * CHUNK))
    for i in range(4):
        view[i * CHUNK : (i + 1) * CHUNK] = os.urandom(CHUNK)
    keys = [b"k%d" % i for i in range(4)]
    native, _ = make_tier(tmp_path / "n", "native", view, durability=durability, publish=publish)
    threads, _ = make_tier(tmp_path / "t", "threads", view, durability=durability, publish=publish)
    async with native, threads:
        assert native.active_io_engine == "native" and threads.active_io_engine == "threads"
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


@native_only
@pytest.mark.parametrize("nice", [0, 7])
async def test_workers_run_below_the_event_loop_by_worker_nice(tmp_path: Path, nice: int) -> None:
    """Workers run at the loop's nice value plus ``worker_nice``, so that where there are
    fewer cores than busy workers the event loop's thread wins the CPU when it wakes (why:
    docs/benchmarks.md); the loop's own thread is left as it was."""
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    before = set(native_workers())
    tier, _ = make_tier(tmp_path, "native", max_inflight=3, worker_nice=nice)
    async with tier:
        workers = {t: n for t, n in native_workers().items() if t not in before}
        assert len(workers) == 3 + min(3, os.cpu_count() or 1)
        assert set(workers.values()) == {min(19, mine + nice)}
        assert os.getpriority(os.PRIO_PROCESS, 0) == mine  # the loop's thread is left as it was
    for bad in (-1, 20, 2.5, True, "5"):
        with pytest.raises(TierConfigError, match="worker_nice must be an int from 0 to 19"):
            make_tier(tmp_path, "native", worker_nice=bad)


@native_only
async def test_the_workers_hash_with_the_system_xxhash_as_the_xxhash_module_does() -> None:
    """The workers' xxh3 (the system library's XXH3_64bits) equals ``xxhash.xxh3_64`` on
    random data of many lengths, the empty and unaligned ones included."""
    import xxhash

    pool = nativeio.NativePool(threads=1, bound=1, slots=1)
    pool.attach()
    try:
        for n in (0, 1, 3, 16, 17, 128, 129, 240, 241, 1000, 4096, 65536 + 7, 1 << 20):
            data = os.urandom(n)
            assert pool.hash(data) == xxhash.xxh3_64(data).intdigest() == checksum(data), n
            assert pool.hash(memoryview(data)[1:]) == xxhash.xxh3_64_intdigest(data[1:]), n
    finally:
        await pool.aclose()


@native_only
def test_without_the_xxhash_library_the_reason_names_it() -> None:
    addr, why = nativeio.find_xxh3(("libxxhash-not-here.so.0",))
    assert addr is None and why is not None
    assert "libxxhash.so.0" in why and "libxxhash0" in why and "libxxhash-not-here.so.0" in why
    addr, why = nativeio.find_xxh3()
    assert addr and why is None


@pytest.mark.parametrize(
    "why",
    [
        "asynctier/engines/_nativeio was not built (install asynctier from source with a C compiler)",
        nativeio.find_xxh3(("libxxhash-not-here.so.0",))[1],
    ],
    ids=["not-built", "no-xxhash"],
)
async def test_unavailable_native_workers_say_why(tmp_path: Path, why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nativeio, "_PROBLEM", why)
    tier, view = make_tier(tmp_path, "native")
    with pytest.raises(TierConfigError, match=r"io_engine='native' but native I/O workers are unavailable") as e:
        await tier.open()
    assert why in str(e.value)
    tier, view = make_tier(tmp_path, "auto", view)  # auto never picks what is not there
    view[:CHUNK] = os.urandom(CHUNK)
    async with tier:
        assert tier.active_io_engine == "threads"
        assert (await tier.offload([b"a"], [0])).ok and (await tier.load([b"a"], [1])).ok
        assert view[CHUNK : 2 * CHUNK] == view[:CHUNK]


def test_an_install_without_the_extension_runs_on_threads(tmp_path: Path) -> None:
    """As after an install without a C compiler (the extension is optional): no
    ``_nativeio`` shared object to be found. ``problem()`` says it was not built, "auto"
    stores and loads on threads, "native" is refused with that reason."""
    code = f"""
        import asyncio, importlib.machinery, json, os
        importlib.machinery.EXTENSION_SUFFIXES[:] = [".not-built.so"]  # as if never compiled
        from asynctier import OffloadingSpec, SecondaryTierFactory, TierConfigError
        from asynctier.engines import native as nativeio

        async def main():
            spec = OffloadingSpec(4096, 4, namespace="test/no-extension")
            view = memoryview(bytearray(os.urandom(spec.total_bytes)))
            out = {{"problem": nativeio.problem()}}
            for engine in ("auto", "native"):
                conf = {{"type": "fs", "root": {str(tmp_path)!r}, "io_engine": engine}}
                tier = SecondaryTierFactory.create_secondary_tier(conf, view, spec)
                try:
                    async with tier:
                        out[engine] = [tier.active_io_engine, (await tier.offload([b"k"], [0])).ok,
                                       (await tier.load([b"k"], [1])).ok, view[4096:8192] == view[:4096]]
                except TierConfigError as e:
                    out[engine] = str(e)
            print(json.dumps(out))

        asyncio.run(main())
    """
    repo = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                       cwd=repo)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "was not built" in out["problem"]
    assert out["auto"] == ["threads", True, True, True]
    assert "io_engine='native' but native I/O workers are unavailable" in out["native"]
    assert "was not built" in out["native"]


@native_only
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


@native_only
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


@native_only
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


@native_only
async def test_a_submission_the_pool_refuses_fails_over_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch of descriptors the pool cannot take (a bug) must not leave its calls waiting
    for ever: the jobs go the slow way, the calls succeed, the failure is logged, and the
    tier still closes; the files made ahead for a group that never ran are closed here (the
    workers close those of the groups that ran)."""
    from asynctier.posix_io import aligned_buffer

    fds_before = set(os.listdir("/proc/self/fd"))
    # (an aligned view: a group's new files are packed in bulk, pack_writes)
    tier, view = make_tier(tmp_path, "native", aligned_buffer(8 * CHUNK), max_inflight=2)
    view[:] = os.urandom(8 * CHUNK)
    keys = [b"k%d" % i for i in range(8)]
    real = nativeio.NativePool.submit_many
    calls = {"n": 0}

    def once_broken(self: nativeio.NativePool, items: list[Any]) -> list[tuple[int, Any, int]]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ValueError("a descriptor the pool cannot pack")
        return real(self, items)

    monkeypatch.setattr(nativeio.NativePool, "submit_many", once_broken)
    async with tier:
        made_ahead = tier.protocol.pool
        assert made_ahead is not None
        # the refused group takes (and closes) a file made ahead for each chunk, and the slow
        # path one more each: twice as many, so that no store finds the pool empty, whichever
        # way the call is cut into jobs
        await wait_for(lambda: made_ahead.ready >= 2 * len(keys), "files made ahead")
        assert (await asyncio.wait_for(tier.offload(keys, list(range(8))), 30)).ok
        expect = bytes(view)
        view[:] = bytes(8 * CHUNK)
        assert (await asyncio.wait_for(tier.load(keys, list(range(8))), 30)).ok
        assert bytes(view) == expect
        assert tier.stats().extra.get("native_retries", 0) >= 1
        assert tier.stats().extra.get("tmpfile_pool_empty", 0) == 0  # every store had a file made ahead
    assert "native I/O submission failed" in caplog.text
    # (fds other tests leaked may be closed by the garbage collector meanwhile: only new ones count)
    assert not set(os.listdir("/proc/self/fd")) - fds_before


@native_only
async def test_a_pool_abandoned_while_a_slow_path_holds_a_token_is_freed_after_it() -> None:
    """abandon() (an engine's stop_nowait) while a thread is inside hold(): the pool's memory
    must outlive that thread's token (it gives it back into the pool), so the pool is freed
    by the last thread to leave hold(), and a hold() after the teardown began is refused."""
    pool = nativeio.NativePool(threads=2, bound=2, slots=2)
    pool.attach()
    inside, leave = threading.Event(), threading.Event()

    def slow_path() -> str:
        inside.set()
        leave.wait(30)
        return "done"

    holder = asyncio.ensure_future(asyncio.to_thread(pool.hold, slow_path))
    try:
        assert await asyncio.to_thread(inside.wait, 30)
        pool.abandon()
        for _ in range(5):  # the loop's side of the teardown runs (call_soon)
            await asyncio.sleep(0)
        assert not pool._closed  # not freed under the holder's feet
        with pytest.raises(RuntimeError, match="shut down"):
            pool.hold(lambda: None)
    finally:
        leave.set()
        assert await holder == "done"
    await wait_for(lambda: pool._closed, "the last holder frees the pool")
