"""The nvme tier across reopens: index and LRU recovered, journal replay and torn tails,
checkpoints, striping, block devices, SIGKILL mid-stream, a million slots indexed."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from nvme_helpers import CHUNK, NS, aligned, append, chunk_at, crash, fill, make

from asynctier import OffloadingSpec, SecondaryTierFactory, TierConfigError
from asynctier.engines import native as nativeio
from asynctier.errors import failure_kind
from asynctier.posix_io import O_DIRECT
from asynctier.tiers.nvme import Checkpoint, NvmeTier, read_checkpoint, write_checkpoint
from asynctier.tiers.nvme import sysio as nvme_sysio


async def test_reopen_recovers_index_and_lru_order(tmp_path: Path) -> None:
    p = tmp_path / "re.slab"
    tier, view = make(p, slots=8, evict_batch=1)
    data = fill(view, CHUNK, 6)
    keys = [b"r%d" % i for i in range(8)]
    async with tier:
        assert (await tier.offload(keys, list(range(8)))).ok
        await tier.touch([keys[0]])
    tier, view = make(p, slots=8, evict_batch=1)
    async with tier:
        assert tier.stats().extra["recovered_chunks"] == 8
        assert await tier.lookup(keys) == [True] * 8
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys, list(range(8)))).ok
        assert [chunk_at(view, CHUNK, i) for i in range(8)] == data[:8]
        # LRU order survived: key 1 (the oldest after the touch and the loads in order) goes first
        assert (await tier.offload([b"x"], [9])).ok
        assert await tier.lookup([keys[0], b"x"]) == [False, True]  # loads above touched in order 0..7


async def test_journal_replay_and_torn_tail(tmp_path: Path) -> None:
    """Records after the last checkpoint are replayed; a torn tail is cut, not hiding later records."""
    p = tmp_path / "j.slab"
    tier, view = make(p, checkpoint_every=1 << 20)
    data = fill(view, CHUNK, 7)
    await tier.open()
    assert (await tier.offload([b"a", b"b"], [0, 1])).ok
    crash(tier)
    journals = sorted(p.parent.glob(p.name + ".atidx.journal.*"))
    assert journals
    append(journals[-1], b"\x01\x00\x05" + os.urandom(20))  # a torn record
    tier, view = make(p)
    async with tier:
        assert await tier.lookup([b"a", b"b"]) == [True, True]
        view[:] = bytes(view.nbytes)
        assert (await tier.load([b"a", b"b"], [0, 1])).ok
        assert chunk_at(view, CHUNK, 0) == data[0] and chunk_at(view, CHUNK, 1) == data[1]
        fill(view, CHUNK, 8)
        assert (await tier.offload([b"c"], [2])).ok
        c = chunk_at(view, CHUNK, 2)
        crash(tier)  # crash again: "c" lives only in the journal, after the cut
    tier, view = make(p)
    async with tier:
        assert (await tier.load([b"c"], [3])).ok and chunk_at(view, CHUNK, 3) == c


def _contents(d: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in d.iterdir()}


async def _stored_then_killed(p: Path, keys: list[bytes], seed: int) -> list[bytes]:
    """Each of ``keys`` stored by a call of its own (a journal record each: keys of 2 bytes),
    then the tier left as a killed process would; the chunks stored."""
    tier, view = make(p, checkpoint_every=1 << 20)
    data = fill(view, CHUNK, seed)
    await tier.open()
    for i, k in enumerate(keys):
        assert (await tier.offload([k], [i])).ok
    crash(tier)
    return data


def _flip_in_journal(p: Path, at: int) -> None:
    """Flip one bit at byte ``at`` of ``p``'s newest journal generation."""
    journal = sorted(p.parent.glob(p.name + ".atidx.journal.*"))[-1]
    raw = bytearray(journal.read_bytes())
    raw[at] ^= 0x01
    journal.write_bytes(raw)


def _record_key_at(n: int) -> int:
    """Where the key of journal record ``n`` (from 0; keys of 2 bytes) begins."""
    from asynctier.tiers.nvme.format import JOURNAL_HEAD, RECORD

    return JOURNAL_HEAD.size + 8 + n * (RECORD.size + 2 + 8) + RECORD.size


