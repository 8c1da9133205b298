"""The nvme tier's stores on the native engine (tiers/nvme/stores.py): slots allocated on the
loop thread, a C worker hashes, completes the headers and writes each run, a thread commits
the journal for every store waiting. The order rules hold (a reused slot after its EVICT
record, an acknowledgement after the PUBLISH record); anything but the plain case goes to the
threads path's steps. Conformance on this engine: TestNvmeTierAligned in test_nvme.py."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from nvme_helpers import CHUNK, chunk_at, crash, fill, make
from test_nvme_native import index_lock_held

from asynctier import CapacityError, posix_io
from asynctier.core.ops import Op
from asynctier.engines import native as nativeio
from asynctier.tiers.nvme import NvmeTier, slab, stores
from asynctier.tiers.nvme.format import EVICT, pack_records

pytestmark = pytest.mark.skipif(nativeio.problem() is not None, reason=f"no native workers: {nativeio.problem()}")


def no_thread_stores(tier: NvmeTier, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a store runs the threads path's bodies (the slow path)."""

    def refuse(*args: Any) -> Any:
        raise AssertionError("a store went to the threads path")

    for name in ("_store_job", "_store_group", "_publish_group", "_settle_skipped"):
        monkeypatch.setattr(tier, name, refuse)


def journaled(tier: NvmeTier) -> bool:
    """Whether the record that published each stored key is in the journal file."""
    cat = tier._catalog
    assert cat is not None
    idx = cat.index
    return all(cat.journal.flushed(int(idx.slot_ticket[s])) for s in idx.entries.values())


def slots_accounted(tier: NvmeTier) -> bool:
    """No slot leaked: each is free or holds a key (nothing is being written)."""
    cat = tier._catalog
    assert cat is not None
    idx = cat.index
    return len(idx.free) + len(idx.entries) == idx.nslots and not idx.writing


@pytest.mark.parametrize("coalesce", [0, 1 << 20], ids=["one-chunk-jobs", "group-jobs"])
async def test_stores_run_on_the_workers_and_are_journaled_when_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, coalesce: int
) -> None:
    tier, view = make(tmp_path / "s.slab", io_engine="native", coalesce_bytes=coalesce, max_inflight=4)
    async with tier:
        no_thread_stores(tier, monkeypatch)
        data = fill(view, CHUNK, 11)
        keys = [b"s%d" % i for i in range(16)]
        res = await tier.offload(keys, list(range(16)))
        assert res.ok and res.bytes_transferred == 16 * CHUNK
        assert journaled(tier)  # acknowledged: every PUBLISH record is in
        again = await tier.offload(keys[:4], [0, 1, 2, 3])  # stored already: skipped
        assert again.ok and tier.stats().skipped == 4
        st = tier.stats()
        assert st.offloaded == 16 and st.bytes_written == 16 * CHUNK and not any(st.failures.values())
        monkeypatch.undo()
    tier, view = make(tmp_path / "s.slab", io_engine="native")  # reopened: what the medium holds
    async with tier:
        assert (await tier.load(keys, list(range(15, -1, -1)))).ok
        assert [chunk_at(view, CHUNK, 15 - i) for i in range(16)] == data


async def test_an_acknowledged_store_survives_a_crash(tmp_path: Path) -> None:
    """Acknowledged means journaled: a process killed right after finds it at the next open."""
    tier, view = make(tmp_path / "c.slab", io_engine="native")
    await tier.open()
    data = fill(view, CHUNK, 12)
    assert (await tier.offload([b"c0", b"c1", b"c2"], [0, 1, 2])).ok
    crash(tier)
    tier, view = make(tmp_path / "c.slab", io_engine="native")
    async with tier:
        assert (await tier.load([b"c0", b"c1", b"c2"], [3, 4, 5])).ok
        assert [chunk_at(view, CHUNK, i) for i in (3, 4, 5)] == data[:3]


