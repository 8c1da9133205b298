"""The nvme tier's loads on the native engine (tiers/nvme/fast.py): one C worker job per
chunk, planned and checked on the loop thread; anything but the plain case read again on a
thread. Conformance on this engine: TestNvmeTierAligned in test_nvme.py (``"auto"``)."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from native_helpers import GroupSpy, native_workers
from nvme_helpers import CHUNK, chunk_at, damage_slot, fill, make

from asynctier import ChunkNotFoundError, IntegrityError, TierConfigError
from asynctier.engines import native as nativeio
from asynctier.engines.split import SplitEngine
from asynctier.tiers.nvme import NvmeTier
from asynctier.tiers.nvme.catalog import Catalog

pytestmark = pytest.mark.skipif(nativeio.problem() is not None, reason=f"no native workers: {nativeio.problem()}")


async def stored(tier: NvmeTier, view: memoryview, seed: int, tag: bytes, n: int) -> tuple[list[bytes], list[bytes]]:
    """Random bytes in every chunk of ``view``; the first ``n`` stored under ``tag`` + i, in one
    call: (every chunk's bytes, the keys)."""
    data = fill(view, CHUNK, seed)
    keys = [tag + b"%d" % i for i in range(n)]
    assert (await tier.offload(keys, list(range(n)))).ok
    return data, keys


def pinned(tier: NvmeTier) -> dict[int, int]:
    """The slots the index holds pinned now (slot -> readers)."""
    assert tier._catalog is not None
    return tier._catalog.index.pins


@asynccontextmanager
async def index_lock_held(cat: Catalog) -> AsyncIterator[threading.Event]:
    """The index lock held by another thread (as a checkpoint holds it) until the event given
    is set, or the block ends."""
    taken, release = threading.Event(), threading.Event()

    def hold() -> None:
        with cat.index.lock:
            taken.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert await anyio.to_thread.run_sync(taken.wait, 30)
        yield release
    finally:
        release.set()
        holder.join()


async def test_loads_run_on_the_workers_and_count_once_per_batch(tmp_path: Path) -> None:
    tier, view = make(tmp_path / "n.slab", io_engine="native", max_inflight=4)
    async with tier:
        split = tier._engine
        assert isinstance(split, SplitEngine) and tier.active_io_engine == "native"
        engine = split.native
        data, keys = await stored(tier, view, 1, b"n", 8)
        view[:] = bytes(view.nbytes)
        before = engine.wakeups
        res = await tier.load(keys, list(range(15, 7, -1)))
        assert res.ok and res.bytes_transferred == 8 * CHUNK
        assert [chunk_at(view, CHUNK, 15 - i) for i in range(8)] == data[:8]
        assert engine.wakeups > before  # the workers reported them, not a thread
        st = tier.stats()
        assert st.loaded == 8 and st.bytes_read == 8 * CHUNK
        assert st.extra.get("native_retries", 0) == 0 and st.extra.get("bounce_copies", 0) == 0
        assert not pinned(tier)  # every slot unpinned after the batch


async def test_a_missing_key_fails_that_chunk_only(tmp_path: Path) -> None:
    tier, view = make(tmp_path / "m.slab", io_engine="native")
    async with tier:
        fill(view, CHUNK, 2)
        assert (await tier.offload([b"here"], [0])).ok
        res = await tier.load([b"here", b"gone"], [1, 2])
        assert res.succeeded == [b"here"] and isinstance(res.failed[b"gone"], ChunkNotFoundError)
        assert tier.stats().failures.get("not_found") == 1


@pytest.mark.parametrize("how", ["flip", "truncate"])
@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no-verify"])
async def test_a_bad_slot_is_read_again_on_a_thread_reported_and_dropped(
    tmp_path: Path, how: str, verify: bool
) -> None:
    tier, view = make(tmp_path / "b.slab", io_engine="native", verify=verify)
    async with tier:
        data = fill(view, CHUNK, 3)
        assert (await tier.offload([b"good", b"bad"], [0, 1])).ok
        damage_slot(tier, b"bad", how)
        view[:] = bytes(view.nbytes)
        res = await tier.load([b"good", b"bad"], [2, 3])
        assert chunk_at(view, CHUNK, 2) == data[0]
        if not verify:  # the header still matches: a payload's bytes are not checked
            assert res.ok
            assert tier.stats().extra.get("native_retries", 0) == 0
            return
        assert res.succeeded == [b"good"] and isinstance(res.failed[b"bad"], IntegrityError)
        assert tier.stats().extra["native_retries"] == 1
        assert await tier.lookup([b"good", b"bad"]) == [True, False]  # the bad copy went


async def test_a_damaged_header_is_caught_without_verify(tmp_path: Path) -> None:
    tier, view = make(tmp_path / "h.slab", io_engine="native", verify=False)
    async with tier:
        fill(view, CHUNK, 4)
        assert (await tier.offload([b"a", b"b"], [0, 1])).ok
        cat = tier._catalog
        assert cat is not None
        # another key's header in this key's slot: the header says so
        _copy_header(tier, cat.index.entries[b"b"], cat.index.entries[b"a"])
        res = await tier.load([b"a"], [2])
        assert isinstance(res.failed[b"a"], IntegrityError)
        assert tier.stats().extra["native_retries"] == 1


def no_thread_loads(tier: NvmeTier, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a load runs the threads path's bodies (the slow path)."""

    def refuse(*args: Any) -> Any:
        raise AssertionError("a load went to the threads path")

    for name in ("_load_job", "_load_group"):
        monkeypatch.setattr(tier, name, refuse)


async def test_a_load_finding_the_index_busy_waits_parked_and_the_loop_never_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index lock is held across a checkpoint's snapshot: a load
    that finds it taken keeps its engine slot, parked, and is planned again on the loop thread
    at its release, not read on a slow-path thread."""
    tier, view = make(tmp_path / "l.slab", io_engine="native")
    async with tier:
        data = fill(view, CHUNK, 5)
        assert (await tier.offload([b"x", b"y"], [0, 1])).ok
        cat = tier._catalog
        assert cat is not None
        no_thread_loads(tier, monkeypatch)
        view[:] = bytes(view.nbytes)
        async with index_lock_held(cat) as release, anyio.create_task_group() as tg:
            tg.start_soon(tier.load, [b"x", b"y"], [2, 3])
            await anyio.wait_all_tasks_blocked()  # the loop runs: planning did not wait for the lock
            assert tier.stats().extra["native_index_busy"] == 2
            release.set()
        assert [chunk_at(view, CHUNK, 2), chunk_at(view, CHUNK, 3)] == data[:2]
        assert tier.stats().loaded == 2 and not cat.index.pins


def _copy_header(tier: NvmeTier, src: int, dst: int) -> None:
    """Write slot ``src``'s header block over slot ``dst``'s, on the medium."""
    _, off_src = tier._slabs.locate(src)
    _, off_dst = tier._slabs.locate(dst)
    fd = os.open(tier.paths[0], os.O_RDWR)  # not the tier's descriptor: that one is O_DIRECT
    try:
        os.pwrite(fd, os.pread(fd, tier._slabs.hdr_area, off_src), off_dst)
        os.fsync(fd)
    finally:
        os.close(fd)


async def test_an_unaligned_primary_buffer_loads_on_threads(tmp_path: Path) -> None:
    """No O_DIRECT straight into the caller's chunk: the bounce path, on slow-path threads."""
    tier, view = make(tmp_path / "u.slab", io_engine="native", aligned_view=False)
    async with tier:
        data = fill(view, CHUNK, 6)
        assert (await tier.offload([b"u0", b"u1"], [0, 1])).ok
        view[:] = bytes(view.nbytes)
        assert (await tier.load([b"u0", b"u1"], [5, 4])).ok
        assert [chunk_at(view, CHUNK, 5), chunk_at(view, CHUNK, 4)] == data[:2]
        assert tier.stats().extra["bounce_copies"] == 4  # two stores, two loads


async def test_loads_stay_correct_while_stores_evict_around_them(tmp_path: Path) -> None:
    """Loads pin their slots on the loop thread while group stores on threads evict: no
    load ever returns another key's bytes, and every pin is released."""
    tier, view = make(tmp_path / "e.slab", io_engine="native", slots=24, nchunks=16)
    async with tier:
        fill(view, CHUNK, 7)
        keys = [b"e%d" % i for i in range(8)]
        assert (await tier.offload(keys, list(range(8)))).ok
        expect = [chunk_at(view, CHUNK, i) for i in range(8)]

        async def churn() -> None:
            for r in range(6):
                more = [b"c%d-%d" % (r, i) for i in range(8)]
                await tier.offload(more, list(range(8)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(churn)
            for _ in range(6):
                res = await tier.load(keys, list(range(8, 16)))
                for i, k in enumerate(keys):
                    if k in res.succeeded:
                        assert chunk_at(view, CHUNK, 8 + i) == expect[i]
                    else:
                        assert isinstance(res.failed[k], ChunkNotFoundError)  # evicted meanwhile
        assert not pinned(tier)


# -- group jobs: a call's chunks in runs of adjacent slots, one READV per run, in one GROUP -------
async def test_a_group_reads_its_runs_of_adjacent_slots_as_one_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks stored one call each sit in slots 0-15; the load below takes 13 of them out of
    order: the call is one group job that reads four runs (one READV each, in one GROUP job of
    the pool, which spreads them over its workers)."""
    tier, view = make(tmp_path / "g.slab", io_engine="native", max_inflight=2, nchunks=32)
    spy = GroupSpy(monkeypatch)
    async with tier:
        data = fill(view, CHUNK, 8)
        keys = [b"g%d" % i for i in range(16)]
        for i, k in enumerate(keys):
            assert (await tier.offload([k], [i])).ok
        assert spy.sizes == [1] * 16  # a store's runs: one GROUP job (of one run each here)
        spy.sizes.clear()
        order = [0, 5, 10, 15, 1, 6, 12, 2, 4, 8, 9, 13, 14]  # not 3, 7, 11
        assert tier.group_size("load", len(order)) == len(order)  # one group job
        view[:] = bytes(view.nbytes)
        split = tier._engine
        assert isinstance(split, SplitEngine)
        before = split.native.wakeups
        res = await tier.load([keys[i] for i in order], list(range(16, 16 + len(order))))
        assert res.ok, res.failed
        assert [chunk_at(view, CHUNK, 16 + j) for j in range(len(order))] == [data[i] for i in order]
        assert split.native.wakeups > before
        assert spy.sizes == [4]  # slots 0-2, 4-6, 8-10, 12-15
        st = tier.stats()
        assert st.loaded == len(order) and st.extra.get("native_retries", 0) == 0
        assert not pinned(tier)


async def _four_calls_load_back(tier: NvmeTier, view: memoryview, keys: list[list[bytes]], data: list[bytes]) -> None:
    """Four calls at once load back the 32 chunks each of them stored: every chunk its own
    bytes, and the counts match."""
    view[:] = bytes(view.nbytes)
    async with anyio.create_task_group() as tg:
        for c in range(4):
            tg.start_soon(tier.load, keys[c], list(range(32 * c, 32 * c + 32)))
    assert [chunk_at(view, CHUNK, i) for i in range(128)] == data
    assert tier.stats().offloaded == tier.stats().loaded == 128


async def test_on_the_native_engine_a_call_is_one_job_of_up_to_the_depths_worth(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the native engine the pool spreads a job's runs over its workers, so a call is one
    job whatever other calls run: of at most max_inflight times coalesce_bytes, of runs that
    fit one GROUP job, and of at most half the slab over max_inflight (the jobs running at
    once hold at most half of it); evened out; and the calls all move their chunks."""
    tier, view = make(tmp_path / "n.slab", io_engine="native", max_inflight=16, nchunks=128, slots=1024)
    spy = GroupSpy(monkeypatch)
    async with tier:
        slot = tier._slabs.geo.slot_size
        assert tier._spreads_jobs() and tier.coalesce_bytes * 16 // slot == 240
        half = tier.nslots // 32  # half the slab over max_inflight: the bound here
        assert half == 32
        sizes = [2, 15, 16, 32, 40, 128]
        assert [tier.group_size("offload", n) for n in sizes] == [2, 15, 16, 32, 20, 32]
        tier._active += 3  # other calls in progress change nothing
        try:
            assert [tier.group_size("load", n) for n in sizes] == [2, 15, 16, 32, 20, 32]
        finally:
            tier._active -= 3
        tier.coalesce_bytes = slot  # max_inflight slots a job
        assert tier.group_size("offload", 32) == 16 and tier.group_size("offload", 40) == 14
        tier.coalesce_bytes, tier._run_limit = 1 << 20, 1  # runs of one slot: RUNS_A_TURN of them a job
        assert tier.group_size("offload", 32) == 16
        tier._run_limit = tier._native_run_slots()
        tier.coalesce_bytes = 0  # one job a chunk, as documented
        assert tier.group_size("offload", 32) == 1
        tier.coalesce_bytes = 1 << 20
        data = fill(view, CHUNK, 5)
        keys = [[b"n%d-%d" % (c, i) for i in range(32)] for c in range(4)]
        async with anyio.create_task_group() as tg:
            for c in range(4):  # four calls at once: one job each
                tg.start_soon(tier.offload, keys[c], list(range(32 * c, 32 * c + 32)))
        assert len(spy.sizes) == 4
        await _four_calls_load_back(tier, view, keys, data)


async def test_on_the_native_engine_a_jobs_runs_are_about_coalesce_bytes_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's runs of adjacent slots are cut at about coalesce_bytes (here 3 slots), so that
    the I/Os the pool keeps in flight for one call hold no more than jobs of coalesce_bytes
    did: 32 chunks into a fresh slab go as one job of runs of at most 3 slots, stored and
    loaded back whole."""
    slot = CHUNK + 4096  # a slot: the chunk and its header block
    tier, view = make(tmp_path / "r.slab", io_engine="native", max_inflight=16, nchunks=64, slots=1024,
                      coalesce_bytes=3 * slot)  # fmt: skip
    spy = GroupSpy(monkeypatch)
    async with tier:
        assert tier._slabs.geo.slot_size == slot
        assert tier._run_limit == min(nativeio.READV_MAX, tier._slabs.run_slots, 3) == 3
        lengths: list[int] = []
        real_runs = tier._slabs.runs

        def runs(slots: Any, limit: int) -> Any:
            out = real_runs(slots, limit)
            lengths.extend(map(len, out))
            return out

        monkeypatch.setattr(tier._slabs, "runs", runs)
        data = fill(view, CHUNK, 6)
        keys = [b"r%02d" % i for i in range(32)]
        assert (await tier.offload(keys, list(range(32)))).ok
        assert spy.sizes == [len(lengths)] == [11] and max(lengths) == 3 and sum(lengths) == 32  # one GROUP job
        spy.sizes.clear()
        lengths.clear()
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys, list(range(32, 64)))).ok
        assert spy.sizes == [len(lengths)] and max(lengths) == 3 and sum(lengths) == 32
        assert [chunk_at(view, CHUNK, 32 + i) for i in range(32)] == data[:32]


async def test_on_threads_a_call_is_cut_into_its_share_of_the_depth_while_other_calls_run(tmp_path: Path) -> None:
    """On threads (a job's runs written one after another): alone, a call is cut into up to
    max_inflight jobs of at most coalesce_bytes, and never into jobs smaller than that where
    it has that much (evened out: each job costs its planning and booking, and a run of slots
    is one I/O however long); with other calls in progress, into its share of that depth,
    each job larger, up to that many times coalesce_bytes; and the calls all move their
    chunks."""
    tier, view = make(tmp_path / "s.slab", io_engine="threads", max_inflight=16, nchunks=128, slots=1024)
    async with tier:
        assert not tier._spreads_jobs()
        slot = tier._slabs.geo.slot_size
        assert tier.coalesce_bytes // slot == 15  # 1 MiB of 64 KiB slots and their headers
        # alone: 3 jobs of about coalesce_bytes, not 16 jobs of 2
        assert [tier.group_size("offload", n) for n in (2, 15, 16, 31, 32)] == [2, 15, 8, 11, 11]
        alone = tier.group_size("offload", 4096)  # a call alone: never more than coalesce_bytes a job
        assert alone > 8 and alone * slot <= tier.coalesce_bytes < (alone + 1) * slot
        tier.coalesce_bytes = 2 * slot  # jobs of two slots: 16 of them for a call alone
        assert tier.group_size("offload", 32) == 2
        sizes: list[int] = []
        real = tier.group_size

        def seen(op: str, n: int) -> int:
            sizes.append(real(op, n))
            return sizes[-1]

        tier.group_size = seen  # type: ignore[method-assign]
        data = fill(view, CHUNK, 4)
        keys = [[b"c%d-%d" % (c, i) for i in range(32)] for c in range(4)]
        async with anyio.create_task_group() as tg:
            for c in range(4):  # four calls at once: the later ones see the others in progress
                tg.start_soon(tier.offload, keys[c], list(range(32 * c, 32 * c + 32)))
        assert sizes == [2, 4, 6, 8]  # 32 chunks over 16, 8, 6 and 4 jobs
        tier.coalesce_bytes = 4 * slot  # with three other calls in progress: four times that
        tier._active += 3
        try:
            assert real("offload", 4096) == 16 and real("offload", 32) == 8
        finally:
            tier._active -= 3
        await _four_calls_load_back(tier, view, keys, data)


async def test_a_group_with_a_bad_and_a_missing_chunk_fails_those_only(tmp_path: Path) -> None:
    tier, view = make(tmp_path / "gb.slab", io_engine="native", max_inflight=2, nchunks=16)
    async with tier:
        data, keys = await stored(tier, view, 9, b"b", 8)
        damage_slot(tier, keys[2], "flip")
        asked = [*keys[:5], b"never-stored", *keys[5:7]]
        view[:] = bytes(view.nbytes)
        res = await tier.load(asked, list(range(8, 16)))
        assert set(res.failed) == {keys[2], b"never-stored"}
        assert isinstance(res.failed[keys[2]], IntegrityError)
        assert isinstance(res.failed[b"never-stored"], ChunkNotFoundError)
        for j, k in enumerate(asked):
            if k not in res.failed:
                assert chunk_at(view, CHUNK, 8 + j) == data[keys.index(k)]
        st = tier.stats()
        assert st.extra["native_retries"] == 1 and st.loaded == 6
        assert await tier.lookup([keys[2]]) == [False]  # the bad copy went
        assert not pinned(tier)


@pytest.mark.parametrize("step", ["runs_loaded", "pack_slot_reads"])
async def test_a_group_whose_check_or_next_runs_fail_fails_whole_and_leaves_no_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """A group of loads whose runs' check (or the packing of its next runs) raises on the
    loop thread (memory running out, in practice): every chunk of it fails with that error,
    none passes as loaded, no slot stays pinned, and the next load works."""
    from types import SimpleNamespace

    from asynctier.tiers.nvme import fast

    # (coalesce_bytes: the call's 20 chunks go as one group job)
    tier, view = make(tmp_path / "gf.slab", io_engine="native", max_inflight=1, nchunks=64, coalesce_bytes=4 << 20)
    async with tier:
        data, keys = await stored(tier, view, 11, b"f", 40)
        # every other slot freed: the group's 20 slots lie in 20 runs, more than one GROUP job
        # takes (RUNS_A_TURN, 16): it has next runs
        assert (await tier.remove(keys[1::2])).ok
        keys = keys[::2]
        real = fast._ops
        calls = {"n": 0}

        def failing(*args: object) -> object:
            calls["n"] += 1
            if step == "runs_loaded" or calls["n"] > 1:  # pack_slot_reads: not the first (plan) but a next one
                raise MemoryError("no memory for the check")
            return getattr(real, step)(*args)

        monkeypatch.setattr(fast, "_ops", SimpleNamespace(**{n: getattr(real, n) for n in dir(real)} | {step: failing}))
        res = await tier.load(keys, list(range(40, 60)))
        assert calls["n"] >= (1 if step == "runs_loaded" else 2)
        assert res.failed and not res.succeeded
        assert all(isinstance(e, MemoryError) for e in res.failed.values())
        monkeypatch.setattr(fast, "_ops", real)
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys, list(range(40, 60)))).ok  # (its flush unpins what the failure left)
        assert [chunk_at(view, CHUNK, 40 + i) for i in range(20)] == data[:40:2]
        assert not pinned(tier)


async def test_a_group_finding_the_index_busy_waits_parked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tier, view = make(tmp_path / "gl.slab", io_engine="native", max_inflight=2, nchunks=16)
    async with tier:
        data, keys = await stored(tier, view, 10, b"l", 8)
        cat = tier._catalog
        assert cat is not None
        no_thread_loads(tier, monkeypatch)
        view[:] = bytes(view.nbytes)
        async with index_lock_held(cat) as release, anyio.create_task_group() as tg:
            tg.start_soon(tier.load, keys, list(range(8, 16)))
            await anyio.wait_all_tasks_blocked()
            assert tier.stats().extra["native_index_busy"] == 8  # two groups of four
            release.set()
        assert [chunk_at(view, CHUNK, 8 + i) for i in range(8)] == data[:8]
        assert tier.stats().loaded == 8 and not cat.index.pins


@pytest.mark.parametrize("direct_io", [True, False], ids=["direct", "buffered"])
async def test_striped_slabs_and_buffered_io_load_through_the_workers(tmp_path: Path, direct_io: bool) -> None:
    """Slots striped over two slab files (runs never cross a stripe), with O_DIRECT or through
    the page cache: group and one-chunk loads on the workers, byte-exact."""
    tier, view = make([tmp_path / "s0.slab", tmp_path / "s1.slab"], io_engine="native", max_inflight=2,
                      nchunks=32, direct_io=direct_io)  # fmt: skip
    async with tier:
        data, keys = await stored(tier, view, 11, b"s", 16)
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys, list(range(16, 32)))).ok  # group jobs
        assert (await tier.load(keys[:1], [0])).ok  # one chunk
        assert [chunk_at(view, CHUNK, 16 + i) for i in range(16)] == data[:16]
        assert chunk_at(view, CHUNK, 0) == data[0]
        st = tier.stats()
        assert st.loaded == 17 and st.extra.get("native_retries", 0) == 0
        assert st.extra.get("bounce_copies", 0) == 0


@pytest.mark.parametrize("nice", [0, 7])
async def test_the_workers_run_below_the_event_loop_by_worker_nice(tmp_path: Path, nice: int) -> None:
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    before = set(native_workers())
    tier, _ = make(tmp_path / "w.slab", io_engine="native", max_inflight=3, worker_nice=nice)
    async with tier:
        split = tier._engine
        assert isinstance(split, SplitEngine) and split.native.nice == nice
        workers = {t: n for t, n in native_workers().items() if t not in before}
        assert len(workers) == 3 + min(3, os.cpu_count() or 1)
        assert set(workers.values()) == {min(19, mine + nice)}
    for bad in (-1, 20, 2.5, True, "5"):
        with pytest.raises(TierConfigError, match="worker_nice must be an int from 0 to 19"):
            make(tmp_path / "x.slab", worker_nice=bad)


async def test_the_tier_reports_how_often_its_workers_woke_the_loop(tmp_path: Path) -> None:
    """stats().extra["loop_wakeups"], as the fs tier has it: a 64-chunk offload and its load
    wake the event loop at least once and far fewer times than once a chunk; the threads
    engine has no such count."""
    tier, view = make(tmp_path / "w.slab", io_engine="native", max_inflight=16, nchunks=128, slots=256)
    threads, _ = make(tmp_path / "t.slab", io_engine="threads")
    async with tier, threads:
        data = fill(view, CHUNK, 6)
        keys = [b"w%d" % i for i in range(64)]
        before = tier.stats().extra["loop_wakeups"]
        assert (await tier.offload(keys, list(range(64)))).ok
        stored = tier.stats().extra["loop_wakeups"]
        assert 1 <= stored - before <= 32
        assert (await tier.load(keys, list(range(64, 128)))).ok
        assert 1 <= tier.stats().extra["loop_wakeups"] - stored <= 32
        assert [chunk_at(view, CHUNK, 64 + i) for i in range(64)] == data[:64]
        assert "loop_wakeups" not in threads.stats().extra


async def test_a_store_cancelled_while_waiting_for_room_returns_before_the_stores_ahead_end(tmp_path: Path) -> None:
    """At most half the slab is being written at once: a store past that waits (parked) for
    room. Cancelled there, it returns at once, not once the stores ahead end (their I/O
    token held here); nothing of it is stored, and the store ahead ends as usual."""
    import asyncio

    from native_helpers import HeldToken

    from asynctier.core import Op

    tier, view = make(tmp_path / "n.slab", io_engine="native", max_inflight=1, nchunks=64, slots=64)
    fill(view, CHUNK, 3)
    async with tier:
        assert tier._split is not None
        engine, path = tier._split.native, tier._split.fast[Op.STORE]
        first_keys, second_keys = [b"a%d" % i for i in range(32)], [b"b%d" % i for i in range(32)]
        async with HeldToken(engine.pool) as held:
            first = asyncio.ensure_future(tier.offload(first_keys, list(range(32))))
            second = asyncio.ensure_future(tier.offload(second_keys, list(range(32, 64))))

            def waiting() -> list[bytes]:
                return [k for _, job, _, _ in path._writing.waiting for k in job.keys]  # type: ignore[attr-defined]

            for _ in range(10_000):
                if set(second_keys) <= set(waiting()):
                    break
                await asyncio.sleep(0.001)
            assert set(second_keys) <= set(waiting()) and not first.done()
            second.cancel()
            done, _ = await asyncio.wait({second}, timeout=30)
            assert done and second.cancelled() and not first.done()
            assert not set(second_keys) & set(waiting())
            held.let_go()
            assert (await first).ok
        assert await tier.lookup(first_keys) == [True] * 32 and not any(await tier.lookup(second_keys))
        assert (await tier.offload(second_keys, list(range(32, 64)))).ok