async def test_a_damaged_record_between_valid_ones_loses_that_record_only(tmp_path: Path) -> None:
    """A flipped bit in a record in the middle of the journal was taken for a torn tail: every
    open, fsck's included (reporting clean), cut the file there, and the chunks of every later
    record were lost. Now an open that may not create (fsck) reports it and writes nothing; an
    ordinary open skips that record and serves the rest."""
    from asynctier.errors import MediumDamagedError

    p = tmp_path / "d.slab"
    keys = [b"d%d" % i for i in range(8)]
    data = await _stored_then_killed(p, keys, 11)
    _flip_in_journal(p, _record_key_at(2))
    files = _contents(tmp_path)
    tier, view = make(p, create=False)
    with pytest.raises(MediumDamagedError, match=r"1 damaged stretch\(es\) \(\d+ bytes\) between valid records"):
        await tier.open()
    assert _contents(tmp_path) == files  # nothing written
    tier, view = make(p)
    await tier.open()
    assert tier.stats().extra["journal_damaged"] == 1
    assert await tier.lookup(keys) == [i != 2 for i in range(8)]
    view[:] = bytes(view.nbytes)
    rest = [i for i in range(8) if i != 2]
    assert (await tier.load([keys[i] for i in rest], rest)).ok
    assert all(chunk_at(view, CHUNK, i) == data[i] for i in rest)
    crash(tier)  # killed before its close: the loss was accepted at open all the same (a checkpoint)
    tier, view = make(p, create=False)
    async with tier:
        assert tier.stats().extra.get("journal_damaged", 0) == 0
        assert await tier.lookup(keys) == [i != 2 for i in range(8)]