async def test_a_full_tier_evicts_and_reuses_slots_only_after_their_evict_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each store into a full slab reuses a slot whose EVICT record must be in the journal
    first: the store waits for it (parked) and never overwrites a live mapping."""
    tier, view = make(tmp_path / "f.slab", io_engine="native", slots=16, evict_batch=2, max_inflight=4)
    seen: list[tuple[int, int]] = []
    async with tier:
        no_thread_stores(tier, monkeypatch)
        cat = tier._catalog
        assert cat is not None
        allocate = cat.allocate_many_locked

        def watch(keys: list[bytes]) -> Any:
            got = allocate(keys)
            if got[2]:
                seen.append((got[2], cat.journal._done))  # the EVICT ticket, what was in then
            return got

        monkeypatch.setattr(cat, "allocate_many_locked", watch)
        data = fill(view, CHUNK, 13)
        for r in range(6):
            keys = [b"f%d-%d" % (r, i) for i in range(8)]
            assert (await tier.offload(keys, list(range(8)))).ok
        assert tier.stats().evictions >= 32 and slots_accounted(tier) and journaled(tier)
        assert any(ticket > done for ticket, done in seen)  # some store had to wait for its EVICT
        last = [b"f5-%d" % i for i in range(8)]
        assert (await tier.load(last, list(range(8, 16)))).ok
        assert [chunk_at(view, CHUNK, 8 + i) for i in range(8)] == data[:8]
        monkeypatch.undo()
    tier, view = make(tmp_path / "f.slab", io_engine="native", slots=16)
    async with tier:  # the index the journal rebuilt agrees with the slots
        assert (await tier.load(last, list(range(8)))).ok
        assert [chunk_at(view, CHUNK, i) for i in range(8)] == data[:8]


@pytest.mark.parametrize("coalesce", [0, 1 << 20], ids=["one-chunk-jobs", "group-jobs"])
async def test_a_store_finding_the_index_busy_waits_parked_and_the_loop_never_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, coalesce: int
) -> None:
    """The index lock is held across a checkpoint's snapshot: a store
    that finds it taken keeps its engine slot, parked, and is planned again on the loop thread
    at its release, not sent to the threads path."""
    tier, view = make(tmp_path / "b.slab", io_engine="native", coalesce_bytes=coalesce)
    async with tier:
        data = fill(view, CHUNK, 14)
        cat = tier._catalog
        assert cat is not None
        no_thread_stores(tier, monkeypatch)
        done = anyio.Event()

        async def store() -> None:
            assert (await tier.offload([b"b0", b"b1"], [0, 1])).ok
            done.set()

        async with index_lock_held(cat) as release, anyio.create_task_group() as tg:
            tg.start_soon(store)
            await anyio.wait_all_tasks_blocked()  # the loop runs: planning did not wait for the lock
            assert tier.stats().extra["native_index_busy"] == 2 and not done.is_set()
            assert not cat.index.writing  # nothing allocated while it waits
            release.set()
        assert journaled(tier) and slots_accounted(tier)
        view[:] = bytes(view.nbytes)
        assert (await tier.load([b"b0", b"b1"], [2, 3])).ok
        assert [chunk_at(view, CHUNK, 2), chunk_at(view, CHUNK, 3)] == data[:2]


async def test_a_cancelled_store_parked_for_the_index_lock_returns_once_its_job_is_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job parked for the lock has its engine slot: it counts as started, so the caller's
    cancellation reaches it only once the job is over; planned only after the cancellation,
    it writes nothing (docs/cancellation.md, rule 1): the keys are absent, and stored whole by
    the next call."""
    tier, view = make(tmp_path / "c.slab", io_engine="native")
    async with tier:
        data = fill(view, CHUNK, 18)
        cat = tier._catalog
        assert cat is not None
        no_thread_stores(tier, monkeypatch)
        scopes: list[anyio.CancelScope] = []
        ended = anyio.Event()

        async def store() -> None:
            with anyio.CancelScope() as scope:
                scopes.append(scope)
                await tier.offload([b"c0", b"c1"], [0, 1])
            ended.set()

        async with index_lock_held(cat) as release, anyio.create_task_group() as tg:
            tg.start_soon(store)
            await anyio.wait_all_tasks_blocked()
            assert tier.stats().extra["native_index_busy"] == 2
            scopes[0].cancel()
            await anyio.wait_all_tasks_blocked()
            assert not ended.is_set()  # waits for the parked job
            release.set()
        assert ended.is_set() and scopes[0].cancelled_caught
        assert await tier.lookup([b"c0", b"c1"]) == [False, False]
        assert tier.stats().offloaded == 0 and not sum(tier.stats().failures.values())
        assert (await tier.offload([b"c0", b"c1"], [0, 1])).ok
        view[:] = bytes(view.nbytes)
        assert (await tier.load([b"c0", b"c1"], [2, 3])).ok
        assert [chunk_at(view, CHUNK, 2), chunk_at(view, CHUNK, 3)] == data[:2]


