"""Runs of adjacent slab slots (tiers/nvme). A store or a load whose slots lie apart goes to the
workers as one GROUP job of its runs (one WRITEV or READV each), not one job and one turn of the
loop per run; and a full slab hands its stores adjacent slots where it has them
(``SlotIndex.take_free``), so that a stream of stores does not scatter its slots further every
pass."""

from __future__ import annotations

import ctypes
import errno
import os
import random
from pathlib import Path

import pytest
from native_helpers import GroupSpy
from nvme_helpers import CHUNK, chunk_at, fill, make

from asynctier.engines import native as nativeio
from asynctier.integrity import checksum
from asynctier.tiers.nvme.slots import SlotIndex

native_only = pytest.mark.skipif(nativeio.problem() is not None, reason=f"no native workers: {nativeio.problem()}")

H, P = 512, 4096  # a slot's header block and payload
BODY = 28  # a header body whose payload checksum sits at CSUM_OFFSET (20); its own follows it


def _runs(slots: list[int]) -> int:
    s = sorted(slots)
    return sum(1 for i, x in enumerate(s) if i == 0 or x != s[i - 1] + 1)


# -- the workers: a group of slot runs -------------------------------------------------------------
class _Run:
    """``k`` slots' header blocks, payloads, iovecs and checksums, for one WRITEV or READV."""

    def __init__(self, k: int, fill_byte: int | None = None) -> None:
        self.k = k
        self.hb = [ctypes.create_string_buffer(H) for _ in range(k)]
        self.pl = [ctypes.create_string_buffer(bytes([fill_byte + i]) * P if fill_byte is not None else b"", P)
                   for i in range(k)]  # fmt: skip
        self.iov = (ctypes.c_uint64 * (4 * k))()
        for i in range(k):
            self.iov[4 * i : 4 * i + 4] = [ctypes.addressof(self.hb[i]), H, ctypes.addressof(self.pl[i]), P]
        self.sums = (ctypes.c_uint64 * k)()

    def fields(self, kind: int, fd: int, off: int, body_len: int = 0, hashed: bool = False) -> nativeio.JobFields:
        return nativeio.fields(kind, 0, -1, b"", fd=fd, hb=ctypes.addressof(self.iov), hb_len=2 * self.k,
                               buf=ctypes.addressof(self.sums), n=self.k, body_len=body_len, off=off,
                               hashed=hashed)  # fmt: skip


@native_only
async def test_a_group_writes_and_reads_runs_of_slots_each_at_its_offset(tmp_path: Path) -> None:
    """Three runs of slots apart in one file, written as one group (each header's checksums
    filled in first) and read back as one group (each payload hashed); a run written through a
    read-only descriptor fails alone; a run read beside one written is refused."""
    path = tmp_path / "slab"
    path.write_bytes(bytes(16 * (H + P)))
    fd = os.open(path, os.O_RDWR)
    ro = os.open(path, os.O_RDONLY)
    pool = nativeio.NativePool(threads=2, bound=1, slots=2)
    pool.attach()
    at = [0, 5, 11]  # first slot of each run
    runs = [_Run(2, 0x10), _Run(1, 0x20), _Run(3, 0x30)]
    try:
        subs = [r.fields(nativeio.WRITEV, fd, a * (H + P), BODY) for r, a in zip(runs, at)]
        lost = _Run(1, 0x40)  # (held: the workers read its memory)
        subs.append(lost.fields(nativeio.WRITEV, ro, 14 * (H + P), BODY))
        res = await pool.run(1, nativeio.Job(-1, 0, *pool.group(1, 0, subs)))
        assert (res.result, res.stage) == (4, 0)
        out = pool.group_outcomes(1, 4)
        for r, (result, _, stage, info) in zip(runs, out):
            assert (result, stage, info) == (r.k * (H + P), 0, 1)
        assert out[3][0] == -errno.EBADF and out[3][2] == nativeio.ST_IO
        disk = path.read_bytes()
        for r, a in zip(runs, at):
            for i in range(r.k):
                slot = disk[(a + i) * (H + P) : (a + i + 1) * (H + P)]
                assert slot[H:] == r.pl[i].raw and r.sums[i] == checksum(r.pl[i].raw)
                assert int.from_bytes(slot[20:28], "little") == r.sums[i]  # filled in before the write
                assert int.from_bytes(slot[BODY : BODY + 8], "little") == checksum(slot[:BODY])
        assert disk[14 * (H + P) :] == bytes(2 * (H + P))  # the failed run wrote nothing

        back = [_Run(r.k) for r in runs]
        reads = [b.fields(nativeio.READV, fd, a * (H + P), hashed=True) for b, a in zip(back, at)]
        res = await pool.run(0, nativeio.Job(-1, 0, *pool.group(0, 0, reads)))
        assert (res.result, res.stage) == (3, 0)
        for r, b, (result, _, stage, info) in zip(runs, back, pool.group_outcomes(0, 3)):
            assert (result, stage, info) == (r.k * (H + P), 0, 1)
            assert [p.raw for p in b.pl] == [p.raw for p in r.pl] and list(b.sums) == list(r.sums)

        mixed = pool.group(0, 0, [reads[0], subs[0]])
        with pytest.raises(OSError, match="refused"):
            await pool.run(0, nativeio.Job(-1, 0, *mixed))
    finally:
        await pool.aclose()
        os.close(fd)
        os.close(ro)