async def test_a_failed_checkpoint_after_damage_found_at_open_does_not_fail_the_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint that records the loss (a full index_dir: ENOSPC) failed the open, which
    had served the rest before; now it is logged and the next open finds the damage again."""
    from asynctier.tiers.nvme import catalog

    p = tmp_path / "f.slab"
    keys = [b"f%d" % i for i in range(4)]
    await _stored_then_killed(p, keys, 13)
    _flip_in_journal(p, _record_key_at(1))

    def no_room(*_: Any, **__: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(catalog, "write_checkpoint", no_room)
    tier, _ = make(p)
    await tier.open()
    try:
        assert tier.stats().extra["journal_damaged"] == 1
        assert await tier.lookup(keys) == [True, False, True, True]
    finally:
        crash(tier)


async def test_a_journal_whose_header_is_damaged_is_a_loss_said_not_a_silent_one(tmp_path: Path) -> None:
    """A flipped bit in a generation's header made replay skip the file as if a kill had left
    it half made: its records were dropped without a word, and fsck said clean."""
    from asynctier.errors import MediumDamagedError

    p = tmp_path / "h.slab"
    await _stored_then_killed(p, [b"h0", b"h1"], 12)
    _flip_in_journal(p, 20)  # in the header
    tier, _ = make(p, create=False)
    with pytest.raises(MediumDamagedError, match=r"its header is damaged"):
        await tier.open()
    tier, _ = make(p)
    async with tier:
        assert tier.stats().extra["journal_damaged"] == 1
        assert await tier.lookup([b"h0", b"h1"]) == [False, False]


async def test_checkpoint_rotates_journal(tmp_path: Path) -> None:
    p = tmp_path / "ck.slab"
    tier, view = make(p, checkpoint_every=4)
    fill(view, CHUNK, 9)
    keys = [b"ck%d" % i for i in range(16)]
    async with tier:
        for i in range(0, 16, 2):
            assert (await tier.offload(keys[i : i + 2], [i, i + 1])).ok
        await asyncio.sleep(0.05)
    assert tier.stats().extra["checkpoints"] >= 2
    assert len(list(p.parent.glob(p.name + ".atidx.journal.*"))) == 1
    tier, view = make(p)
    async with tier:
        assert await tier.lookup(keys) == [True] * 16


@pytest.mark.parametrize(
    "io_engine",
    [
        pytest.param("native", marks=pytest.mark.skipif(nativeio.problem() is not None, reason="no native workers")),
        "threads",
    ],
)
async def test_stores_go_on_during_a_checkpoints_journal_rotation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, io_engine: str
) -> None:
    """The rotation's I/O (its records' write and sync, the next generation's file) runs with
    the index lock free: a store allocates, writes and publishes meanwhile, and is acknowledged
    once its record is in the new generation. Reopened after a crash (no closing checkpoint),
    every store is there, byte-exact."""
    p = tmp_path / "rot.slab"
    tier, view = make(p, io_engine=io_engine, checkpoint_every=3)
    data = fill(view, CHUNK, 21)
    async with tier:
        assert (await tier.offload([b"r0", b"r1"], [0, 1])).ok
        cat = tier._catalog
        assert cat is not None
        journal, flush = cat.journal, cat.journal._flush
        in_rotation, go = threading.Event(), threading.Event()
        index_free: list[bool] = []

        def held_rotation(batch: list[bytes], target: int, rotate_to: int | None = None) -> None:
            if rotate_to is not None:
                index_free.append(not cat.index.lock.locked())
                in_rotation.set()
                go.wait(30)
            flush(batch, target, rotate_to)

        monkeypatch.setattr(journal, "_flush", held_rotation)
        done = anyio.Event()

        async def store() -> None:
            assert (await tier.offload([b"r2", b"r3"], [2, 3])).ok
            done.set()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.to_thread.run_sync, cat.checkpoint)
                assert await anyio.to_thread.run_sync(in_rotation.wait, 30)
                tg.start_soon(store)
                with anyio.fail_after(30):
                    while b"r3" not in cat.index.entries:  # noqa: ASYNC110 - published while the rotation runs
                        await anyio.sleep(0.002)
                assert not done.is_set()  # its record waits for the new generation
                go.set()
        finally:
            go.set()
        assert index_free == [True] and done.is_set()
        assert journal.gen == 2 and tier.stats().extra["checkpoints"] == 1
        # the two records queued meanwhile count toward the next checkpoint, which two more
        # (of checkpoint_every=3) do not call for yet
        assert journal.since_checkpoint == 2 and not cat._ckpt_wake.is_set()
        crash(tier)
    tier, view = make(p, io_engine=io_engine)
    async with tier:
        view[:] = bytes(view.nbytes)
        assert (await tier.load([b"r0", b"r1", b"r2", b"r3"], [4, 5, 6, 7])).ok
        assert [chunk_at(view, CHUNK, 4 + i) for i in range(4)] == data[:4]


async def test_striping_across_paths(tmp_path: Path) -> None:
    """Slots rotate across the stripes; a grouped call (max_inflight=2) spans all three."""
    paths = [tmp_path / "s0.slab", tmp_path / "s1.slab", tmp_path / "s2.slab"]
    tier, view = make(paths, slots=30, nchunks=12, max_inflight=2)
    data = fill(view, CHUNK, 11)
    keys = [b"s%d" % i for i in range(12)]
    async with tier:
        assert tier.nslots == 30
        assert (await tier.offload(keys, list(range(12)))).ok
    for p in paths:  # every stripe got its share of the chunks
        assert p.read_bytes().count(b"ATKV") == 4
    tier, view = make(paths, slots=30, nchunks=12, max_inflight=2)
    async with tier:
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys, list(range(12)))).ok
        assert [chunk_at(view, CHUNK, i) for i in range(12)] == data


async def test_a_stripe_refusing_o_direct_makes_every_stripe_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where one of the paths refuses O_DIRECT (EINVAL, as a file system without it does),
    the others drop it too: chunks then go to every stripe unbounced, which a descriptor
    still asking for O_DIRECT failed with EINVAL on an unaligned view."""
    paths = [tmp_path / "s0.slab", tmp_path / "s1.slab"]
    real_open = nvme_sysio.open_noatime

    def first_refuses(p: Path, flags: int) -> int:
        if p == paths[0] and flags & O_DIRECT:
            raise OSError(errno.EINVAL, "O_DIRECT refused (simulated)")
        return int(real_open(p, flags))

    monkeypatch.setattr(nvme_sysio, "open_noatime", first_refuses)
    tier, view = make(paths, slots=8, nchunks=4, aligned_view=False)
    data = fill(view, CHUNK, 23)
    ks = [b"m%d" % i for i in range(4)]
    async with tier:
        assert not any(fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT for fd in tier._slabs.fds)
        assert tier.stats().extra.get("direct_io_fallbacks") == 1
        assert (await tier.offload(ks, [0, 1, 2, 3])).ok
        view[:] = bytes(view.nbytes)
        res = await tier.load(ks, [0, 1, 2, 3])
        assert res.ok, res.failed
        assert [chunk_at(view, CHUNK, i) for i in range(4)] == data