async def test_a_store_finding_the_index_busy_at_publication_waits_parked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written, then the lock taken before publication (a checkpoint began meanwhile): the
    store waits parked with its slots allocated, publishes at the release and is journaled
    before it is acknowledged; the other stores go on meanwhile."""
    tier, view = make(tmp_path / "p.slab", io_engine="native", max_inflight=4)
    async with tier:
        data = fill(view, CHUNK, 17)
        cat = tier._catalog
        assert cat is not None
        no_thread_stores(tier, monkeypatch)
        assert tier._split is not None
        path = tier._split.fast[Op.STORE]
        assert isinstance(path, stores.StorePath)
        publish = path._publish
        held = anyio.Event()
        release = threading.Event()
        holder: list[threading.Thread] = []

        def publish_after_a_checkpoint_began(*args: Any) -> Any:
            if not holder:  # the first store's: a thread takes the lock before it tries
                taken = threading.Event()

                def hold() -> None:
                    with cat.index.lock:
                        taken.set()
                        release.wait(30)

                holder.append(threading.Thread(target=hold))
                holder[0].start()
                assert taken.wait(30)
                held.set()
            return publish(*args)

        monkeypatch.setattr(path, "_publish", publish_after_a_checkpoint_began)
        done = anyio.Event()

        async def first() -> None:
            assert (await tier.offload([b"p0", b"p1"], [0, 1])).ok
            done.set()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                await held.wait()
                await anyio.wait_all_tasks_blocked()
                assert tier.stats().extra["native_index_busy"] == 2 and not done.is_set()
                assert len(cat.index.writing) == 2  # written, not published
                release.set()
        finally:
            release.set()
            for t in holder:
                t.join(30)
        assert (await tier.offload([b"p2"], [2])).ok
        assert journaled(tier) and slots_accounted(tier)
        view[:] = bytes(view.nbytes)
        assert (await tier.load([b"p0", b"p1", b"p2"], [3, 4, 5])).ok
        assert [chunk_at(view, CHUNK, i) for i in (3, 4, 5)] == data[:3]


async def test_keys_of_several_lengths_in_one_group_are_written_right(tmp_path: Path) -> None:
    """A run's headers share one length: a group of keys of several lengths is cut into runs."""
    tier, view = make(tmp_path / "k.slab", io_engine="native", max_inflight=1)
    async with tier:
        data = fill(view, CHUNK, 15)
        keys = [b"k" * (1 + i % 3) + b"%d" % i for i in range(12)]
        assert (await tier.offload(keys, list(range(12)))).ok
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys, list(range(12)))).ok
        assert [chunk_at(view, CHUNK, i) for i in range(12)] == data[:12]


@pytest.mark.parametrize("coalesce", [0, 1 << 20], ids=["one-chunk-jobs", "group-jobs"])
async def test_a_failed_write_fails_its_chunks_and_gives_their_slots_back(tmp_path: Path, coalesce: int) -> None:
    """A worker's pwritev fails (here: a descriptor not open for writing): those chunks fail
    with what went wrong, nothing is published, no slot leaks; the tier goes on."""
    tier, view = make(tmp_path / "w.slab", io_engine="native", coalesce_bytes=coalesce, max_inflight=2)
    async with tier:
        fill(view, CHUNK, 16)
        slabs = tier._slabs
        good = slabs.fds[0]
        ro = os.open(tier.paths[0], os.O_RDONLY)
        slabs.fds[0] = ro
        try:
            res = await tier.offload([b"w0", b"w1", b"w2"], [0, 1, 2])
        finally:
            slabs.fds[0] = good
            os.close(ro)
        assert set(res.failed) == {b"w0", b"w1", b"w2"}
        for e in res.failed.values():
            assert isinstance(e, OSError) and e.errno == 9 and "writing" in str(e)
        assert slots_accounted(tier) and not (await tier.lookup([b"w0", b"w1", b"w2"]))[0]
        assert sum(tier.stats().failures.values()) == 3
        assert (await tier.offload([b"w0", b"w1"], [0, 1])).ok


