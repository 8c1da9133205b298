"""A cancelled call on the native engine takes back its jobs that the C workers have not
started (docs/cancellation.md, rule 1), and each tier undoes what planning them did: pins,
reserved room, files made ahead, the victims whose files a store was to take over."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fs_helpers import chunk_file
from native_helpers import HeldToken
from nvme_helpers import slab_capacity

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.core import Op
from asynctier.engines import native as nativeio
from asynctier.posix_io import aligned_buffer
from asynctier.tiers.fs import HEADER_BLOCK, FsTier
from asynctier.tiers.fs.native import GROUP_CHUNKS
from asynctier.tiers.nvme import NvmeTier

pytestmark = pytest.mark.skipif(nativeio.problem() is not None, reason=f"no native workers: {nativeio.problem()}")

CHUNK = 16 * 1024
PER = HEADER_BLOCK + CHUNK  # an fs chunk's bytes on disk
GROUP = GROUP_CHUNKS  # chunks of a group job (32)
N = 16 * GROUP  # chunks a call: 16 group jobs at max_inflight=1, 9 of them handed to the workers ahead


def _view(chunks: int, aligned: bool) -> memoryview:
    n = CHUNK * chunks
    view = aligned_buffer(n) if aligned else memoryview(bytearray(n))
    view[:] = os.urandom(n)
    return view


def _fs(root: Path, chunks: int, aligned: bool, **config: Any) -> tuple[FsTier, memoryview]:
    view = _view(chunks, aligned)
    spec = OffloadingSpec(CHUNK, chunks, namespace="test/withdraw")
    config = {"type": "fs", "root": str(root), "io_engine": "native", "max_inflight": 1, **config}
    tier = SecondaryTierFactory.create_secondary_tier(config, view, spec)
    assert isinstance(tier, FsTier)
    return tier, view


async def _cancel_once_started(tier: Any, call: Any, counter: str) -> int:
    """Let ``call`` run until its first chunk is counted, cancel it there; what was counted then."""
    before = int(getattr(tier.stats(), counter))
    task = asyncio.ensure_future(call)
    give_up = time.monotonic() + 60
    while getattr(tier.stats(), counter) == before and time.monotonic() < give_up:  # noqa: ASYNC110 (a count)
        await asyncio.sleep(0.001)  # (uvloop's timers have a resolution of a millisecond)
    at = int(getattr(tier.stats(), counter))
    assert at > before, "the call never started"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    s = tier.stats()
    assert (s.in_flight, s.queued) == (0, 0)  # nothing of it runs or waits any more
    return at


def _files_on_disk(tier: FsTier) -> int:
    return sum(1 for d in tier.dir.iterdir() if d.is_dir() and len(d.name) == 2 for f in d.iterdir() if f.is_file())


async def _loads_back(tier: Any, view: memoryview, keys: list[bytes], source: dict[bytes, int], into: int) -> None:
    """Each of ``keys`` loads the bytes of its source slot (into slots from ``into``)."""
    data = bytes(view)
    res = await tier.load(keys, list(range(into, into + len(keys))))
    assert res.ok, res.failed
    for j, k in enumerate(keys):
        src = source[k]
        assert bytes(view[(into + j) * CHUNK : (into + j + 1) * CHUNK]) == data[src * CHUNK : (src + 1) * CHUNK]


@pytest.mark.parametrize("into", ["room", "full", "room-aligned", "full-aligned"])
async def test_a_cancelled_fs_store_gives_back_what_its_withdrawn_groups_reserved(tmp_path: Path, into: str) -> None:
    """Cancelled once its first group is stored: the groups handed to the workers that none
    has started (nor prepared: a worker may make a group's files ahead of a token) are taken
    back. Their room is given back, the files made ahead closed, and into a full tier each
    victim whose file a withdrawn store was to take over is indexed again with its file
    intact: the index counts exactly the files on disk, every indexed key loads its own bytes,
    no chunk counts as failed, and the tier stores the keys afterwards as if never asked.
    How far the workers prepared at that instant varies: tried until a call had groups taken
    back (before, none ever was: up to 9 groups here ran after the cancellation)."""
    full, aligned = into.startswith("full"), into.endswith("aligned")
    old, new = [b"old-%d" % i for i in range(N)], [b"new-%d" % i for i in range(N)]
    source = {k: i for i, k in enumerate(old + new)}
    withdrawn = 0
    for attempt in range(8):
        tier, view = _fs(tmp_path / str(attempt), 4 * N, aligned, capacity_bytes=(N if full else 2 * N) * PER)
        async with tier:
            assert (await tier.offload(old, list(range(N)))).ok
            await _cancel_once_started(tier, tier.offload(new, list(range(N, 2 * N))), "offloaded")
            withdrawn = tier.stats().extra.get("withdrawn", 0)
            stored = [k for k, hit in zip(new, await tier.lookup(new)) if hit]
            assert N + len(stored) == tier.stats().offloaded
            assert len(stored) + withdrawn <= N
            assert not sum(tier.stats().failures.values())
            index = tier.index
            assert index is not None and all(e.pins == 0 and e.committed for e in index._entries.values())
            kept = [k for k in old if k in index]
            assert len(index) == len(kept) + len(stored) == _files_on_disk(tier)
            assert index.used_bytes == len(index) * PER
            assert (len(kept) < N) == (full and bool(stored))  # into a full tier, the stores that ran evicted
            assert all(chunk_file(tier, k).exists() == (k in index) for k in old)
            await _loads_back(tier, view, kept + stored, source, 2 * N)
            assert (await tier.offload(new, list(range(N, 2 * N)))).ok
            assert len(index) == _files_on_disk(tier) and index.used_bytes == len(index) * PER
            await _loads_back(tier, view, new, source, 2 * N)
        if withdrawn:
            break
    assert withdrawn, "no call had a group taken back"


async def _cancel_with_jobs_queued(tier: Any, call: Any, jobs: int) -> None:
    """Start ``call`` while its I/O cannot start; once ``jobs`` of its jobs are in the pool,
    cancel it: it comes back with the token still held (nothing of it runs), and with
    nothing of it queued."""
    engine = tier._split.native
    async with HeldToken(engine.pool):
        task = asyncio.ensure_future(call)
        for _ in range(10_000):
            if engine._started >= jobs:
                break
            await asyncio.sleep(0.001)
        assert engine._started >= jobs
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=30)  # (before: only once the token came back)
        assert done, "the cancellation waited for jobs that never started"
        with pytest.raises(asyncio.CancelledError):
            await task
        s = tier.stats()
        assert (s.in_flight, s.queued) == (1, 0)  # the token held, and nothing waiting for it


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
async def test_a_cancelled_fs_load_takes_back_every_group_not_started_and_unpins_it(
    tmp_path: Path, aligned: bool
) -> None:
    """Loads handed to the workers but not started are taken back: nothing is read after the
    cancellation, nothing stays pinned (a tier at capacity then evicts every chunk), and no
    chunk counts as failed."""
    tier, _ = _fs(tmp_path, 2 * N, aligned, capacity_bytes=N * PER)
    keys = [b"k%d" % i for i in range(N)]
    async with tier:
        assert (await tier.offload(keys, list(range(N)))).ok
        await _cancel_with_jobs_queued(tier, tier.load(keys, list(range(N, 2 * N))), tier._split.native.slots)
        assert tier.stats().loaded == 0
        # each group handed to the workers; loads pin at most half the tier ahead of the I/O
        # (tiers/fs/loads.py): a job past that waited, parked, and ended unplanned
        started = tier._split.native.slots * GROUP
        in_pool = min(started, N // 2)
        assert tier.stats().extra.get("withdrawn", 0) == in_pool
        assert tier.stats().extra.get("loads_held_back", 0) == started - in_pool > 0
        ahead = tier._split.fast[Op.LOAD]._ahead  # nothing counted as pinning, nothing parked
        assert ahead.used == 0 and not ahead.waiting
        index = tier.index
        assert index is not None and all(e.pins == 0 for e in index._entries.values())
        assert not sum(tier.stats().failures.values())
        others = [b"o%d" % i for i in range(N)]
        assert (await tier.offload(others, list(range(N)))).ok
        assert not any(await tier.lookup(keys)) and all(await tier.lookup(others))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("into", ["room", "full", "room-aligned", "full-aligned"])
async def test_a_cancelled_fs_store_takes_back_even_the_files_prepared_ahead(tmp_path: Path, into: str) -> None:
    """With the one I/O token held, the workers prepare store groups (checksums, new files)
    but run none: cancelled, the call comes back at once with nothing written. Files made
    ahead are closed, a named one removed; the victims a full tier's stores were to take
    over stay stored; the index equals the files on disk; no descriptor is left open."""
    full, aligned = into.startswith("full"), into.endswith("aligned")
    tier, view = _fs(tmp_path, 3 * N, aligned, capacity_bytes=N * PER if full else 2 * N * PER)
    old, new = [b"old-%d" % i for i in range(N)], [b"new-%d" % i for i in range(N)]
    source = {k: i for i, k in enumerate(old + new)}
    async with tier:
        assert (await tier.offload(old, list(range(N)))).ok
        fds = _open_fds()
        jobs = tier._split.native.slots
        await _cancel_with_jobs_queued(tier, tier.offload(new, list(range(N, 2 * N))), jobs)
        assert tier.stats().offloaded == N and not any(await tier.lookup(new))
        assert tier.stats().extra["withdrawn"] == jobs * GROUP and tier.stats().evictions == 0
        assert not sum(tier.stats().failures.values())
        index = tier.index
        assert index is not None and len(index) == N == _files_on_disk(tier)
        assert index.used_bytes == N * PER and all(e.pins == 0 for e in index._entries.values())
        assert _open_fds() <= fds
        await _loads_back(tier, view, old, source, 2 * N)
        assert (await tier.offload(new, list(range(N, 2 * N)))).ok
        assert len(index) == _files_on_disk(tier) and index.used_bytes == len(index) * PER
        await _loads_back(tier, view, new, source, 2 * N)


@pytest.mark.parametrize("into", ["room", "full"])
async def test_cancelled_one_chunk_stores_prepared_ahead_are_taken_back(tmp_path: Path, into: str) -> None:
    """One-chunk calls go as one job each, which a spare worker prepares (checksums, a new
    file) ahead of a token: cancelled with the one token held, each comes back at once, none
    written, the tier as it was."""
    tier, _ = _fs(tmp_path, 2 * N, True, capacity_bytes=(N if into == "full" else 2 * N) * PER)
    old, new = [b"old-%d" % i for i in range(N)], [b"new-%d" % i for i in range(8)]
    async with tier:
        assert (await tier.offload(old, list(range(N)))).ok
        fds = _open_fds()
        engine = tier._split.native
        async with HeldToken(engine.pool):
            calls = [asyncio.ensure_future(tier.offload([k], [N + i])) for i, k in enumerate(new)]
            for _ in range(10_000):
                if engine._started >= len(new):
                    break
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.05)  # (the spare worker prepares them meanwhile)
            for call in calls:
                call.cancel()
            done, _ = await asyncio.wait(calls, timeout=30)
            assert len(done) == len(calls), "a cancellation waited for a job whose I/O never began"
        assert all(c.cancelled() for c in calls)
        assert not any(await tier.lookup(new)) and all(await tier.lookup(old))
        assert tier.stats().extra["withdrawn"] == len(new) and tier.stats().evictions == 0
        index = tier.index
        assert index is not None and len(index) == N == _files_on_disk(tier) and index.used_bytes == N * PER
        assert _open_fds() <= fds


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
async def test_a_withdrawn_store_of_a_key_another_call_stores_deletes_its_victims(
    tmp_path: Path, aligned: bool
) -> None:
    """A store withdrawn while a second call stores the same keys: its room stays the other
    writer's, so its victims cannot go back (the tier would hold more than its capacity):
    they are deleted, as the store would have. The tier ends within capacity, its index equal
    to the files on disk, the second call's chunks loading their bytes."""
    n = 4 * GROUP  # each call 4 group jobs: both in the pool at once (9 slots at max_inflight=1)
    tier, view = _fs(tmp_path, 3 * N, aligned, capacity_bytes=N * PER)
    old, new = [b"old-%d" % i for i in range(N)], [b"new-%d" % i for i in range(n)]
    source = {k: i for i, k in enumerate(old)} | {k: N + i for i, k in enumerate(new)}
    async with tier:
        assert (await tier.offload(old, list(range(N)))).ok
        engine = tier._split.native
        async with HeldToken(engine.pool) as held:
            first = asyncio.ensure_future(tier.offload(new, list(range(N, N + n))))
            second = asyncio.ensure_future(tier.offload(new, list(range(N, N + n))))
            for _ in range(10_000):
                if engine._started >= 8:
                    break
                await asyncio.sleep(0.001)
            assert engine._started >= 8
            first.cancel()
            await asyncio.sleep(0.01)
            held.let_go()
            with pytest.raises(asyncio.CancelledError):
                await first
            assert (await second).ok
        index = tier.index
        assert index is not None and len(index) == N == _files_on_disk(tier)
        assert index.used_bytes == N * PER and not sum(tier.stats().failures.values())
        assert all(await tier.lookup(new))
        await _loads_back(tier, view, new + [k for k in old if k in index], source, 2 * N)


async def test_a_cancelled_calls_chunk_that_was_to_go_on_as_a_coroutine_is_given_back_not_run(
    tmp_path: Path,
) -> None:
    """A store planned as a coroutine that deletes its victims first (``NotBegun``), still
    queued when its call is cancelled, is not run: its room is given back and its victims,
    never deleted, are indexed again at the least recently used end."""
    from functools import partial
    from time import perf_counter

    from asynctier.core import Op
    from asynctier.core.jobs import Batch, Job
    from asynctier.errors import Withdrawn
    from asynctier.tiers.fs import later
    from asynctier.tiers.fs.withdrawal import not_begun

    tier, _ = _fs(tmp_path, 2 * GROUP, True, capacity_bytes=GROUP * PER)
    old = [b"old-%d" % i for i in range(GROUP)]
    async with tier:
        assert (await tier.offload(old, list(range(GROUP)))).ok
        io, index = tier._native, tier.index
        assert io is not None and index is not None
        victims = index.reserve(b"new", PER)  # the store's plan: room, and the oldest to delete
        assert victims == [b"old-0"] and b"old-0" not in index
        fn = not_begun(io, tier._async_store_reserved, b"new", perf_counter(), victims, partial(io.store, b"new", 20))
        batch = Batch(1)
        job = Job(Op.STORE, fn, (), (b"new",), batch, grouped=True)
        batch.cancelled = True
        out = await later.run_later(job, [None], [(0, fn)])
        assert isinstance(out[0], Withdrawn) and tier.stats().extra["withdrawn"] == 1
        assert b"new" not in index and next(iter(index._entries)) == b"old-0"
        assert len(index) == GROUP == _files_on_disk(tier) and index.used_bytes == GROUP * PER
        assert (await tier.lookup([b"old-0", b"new"])) == [True, False]


@pytest.mark.parametrize("op", ["store", "load"])
async def test_a_cancelled_nvme_call_stops_its_jobs_at_their_next_runs(tmp_path: Path, op: str) -> None:
    """An nvme job of many runs (slots that lie apart) goes to the workers up to 16 runs at a
    time: cancelled, it starts no next runs, and a store's slots not written go back. Keys are
    whole or absent, and a slab filled afterwards holds every chunk."""
    n = 1024
    view = _view(2 * n, aligned=True)
    spec = OffloadingSpec(CHUNK, 2 * n, namespace="test/withdraw")
    config = {"type": "nvme", "path": str(tmp_path / "slab"), "capacity_bytes": 2 * n * (CHUNK + 4096),
              "io_engine": "native", "max_inflight": 1}  # fmt: skip
    tier = SecondaryTierFactory.create_secondary_tier(config, view, spec)
    assert isinstance(tier, NvmeTier)
    keys = [b"k%d" % i for i in range(n)]
    source = {k: i for i, k in enumerate(keys)}
    async with tier:
        # every other slot taken first, so that each chunk of the call is a run of its own
        spacers = [b"s%d" % i for i in range(n)]
        order = [k for pair in zip(spacers, keys) for k in pair]
        for i in range(0, 2 * n, 64):
            part = order[i : i + 64]
            assert (await tier.offload(part, [source.get(k, 0) for k in part])).ok
        assert (await tier.remove(keys)) is not None
        if op == "load":
            assert (await tier.offload(keys, list(range(n)))).ok
            assert (await tier.remove(spacers)) is not None
            before = tier.stats().loaded
            await _cancel_once_started(tier, tier.load(keys, list(range(n, 2 * n))), "loaded")
            assert tier.stats().loaded - before < n  # not all read
            assert tier.stats().extra.get("withdrawn", 0) > 0
        else:
            await _cancel_once_started(tier, tier.offload(keys, list(range(n))), "offloaded")
            stored = [k for k, hit in zip(keys, await tier.lookup(keys)) if hit]
            assert len(stored) < n and tier.stats().extra.get("withdrawn", 0) > 0
            await _loads_back(tier, view, stored, source, n)
        assert not sum(tier.stats().failures.values())
        assert (await tier.offload(keys, list(range(n)))).ok
        await _loads_back(tier, view, keys, source, n)


async def test_an_nvme_store_parked_for_its_evict_records_writes_nothing_once_cancelled(tmp_path: Path) -> None:
    """A store into a full slab waits (parked) until the records of the evictions it made are
    in the journal; cancelled meanwhile, it then writes nothing: its slots go back, and the
    slab fills afterwards with every chunk loading its bytes."""
    from asynctier.core import Op

    n = 64
    view = _view(2 * n, aligned=True)
    spec = OffloadingSpec(CHUNK, 2 * n, namespace="test/withdraw")
    config = {"type": "nvme", "path": str(tmp_path / "slab"), "capacity_bytes": slab_capacity(n, CHUNK),
              "io_engine": "native", "max_inflight": 2}  # fmt: skip
    tier = SecondaryTierFactory.create_secondary_tier(config, view, spec)
    assert isinstance(tier, NvmeTier)
    old, new = [b"old-%d" % i for i in range(n)], [b"new-%d" % i for i in range(n)]
    source = {k: i for i, k in enumerate(old)} | {k: n + i for i, k in enumerate(new)}
    async with tier:
        assert (await tier.offload(old, list(range(n)))).ok
        assert tier.nslots == n  # full: each new chunk evicts an old one
        path = tier._split.native.fast[Op.STORE]
        parked: list[bytes] = []
        for _ in range(20):
            task = asyncio.ensure_future(tier.offload(new, list(range(n, 2 * n))))
            for _ in range(100_000):
                waiting = [job for _, _, job, st in path._parked if not st.acking and job.args[0][0] in new]
                if task.done() or waiting:
                    break
                await asyncio.sleep(0)
            if not task.done() and waiting:
                parked = [k for job in waiting for k in job.args[0]]
                task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            if parked:
                break
            assert (await tier.remove(new)) is not None
        assert parked, "no store was ever parked for its EVICT records"
        assert not any(await tier.lookup(parked))  # never written
        assert not sum(tier.stats().failures.values())
        assert (await tier.remove(old + new)) is not None
        half = new[: n // 2]  # (a full slab evicts ahead, its own chunks too)
        assert (await tier.offload(half, list(range(n, n + n // 2)))).ok
        await _loads_back(tier, view, half, source, 0)


def test_a_cancelled_call_on_trio_takes_back_what_no_worker_began(tmp_path: Path) -> None:
    """The same on trio (a cancel scope): with the one I/O token held, a store of many groups
    comes back without writing anything, the tier as it was."""
    import trio

    async def main() -> None:
        tier, _ = _fs(tmp_path, 2 * N, True, capacity_bytes=N * PER)
        old, new = [b"old-%d" % i for i in range(N)], [b"new-%d" % i for i in range(N)]
        async with tier:
            assert (await tier.offload(old, list(range(N)))).ok
            engine = tier._split.native
            holding, let_go = threading.Event(), threading.Event()

            def slow_path() -> None:
                holding.set()
                let_go.wait(60)

            holder = threading.Thread(target=engine.pool.hold, args=(slow_path,))
            holder.start()
            try:
                assert await trio.to_thread.run_sync(holding.wait, 60)
                with trio.move_on_after(30) as scope:
                    async with trio.open_nursery() as nursery:

                        async def cancel_once_queued() -> None:
                            while engine._started < engine.slots:  # noqa: ASYNC110 (a count: no event)
                                await trio.sleep(0.001)
                            nursery.cancel_scope.cancel()

                        nursery.start_soon(cancel_once_queued)
                        await tier.offload(new, list(range(N, 2 * N)))
                assert not scope.cancelled_caught  # back with the token still held
            finally:
                let_go.set()
                await trio.to_thread.run_sync(holder.join)
            s = tier.stats()
            assert s.offloaded == N and s.extra["withdrawn"] == engine.slots * GROUP and s.evictions == 0
            assert not any(await tier.lookup(new)) and all(await tier.lookup(old))
            index = tier.index
            assert index is not None and len(index) == N == _files_on_disk(tier) and index.used_bytes == N * PER

    trio.run(main)


async def test_a_cancelled_nvme_store_gives_its_slots_back_past_slow_paths_holding_the_tokens(tmp_path: Path) -> None:
    """A store cancelled before any of it is written frees its slots on a thread of its own:
    not behind the I/O tokens, nor behind the engine's threads, which slow paths holding a
    token fill. The cancellation comes back while they still hold it."""
    n = 64
    view = _view(2 * n, aligned=True)
    spec = OffloadingSpec(CHUNK, 2 * n, namespace="test/withdraw")
    config = {"type": "nvme", "path": str(tmp_path / "slab"), "capacity_bytes": slab_capacity(2 * n, CHUNK),
              "io_engine": "native", "max_inflight": 1}  # fmt: skip
    tier = SecondaryTierFactory.create_secondary_tier(config, view, spec)
    keys = [b"k%d" % i for i in range(n)]
    async with tier:
        engine = tier._split.native
        let_go = threading.Event()
        slow = asyncio.ensure_future(engine.blocking(let_go.wait, 60))  # the one token, on the engine's one thread
        try:
            for _ in range(10_000):
                if engine.pool.counts()[0]:  # (tokens held)
                    break
                await asyncio.sleep(0.001)
            task = asyncio.ensure_future(tier.offload(keys, list(range(n))))
            for _ in range(10_000):
                if engine._started:
                    break
                await asyncio.sleep(0.001)
            await asyncio.sleep(0.05)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=30)
            assert done, "the cancellation waited for the slow path's token"
            assert not slow.done()
        finally:
            let_go.set()
            await slow
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not any(await tier.lookup(keys)) and tier.stats().extra["withdrawn"] > 0
        assert (await tier.offload(keys, list(range(n)))).ok