def test_tier_dropped_without_aclose_is_collected(tmp_path: Path) -> None:
    """The checkpoint thread holds no strong reference: a forgotten tier releases its files."""
    import gc
    import weakref

    async def use() -> weakref.ReferenceType[NvmeTier]:
        tier, view = make(tmp_path / "gc.slab")
        await tier.open()
        fill(view, CHUNK, 15)
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
    tier, _ = make(Path(dev), slots=None)
    with pytest.raises(TierConfigError, match="index_dir"):
        await tier.open()
    tier, _ = make(Path(dev), slots=None, index_dir=str(tmp_path / "idx"))
    with pytest.raises(TierConfigError, match="not an nvme slab"):  # a blank device is not a slab
        await tier.open()
    tier, view = make(Path(dev), slots=None, index_dir=str(tmp_path / "idx"), reformat=True)
    data = fill(view, CHUNK, 16)
    keys = [b"bd%d" % i for i in range(16)]
    async with tier:
        assert tier.nslots > 16
        assert (await tier.offload(keys, list(range(16)))).ok
    tier, view = make(Path(dev), slots=None, index_dir=str(tmp_path / "idx"))
    async with tier:
        view[:] = bytes(view.nbytes)
        assert (await tier.load(keys, list(range(16)))).ok
        assert [chunk_at(view, CHUNK, i) for i in range(16)] == data


async def test_missing_capacity_for_new_slab(tmp_path: Path) -> None:
    tier, _ = make(tmp_path / "new.slab", slots=None)
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
        # aligned and bounced buffers in turn
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(slab), str(capacity), str(chunk), str(start), str(run % 2)],
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
    view = aligned(spec.total_bytes)
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "nvme", "path": str(slab), "capacity_bytes": capacity}, view, spec
    )
    assert isinstance(tier, NvmeTier)
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
                    assert chunk_at(view, chunk, j) == child.chunk_data(k, chunk), "garbage served"


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
    view = aligned(spec.total_bytes)
    cfg = {"type": "nvme", "path": str(p), "capacity_bytes": 4096 + 8192 * n, "preallocate": False, "evict_batch": 1}
    tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
    data = fill(view, chunk, 12)
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
        assert [chunk_at(view, chunk, i) for i in range(8)] == data
        # full: a store evicts the least recently used entry
        assert (await tier.offload([b"newest"], [1])).ok
        assert await tier.lookup([b"synthetic-0000000", b"newest"]) == [False, True]
        # (a full slab also keeps a few eviction batches free ahead of its stores: the
        # entries after the first went too, so the one read is further on)
        res = await tier.load([b"synthetic-0000100"], [0])
        assert failure_kind(res.failed[b"synthetic-0000100"]) == "checksum"


def test_a_checkpoint_written_in_steps_is_the_file_written_at_once(tmp_path: Path, monkeypatch: Any) -> None:
    """The checkpointer copies and serializes the keys a step at a time, and a reopen reads
    them back, maps them and lists the free slots a step at a time (each step holds the GIL,
    the event loop waits for it): any step gives the same snapshot and the same bytes, read
    back the same, including steps that do not divide the slot count."""
    from asynctier.tiers.nvme import checkpoint as ckmod
    from asynctier.tiers.nvme import slots as slotsmod

    n = 50
    idx = slotsmod.SlotIndex(n)
    rng = random.Random(3)
    for s in rng.sample(range(n), 31):
        idx.slot_key[s] = b"key-%d" % rng.randrange(1 << 40) * rng.randrange(1, 4)
    written = []
    for step in (1 << 14, 7, 1, 50, 49):
        monkeypatch.setattr(ckmod, "STEP", step)  # (the snapshot's copies too)
        ck = idx.snapshot(b"s" * 16, 3)
        assert ck.slot_key == idx.slot_key and ck.slot_key is not idx.slot_key
        path = tmp_path / f"ck-{step}"
        write_checkpoint(path, ck)
        written.append(path.read_bytes())
        back = read_checkpoint(path)
        assert back is not None and back.slot_key == idx.slot_key
        again = slotsmod.SlotIndex(n)  # reopened in the same steps: the same map and free list
        again.load(back)
        again.rebuild_free()
        assert again.entries == {k: s for s, k in enumerate(idx.slot_key) if k}
        assert again.free == [s for s in range(n - 1, -1, -1) if not idx.slot_key[s]]
    assert all(w == written[0] for w in written)