async def test_a_failed_journal_write_fails_the_stores_waiting_for_it(tmp_path: Path) -> None:
    """The commit thread's journal write fails: the stores it was to acknowledge fail, as on
    the threads path. Here the journal cannot even be cut back (a descriptor not open for
    writing): no store is acknowledged after that, none waits for ever."""
    tier, view = make(tmp_path / "j.slab", io_engine="native")
    async with tier:
        fill(view, CHUNK, 17)
        journal = tier._catalog.journal if tier._catalog is not None else None
        assert journal is not None
        good = journal.fd
        journal.fd = os.open(journal.path(journal.gen), os.O_RDONLY)
        try:
            res = await tier.offload([b"j0", b"j1"], [0, 1])
        finally:
            os.close(journal.fd)
            journal.fd = good
        assert set(res.failed) == {b"j0", b"j1"}
        assert all(isinstance(e, OSError) for e in res.failed.values())
        later = await tier.offload([b"j2"], [2])
        assert "journal unusable" in str(later.failed[b"j2"])


async def test_a_capacity_error_fails_that_chunk_only(tmp_path: Path) -> None:
    """Every slot pinned by loads in flight: a store finds none free and fails with CapacityError."""
    tier, view = make(tmp_path / "p.slab", io_engine="native", slots=8, evict_batch=1)
    async with tier:
        fill(view, CHUNK, 18)
        keys = [b"p%d" % i for i in range(8)]
        assert (await tier.offload(keys, list(range(8)))).ok
        cat = tier._catalog
        assert cat is not None
        for s in cat.index.entries.values():
            cat.index.pin(s)
        res = await tier.offload([b"q"], [9])
        assert isinstance(res.failed[b"q"], CapacityError)
        cat.unpin(list(cat.index.entries.values()))
        assert (await tier.offload([b"q"], [9])).ok and slots_accounted(tier)


async def test_the_journal_is_written_by_a_worker_job_and_a_failed_one_is_mended(tmp_path: Path) -> None:
    """Stores' commits run as COMMIT worker jobs, not the journal's own flush; one that fails
    (here a descriptor not open for writing, once) fails the stores it covered, the journal is
    cut back and its records queued again, and stores go on: all there after a reopen."""
    tier, view = make(tmp_path / "m.slab", io_engine="native", max_inflight=2)
    data = fill(view, CHUNK, 19)
    async with tier:
        cat = tier._catalog
        assert cat is not None
        journal = cat.journal
        flushes = journal.flushes
        real_flush, real_failed = journal._flush, journal.claim_failed

        def no_flush(*args: Any) -> None:
            raise AssertionError("the journal's own flush ran")

        journal._flush = no_flush  # type: ignore[method-assign]
        assert (await tier.offload([b"a"], [0])).ok
        assert journal.flushes > flushes  # written, by a worker
        good = journal.fd
        ro = os.open(journal.path(journal.gen), os.O_RDONLY)

        def mend(claim: Any, err: BaseException) -> None:  # the descriptor back, then the real mending
            journal.fd = good
            real_failed(claim, err)

        journal.fd = ro
        journal.claim_failed = mend  # type: ignore[method-assign]
        try:
            res = await tier.offload([b"b"], [1])
        finally:
            journal.fd = good
            os.close(ro)
        assert isinstance(res.failed[b"b"], OSError) and "writing its records failed" in str(res.failed[b"b"])
        assert journal.mended == 1 and journal.broken is None
        journal._flush = real_flush  # type: ignore[method-assign]
        assert (await tier.offload([b"c", b"d"], [2, 3])).ok
        assert (await tier.offload([b"b"], [1])).ok  # its record made it after all: found stored
        assert journaled(tier)
    tier, view = make(tmp_path / "m.slab")
    async with tier:
        res = await tier.load([b"a", b"b", b"c", b"d"], [0, 1, 2, 3])
        assert res.ok and [chunk_at(view, CHUNK, i) for i in range(4)] == data[:4]