# -- the tier: a store and a load whose slots lie apart --------------------------------------------
@native_only
async def test_a_store_and_a_load_of_slots_apart_run_as_groups_of_their_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every other slot of a full slab freed: one job of 40 chunks gets 40 slots apart, and
    its runs go to the workers as groups of at most RUNS_A_TURN (16, 16, 8), for the store and
    the load; every byte comes back, and the keys around them are untouched."""
    chunk = 4096
    tier, view = make(tmp_path / "r.slab", chunk=chunk, nchunks=64, slots=128, io_engine="native", max_inflight=1,
                      coalesce_bytes=1 << 22)  # fmt: skip
    async with tier:
        data = fill(view, chunk, 3)
        old = [b"o%d" % i for i in range(128)]
        for c in range(0, 128, 16):
            assert (await tier.offload(old[c : c + 16], [i % 64 for i in range(c, c + 16)])).ok
        assert (await tier.remove(old[0::2])).ok
        cat = tier._catalog
        assert cat is not None and _runs(cat.index.free) == 64  # 64 free slots, none adjacent
        assert tier.group_size("offload", 40) == 40
        spy = GroupSpy(monkeypatch)
        new = [b"n%d" % i for i in range(40)]
        assert (await tier.offload(new, list(range(40)))).ok
        assert spy.sizes == [16, 16, 8]
        view[:] = bytes(view.nbytes)
        spy.sizes.clear()
        res = await tier.load(new, list(range(24, 64)))
        assert res.ok, res.failed
        assert spy.sizes == [16, 16, 8]
        assert [chunk_at(view, chunk, 24 + i) for i in range(40)] == data[:40]
        res = await tier.load(old[1:33:2], list(range(16)))
        assert res.ok and [chunk_at(view, chunk, i) for i in range(16)] == [data[i % 64] for i in range(1, 33, 2)]
        st = tier.stats()
        assert st.extra.get("native_retries", 0) == 0 and not cat.index.pins


# -- the free list -----------------------------------------------------------------------------------
def _index(free: list[int]) -> SlotIndex:
    idx = SlotIndex(256)
    idx.free = list(free)
    return idx


def test_take_free_takes_the_shortest_run_that_holds_them_all() -> None:
    idx = _index([33, 32, 31, 30, 17, 16, 15, 14, 13, 12, 11, 10, 3, 2, 1])
    assert idx.take_free(4) == [30, 31, 32, 33]  # not a piece of the run of 8
    assert idx.take_free(8) == list(range(10, 18))
    assert idx.take_free(2) == [1, 2]
    assert idx.free == [3]


def test_take_free_without_one_run_takes_the_lowest() -> None:
    idx = _index([40, 31, 30, 20, 11, 10, 3, 2])
    assert idx.take_free(3) == [2, 3, 10]
    assert idx.free == [40, 31, 30, 20, 11]
    assert idx.take_free(2) == [30, 31] and idx.free == [40, 20, 11]  # a run that fits, if any
    assert idx.take_free(2) == [11, 20] and idx.free == [40]


def test_take_free_pops_a_long_list_from_its_end_and_a_short_one_low_first() -> None:
    idx = _index(list(range(299, -1, -1)))  # rebuild_free's order: low slots popped first
    assert idx.take_free(3) == [0, 1, 2] and len(idx.free) == 297
    idx = _index([7, 40, 5, 41])
    assert sorted(idx.take_free(4)) == [5, 7, 40, 41]  # all of them
    idx = _index([9, 2, 30, 4])
    assert idx.take_free(1) == [2] and idx.free == [30, 9, 4]  # kept low slots last: popped first


async def test_a_full_slab_streaming_stores_keeps_their_slots_in_runs(tmp_path: Path) -> None:
    """Stores of 8, 2, 6 and 4 chunks into a full slab, four in flight, published in random
    order (as jobs end): taken as they were freed, their slots drifted apart pass after pass
    (3.1 runs a store after 30 passes); now 2.3, and the free list stays short (no slots are
    held back for the runs' sake). Deterministic: the order of ends is seeded."""
    tier, _ = make(tmp_path / "f.slab", chunk=4096, slots=1024, io_engine="threads")
    rnd = random.Random(5)
    sizes = [8, 8, 2, 8, 6, 8, 4]
    inflight: list[tuple[list[bytes], dict[int, tuple[int, int]]]] = []
    runs: list[int] = []
    n = 0
    async with tier:
        cat = tier._catalog
        assert cat is not None
        while n < 30 * 1024:
            keys = [b"k%d" % (n + i) for i in range(sizes[len(runs) % len(sizes)])]
            n += len(keys)
            with cat.index.lock:
                slots, failed, _, _, _ = cat.allocate_many_locked(keys)
                assert not failed
                runs.append(_runs([s for s, _ in slots.values()]))
                inflight.append((keys, slots))
                if len(inflight) == 4:
                    done_keys, done = inflight.pop(rnd.randrange(4))
                    cat.publish_many_locked(done_keys, list(done), done, dict.fromkeys(done, 0))
        late = runs[-500:]
        assert sum(late) / len(late) < 2.6, sorted(late)
        assert len(cat.index.free) <= 2 * 16 + 8  # a batch of 16 and the rest of a run, at most


@pytest.mark.parametrize(("batch", "evicted"), [(4, 8), (2, 4)])
async def test_an_eviction_takes_the_rest_of_its_last_victims_run(tmp_path: Path, batch: int, evicted: int) -> None:
    """A slab filled by stores of 8 adjacent slots each: an eviction of ``evict_batch`` slots
    goes on to the end of its last victim's run (up to as many more), so that the run is
    freed whole, and never into the next store's run."""
    tier, view = make(tmp_path / "e.slab", slots=64, evict_batch=batch, max_inflight=1)
    async with tier:
        fill(view, CHUNK, 1)
        keys = [b"o%d" % i for i in range(64)]
        for i in range(0, 64, 8):
            assert (await tier.offload(keys[i : i + 8], list(range(8)))).ok
        cat = tier._catalog
        assert cat is not None and [cat.index.entries[k] for k in keys[:16]] == list(range(16))
        with cat.index.lock:
            slots, failed, _, _, _ = cat.allocate_many_locked([b"new"])
        assert not failed and [s for s, _ in slots.values()] == [0]  # the run freed: its first slot
        assert tier.stats().evictions == evicted
        assert await tier.lookup(keys[:9]) == [False] * evicted + [True] * (9 - evicted)
        cat.abort(b"new", slots[0][0])