@pytest.mark.parametrize("durability", ["none", "fsync"])
async def test_commits_of_every_size_write_their_records_from_the_claim_itself(tmp_path: Path, durability: str) -> None:
    """A COMMIT job reads the claim's records in place and the descriptors to sync from one
    array the path reuses: commits of 1 to 12 records, over two stripes (two descriptors
    synced first when durable), write each record, each store in its own commit. A wrong
    address or length loses records (the reopened tier misses keys); a wrong descriptor fails
    the durable commits (EBADF)."""
    paths = [tmp_path / "a.slab", tmp_path / "b.slab"]
    tier, view = make(paths, io_engine="native", max_inflight=1, durability=durability)
    data = fill(view, CHUNK, 23)
    keys = [b"r%d" % i for i in range(16)]
    async with tier:
        cat = tier._catalog
        assert cat is not None
        journal = cat.journal
        assert len(journal.data_fds) == 2 and journal.durable == (durability == "fsync")

        def no_flush(*args: Any) -> None:
            raise AssertionError("the journal's own flush ran")

        journal._flush = no_flush  # type: ignore[method-assign]
        flushes, start = journal.flushes, 0
        for n in (1, 3, 12):  # one call at a time: a commit of n PUBLISH records each
            res = await tier.offload(keys[start : start + n], list(range(start, start + n)))
            assert res.ok, res.failed
            start += n
        assert journal.flushes - flushes == 3 and journaled(tier)
        crash(tier)  # what the journal file holds, not the index in memory
    tier, view = make(paths, io_engine="native")
    async with tier:
        assert await tier.lookup(keys) == [True] * 16
        assert (await tier.load(keys, list(range(16)))).ok
        assert [chunk_at(view, CHUNK, i) for i in range(16)] == data


async def test_the_last_flushed_ticket_answers_as_flushed_does_for_every_ticket(tmp_path: Path) -> None:
    """A commit's parked stores are let go against Journal.flushed_upto, read once: it must
    agree with flushed() for every ticket, records queued and not yet written included, and
    give none once the journal is broken."""
    tier, view = make(tmp_path / "u.slab", io_engine="native")
    async with tier:
        fill(view, CHUNK, 23)
        assert (await tier.offload([b"u%d" % i for i in range(6)], list(range(6)))).ok
        cat = tier._catalog
        assert cat is not None
        journal = cat.journal
        with cat.index.lock:  # queued, not written: past the last flushed ticket (an EVICT of
            # a key never stored, a no-op on replay)
            queued = journal.append_many(pack_records(EVICT, [(b"never-stored", 0, 1, 0)]))
        upto = journal.flushed_upto()
        assert 0 < upto < queued
        assert all(journal.flushed(t) == (t <= upto) for t in range(1, queued + 2))
        journal.broken = OSError("broken for the test")
        try:
            assert journal.flushed_upto() == 0 and not any(journal.flushed(t) for t in range(1, queued + 1))
        finally:
            journal.broken = None


def _memory_dir() -> Path | None:
    """A directory on tmpfs (which accepts O_DIRECT since Linux 6.6, and still copies), if any."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) and posix_io.memory_fs(shm) == "tmpfs" else None


@pytest.mark.parametrize("where", ["buffered", "direct", "tmpfs"])
async def test_runs_are_short_where_a_slots_io_is_a_copy(disk_tmp_path: Path, where: str) -> None:
    """Without O_DIRECT, or on tmpfs, a worker's I/O is a copy on the CPU, and a group's
    worker yields between runs: a store's and a load's runs stay within BUFFERED_RUN_BYTES
    there, about (every byte still round-trips); with O_DIRECT on a disk they stay one run of
    adjacent slots."""
    base = tmp_path = disk_tmp_path
    if where == "tmpfs":
        mem = _memory_dir()
        if mem is None:
            pytest.skip("no writable tmpfs at /dev/shm")
        base = Path(tempfile.mkdtemp(dir=mem))
    # one job of 16 chunks a call (4 MiB jobs at most, 256 slots for 4 tokens)
    cfg = {"direct_io": where != "buffered", "slots": 256, "max_inflight": 4, "coalesce_bytes": 4 << 20}
    tier, view = make(base / "r.slab", io_engine="native", nchunks=16, **cfg)
    try:
        async with tier:
            slabs = tier._slabs
            if where == "direct" and slabs.copies:
                pytest.skip("the system's temporary directory is in memory, or refuses O_DIRECT")
            seen: list[int] = []
            real_runs = slabs.runs

            def runs(slots: Any, limit: int = slab.RUN_MAX) -> Any:
                out = real_runs(slots, limit)
                seen.extend(map(len, out))
                return out

            slabs.runs = runs  # type: ignore[method-assign]
            data = fill(view, CHUNK, 29)
            keys = [b"r%d" % i for i in range(16)]
            assert (await tier.offload(keys, list(range(16)))).ok
            view[:] = bytes(len(view))
            assert (await tier.load(keys, list(range(16)))).ok
            assert [chunk_at(view, CHUNK, i) for i in range(16)] == data[:16]
            cap = -(-slab.BUFFERED_RUN_BYTES // slabs.slot_size)  # 8 slots of 64 KiB chunks
            assert slabs.copies == (where != "direct")
            assert slabs.run_slots == (slab.RUN_MAX if where == "direct" else cap)
            assert seen and sum(seen) == 32  # each chunk once in a store's runs and once in a load's
            if where == "direct":
                assert max(seen) == 16  # the store's sixteen slots are adjacent in an empty slab
            else:
                assert max(seen) == cap < 16
    finally:
        if base is not tmp_path:
            shutil.rmtree(base, ignore_errors=True)


async def test_worker_commits_and_thread_flushes_append_one_after_the_other(tmp_path: Path) -> None:
    """A COMMIT job and a thread's flush (a removal's EVICT record) each start where the other
    ended, so after a crash the journal replays every record (a flush that wrote at the file's
    position once wrote over the records a worker had just committed at its offset)."""
    tier, view = make(tmp_path / "o.slab", io_engine="native")
    data = fill(view, CHUNK, 20)
    await tier.open()
    for i in range(3):
        assert (await tier.offload([b"o%d" % i, b"x%d" % i], [i, 8 + i])).ok  # a worker's commit
        assert (await tier.remove([b"x%d" % i])).ok  # a thread's flush
    crash(tier)
    tier, view = make(tmp_path / "o.slab")
    async with tier:
        assert await tier.lookup([b"o0", b"o1", b"o2", b"x0", b"x1", b"x2"]) == [True] * 3 + [False] * 3
        assert (await tier.load([b"o0", b"o1", b"o2"], [3, 4, 5])).ok
        assert [chunk_at(view, CHUNK, i) for i in (3, 4, 5)] == data[:3]


async def test_a_store_whose_runs_cannot_be_packed_fails_and_gives_its_slots_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packing a store's runs fails (here: the packer raises), whether at planning or after
    the store waited for its EVICT records: its chunks fail with that error, nothing is
    published, no slot leaks, no store is left waiting; the tier goes on."""
    tier, view = make(tmp_path / "p.slab", io_engine="native", slots=16, evict_batch=2, max_inflight=4)
    async with tier:
        fill(view, CHUNK, 17)
        for r in range(2):  # a full slab: the next stores reuse slots, most after waiting
            assert (await tier.offload([b"p%d-%d" % (r, i) for i in range(8)], list(range(8)))).ok
        real = stores._ops

        class Refusing:
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            @staticmethod
            def pack_slot_writes(*args: Any) -> None:
                raise ValueError("cannot pack")

        monkeypatch.setattr(stores, "_ops", Refusing())
        keys = [b"q-%d" % i for i in range(8)]
        with anyio.fail_after(30):
            res = await tier.offload(keys, list(range(8)))
        assert set(res.failed) == set(keys)
        assert all(isinstance(e, ValueError) and "cannot pack" in str(e) for e in res.failed.values())
        assert slots_accounted(tier) and not any(await tier.lookup(keys))
        monkeypatch.undo()
        assert (await tier.offload(keys, list(range(8)))).ok
