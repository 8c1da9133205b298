"""The C twins of an nvme job's steps (asynctier/_speedups_nvme*.c) do
what their Python references (asynctier/tiers/nvme/bulk.py) do: the same slot index after
each step from random states, the same return values, the same descriptors, headers and
iovecs byte for byte; and they refuse what is wrong without changing anything."""

from __future__ import annotations

import ctypes
import random
from array import array
from typing import Any

import pytest

from asynctier.engines.descriptors import GROUP_MAX, JOB_LAYOUT, RESULT_LAYOUT
from asynctier.posix_io import aligned_buffer, buffer_address
from asynctier.tiers.nvme import bulk
from asynctier.tiers.nvme.slab import slot_runs
from asynctier.tiers.nvme.slots import PICK_MAX, SlotIndex

NSLOTS = 64
STATE = ("entries", "slot_key", "prev", "nxt", "head", "tail", "slot_seq", "slot_csum", "slot_ticket", "free",
         "run_end", "reuse_ticket", "pins", "zombies", "writing", "killed")  # fmt: skip


def clone(idx: SlotIndex) -> SlotIndex:
    out = SlotIndex(idx.nslots)
    for name in STATE:
        v = getattr(idx, name)
        setattr(out, name, v if isinstance(v, int) else v.copy() if not isinstance(v, array) else v[:])
    return out


def state(idx: SlotIndex) -> dict[str, Any]:
    return {name: getattr(idx, name) for name in STATE}


def random_index(rng: random.Random) -> SlotIndex:
    """A slot index after a random history of stores, loads (pins), evictions and removals,
    made with the SlotIndex methods (the Python references' own terms)."""
    idx = SlotIndex(NSLOTS)
    idx.rebuild_free()
    seq, ticket = 0, 0
    for _step in range(rng.randrange(20, 200)):
        r = rng.random()
        if r < 0.45 and idx.free:
            n = rng.randrange(1, min(len(idx.free), 8) + 1)
            taken = idx.take_free(n)
            keys = [b"k%d" % rng.randrange(80) for _ in taken]
            bulk.begin_writes(idx, keys, taken, seq + 1)
            seq += n
            slots = {p: (s, seq - n + 1 + p) for p, s in enumerate(taken)}
            recs = bulk.end_writes(idx, keys, list(slots), slots, {p: rng.getrandbits(64) for p in slots})
            for i, old in bulk.put_published(idx, recs, ticket + 1):
                idx.release(old, ticket + 1 + i)
            ticket += len(recs)
        elif r < 0.6 and idx.entries:
            idx.pin(idx.entries[rng.choice(list(idx.entries))])
        elif r < 0.7 and idx.pins:
            idx.unpin(rng.choice(list(idx.pins)))
        elif r < 0.85:
            recs = bulk.evict_oldest(idx, rng.randrange(1, 6), rng.randrange(0, 4))
            bulk.release_many(idx, [s for _, s, _, _ in recs], ticket + 1)
            ticket += len(recs)
        elif idx.entries:  # a removal while a write of the key is in flight
            k = rng.choice(list(idx.entries))
            idx.writing[k] = idx.writing.get(k, 0) + 1
            idx.killed[k] = seq
            idx.release(idx.drop(k) or 0, ticket)
    return idx


def both(speedups: Any, idx: SlotIndex, name: str, *args: Any) -> Any:
    """Run ``name`` as the C twin on ``idx`` and as the reference on a copy: the same index
    after, the same result."""
    ref = clone(idx)
    got = getattr(speedups, name)(idx, *args)
    want = getattr(bulk, name)(ref, *args)
    assert got == want
    assert state(idx) == state(ref)
    return got


def test_the_index_steps_match_their_references_from_random_states(speedups: Any) -> None:
    rng = random.Random(5)
    for _ in range(60):
        idx = random_index(rng)
        recs = both(speedups, idx, "evict_oldest", rng.randrange(0, 10), rng.randrange(-1, 6))
        both(speedups, idx, "release_many", [s for _, s, _, _ in recs], rng.randrange(1, 1000))
        if not idx.free:
            continue
        n = rng.randrange(0, len(idx.free) + 1)
        # short free lists are searched for runs; a longer one (pick_max) taken as it lies
        taken = both(speedups, idx, "take_free", n, rng.choice((PICK_MAX, 4, 0)))
        keys = [b"k%d" % rng.randrange(80) for _ in taken]  # some stored, some twice in a job
        both(speedups, idx, "begin_writes", keys, taken, rng.randrange(1, 1 << 40))
        for k in rng.sample(keys, k=min(2, len(keys))):  # removed while being written
            idx.killed[k] = idx.slot_seq[taken[keys.index(k)]] + rng.choice((-1, 0))
        slots = {p: (s, idx.slot_seq[s]) for p, s in enumerate(taken)}
        written = rng.sample(list(slots), k=rng.randrange(len(slots) + 1))
        recs = both(speedups, idx, "end_writes", keys, written, slots, {p: rng.getrandbits(64) for p in slots})
        both(speedups, idx, "put_published", recs, rng.randrange(1, 1 << 40))


def test_the_index_steps_refuse_without_changing_the_index(speedups: Any) -> None:
    rng = random.Random(6)
    idx = random_index(rng)
    before = state(clone(idx))
    calls: list[tuple[str, tuple[Any, ...], type[BaseException], str]] = [
        ("release_many", (idx, [1, NSLOTS], 1), IndexError, "slot 64 of an index of 64"),
        ("release_many", (idx, [-1], 1), IndexError, "slot -1"),
        ("begin_writes", (idx, [b"a", b"b"], [1], 1), ValueError, "2 keys and 1 slots"),
        ("begin_writes", (idx, [b"a", "b"], [1, 2], 1), TypeError, "a key is bytes"),
        ("begin_writes", (idx, [b"a"], [NSLOTS], 1), IndexError, "slot 64"),
        ("take_free", (idx, len(idx.free) + 1, PICK_MAX), ValueError, "free slots"),
        ("take_free", (idx, -1, PICK_MAX), ValueError, "free slots"),
        ("end_writes", (idx, [b"a"], [0], {0: (1, 5)}, {}), KeyError, "no slot or checksum for position 0"),
        ("end_writes", (idx, [b"a"], [1], {1: (1, 5)}, {1: 0}), IndexError, "position 1 of 1 keys"),
        ("end_writes", (idx, [b"a"], [0], {0: (1, -5)}, {0: 0}), OverflowError, "negative"),
        ("end_writes", (idx, [b"a"], [0], [(1, 5)], {0: 0}), TypeError, "dicts by position"),
        ("put_published", (idx, [(b"a", NSLOTS, 1, 1)], 1), IndexError, "slot 64"),
        ("put_published", (idx, [(b"a", 1, 1)], 1), TypeError, r"\(key, slot, seq, csum\) tuple"),
        ("evict_oldest", (idx, 3), TypeError, "takes 3 arguments"),
    ]
    for name, args, exc, match in calls:
        with pytest.raises(exc, match=match):
            getattr(speedups, name)(*args)
        assert state(idx) == before, name
    idx.prev = array("q", [-1]) * NSLOTS  # an index whose arrays are not the ones expected
    with pytest.raises(TypeError, match="array"):
        speedups.evict_oldest(idx, 2, 0)
    idx.prev = before["prev"][:]
    idx.entries = list(idx.entries)  # type: ignore[assignment]
    with pytest.raises(TypeError, match="entries is a dict"):
        speedups.put_published(idx, [], 1)


def test_take_free_reads_only_the_slots_it_takes(speedups: Any) -> None:
    """A free list longer than PICK_MAX is taken from its end as it lies: a store call reads
    those slots only, not the whole list (an empty slab's list holds every slot, and this runs
    on the event loop's thread per call). Entries it does not take are not looked at, so one
    the twin could not even read stays where it is; one it takes is still checked."""
    nslots = PICK_MAX * 40
    idx = SlotIndex(nslots)
    idx.rebuild_free()
    both(speedups, idx, "take_free", 8, PICK_MAX)  # as the reference, from a long list
    assert len(idx.free) > PICK_MAX
    idx.free[0] = "not a slot"  # type: ignore[call-overload]  # the list's low end: never reached
    idx.free[1] = nslots + 5
    taken = speedups.take_free(idx, 32, PICK_MAX)
    assert len(taken) == 32 and len(set(taken)) == 32 and all(0 <= s < nslots for s in taken)
    assert idx.free[:2] == ["not a slot", nslots + 5]
    idx.free[-1] = nslots  # one it takes: refused, the index as it was
    before = state(clone(idx))
    with pytest.raises(IndexError, match=f"slot {nslots} of an index of {nslots}"):
        speedups.take_free(idx, 4, PICK_MAX)
    assert state(idx) == before


def test_packing_a_checkpoints_keys_matches_its_reference(speedups: Any) -> None:
    """The checkpointer's step: keys[start:stop] as lengths and the keys joined, the same
    bytes as the reference (free slots' b"" included); what is wrong is refused the same way."""
    from asynctier.tiers.nvme import checkpoint

    rng = random.Random(9)
    keys = [b"" if rng.random() < 0.3 else rng.randbytes(rng.randrange(1, 300)) for _ in range(500)]
    keys.append(b"x" * 65535)
    for start, stop in ((0, len(keys)), (0, 0), (7, 7), (3, 250), (499, 501), (len(keys), len(keys))):
        assert speedups.pack_keys(keys, start, stop) == checkpoint.pack_keys(keys, start, stop)
    for bad, exc, match in (
        ([b"a", bytearray(b"b")], TypeError, r"keys\[1\] is a bytearray, not bytes"),
        ([b"a", b"y" * 65536], OverflowError, None),
    ):
        for f in (speedups.pack_keys, checkpoint.pack_keys):
            with pytest.raises(exc, match=match):
                f(bad, 0, 2)
    for start, stop in ((-1, 2), (2, 1), (0, len(keys) + 1)):
        for f in (speedups.pack_keys, checkpoint.pack_keys):
            with pytest.raises(ValueError, match=rf"keys\[{start}:{stop}\] of a list of {len(keys)}"):
                f(keys, start, stop)
    with pytest.raises(TypeError, match="keys must be a list, not tuple"):
        speedups.pack_keys(tuple(keys), 0, 1)


class _Area:
    """What a store job's runs are packed into: a table of GROUP_MAX descriptors, header
    blocks, iovecs and checksums (as IoArea and the pool's sub-job table)."""

    def __init__(self, slots: int, hb_len: int) -> None:
        self.table = bytearray(JOB_LAYOUT.size * GROUP_MAX * 2)
        self.hb = aligned_buffer(slots * hb_len)
        self.iov = (ctypes.c_uint64 * (4 * slots))()
        self.sums = (ctypes.c_uint64 * slots)()

    def args(self, runs: list[bulk.Run], keys: list[bytes], cids: list[int], slots: Any, hb_len: int) -> list[Any]:
        return [self.table, JOB_LAYOUT.size * GROUP_MAX, 3, runs, keys, cids, slots, [7, 9, 11], self.hb,
                buffer_address(self.hb), hb_len, self.iov, ctypes.addressof(self.iov), ctypes.addressof(self.sums),
                1 << 30, 65536, b"d" * 16]  # fmt: skip

    def fill(self, rng: random.Random) -> None:
        self.table[:] = rng.randbytes(len(self.table))
        self.hb[:] = rng.randbytes(len(self.hb))
        ctypes.memmove(self.iov, rng.randbytes(ctypes.sizeof(self.iov)), ctypes.sizeof(self.iov))

    def bytes(self) -> tuple[bytes, bytes, bytes]:
        return bytes(self.table), bytes(self.hb), bytes(self.iov)


def _random_runs(rng: random.Random, keylen: int) -> tuple[list[bulk.Run], list[bytes], list[int], dict[int, Any]]:
    m = rng.randrange(1, 20)
    keys = [rng.randbytes(keylen) for _ in range(m)]
    slots = {p: (rng.randrange(1000), rng.getrandbits(63)) for p in range(m)}
    order = rng.sample(range(m), m)
    runs: list[bulk.Run] = []
    while order:
        k = rng.randrange(1, len(order) + 1)
        stripe, off = rng.randrange(3), rng.randrange(1 << 30)
        runs.append([(p, slots[p][0], stripe, off + 4096 * i) for i, p in enumerate(order[:k])])
        order = order[k:]
    return runs, keys, [rng.randrange(500) for _ in range(m)], slots


def test_a_store_jobs_runs_pack_as_their_reference_packs_them(speedups: Any) -> None:
    rng = random.Random(7)
    for keylen in (1, 16, 40, 200):
        for _ in range(10):
            runs, keys, cids, slots = _random_runs(rng, keylen)
            if len(runs) > GROUP_MAX:
                continue
            area, sides = _Area(32, 512), []
            for fn in (speedups.pack_slot_writes, bulk.pack_slot_writes):
                area.fill(random.Random(1))  # the same bytes left over for both
                fn(*area.args(runs, keys, cids, slots, 512))
                sides.append(area.bytes())
            assert sides[0] == sides[1]
            job = JOB_LAYOUT.unpack_from(sides[0][0], JOB_LAYOUT.size * GROUP_MAX)
            assert job[2:4] == (7, 3) and job[6] in (7, 9, 11) and job[13:16:2] == (2 * len(runs[0]), len(runs[0]))


def test_packing_runs_refuses_without_writing_a_byte(speedups: Any) -> None:
    rng = random.Random(8)
    _runs, keys, cids, slots = _random_runs(rng, 16)
    cases: list[tuple[Any, type[BaseException], str]] = [
        (lambda a: a.__setitem__(4, [[(0, 1, 1, 0)], [(0, 1, 3, 0)]]), ValueError, "stripe 3 of 3"),
        (lambda a: a.__setitem__(4, [[]]), TypeError, "non-empty list"),
        (lambda a: a.__setitem__(5, [b"x" * 16, b"y" * 17, *a[5][2:]]), ValueError, "one length"),
        (lambda a: a.__setitem__(7, {}), KeyError, "no \\(slot, seq\\)"),
        (lambda a: a.__setitem__(11, 40), ValueError, "header of 76 bytes in a 40-byte block"),
        (lambda a: a.__setitem__(2, JOB_LAYOUT.size * (2 * GROUP_MAX - 1) + 1), ValueError, "descriptors at offset"),
        (lambda a: a.__setitem__(17, b"short"), ValueError, "layout_digest"),
    ]
    for mutate, exc, match in cases:
        area = _Area(32, 512)
        args = [None, *area.args([[(p, 1, 0, 4096 * p) for p in range(len(keys))]], keys, cids, slots, 512)]
        mutate(args)
        before = area.bytes()
        with pytest.raises(exc, match=match):
            speedups.pack_slot_writes(*args[1:])
        assert area.bytes() == before


def test_a_store_jobs_outcomes_read_as_their_reference_reads_them(speedups: Any) -> None:
    rng = random.Random(9)
    for _ in range(40):
        runs, _, _, _ = _random_runs(rng, 8)
        total = sum(map(len, runs))
        res = bytearray(RESULT_LAYOUT.size * (len(runs) + 2))
        for j in range(len(runs)):
            ok = rng.random() < 0.7
            RESULT_LAYOUT.pack_into(res, RESULT_LAYOUT.size * (j + 2), 4096 if ok else -5, 0, 0 if ok else 3,
                                    1 if ok or rng.random() < 0.5 else 0)  # fmt: skip
        sums = (ctypes.c_uint64 * total)(*[rng.getrandbits(64) for _ in range(total)])
        sides = []
        for fn in (speedups.runs_written, bulk.runs_written):
            csums: dict[int, int] = {99: 1}
            written: list[int] = [99]
            bad = fn(memoryview(res), RESULT_LAYOUT.size * 2, runs, sums, csums, written)
            sides.append((bad, csums, written))
        assert sides[0] == sides[1]
    with pytest.raises(ValueError, match="outcomes at offset"):
        speedups.runs_written(memoryview(res), len(res), runs, sums, {}, [])
    with pytest.raises(ValueError, match="bytes of checksums"):
        speedups.runs_written(memoryview(res), 0, runs[:1], (ctypes.c_uint64 * 0)(), {}, [])
    with pytest.raises(TypeError, match="csums is a dict"):
        speedups.runs_written(memoryview(res), 0, runs, sums, [], [])


def test_a_jobs_slots_fall_into_runs_as_their_reference_cuts_them(speedups: Any) -> None:
    """Runs adjacent on one stripe, in disk order, at most ``limit`` long, for stores' (slot,
    seq) and loads' (slot, seq, checksum) alike."""
    rng = random.Random(10)
    for _ in range(200):
        nstripes, limit = rng.randrange(1, 4), rng.randrange(1, 9)
        slots = rng.sample(range(200), rng.randrange(0, 40))
        found: dict[int, tuple[int, ...]] = {
            p: (s, 1) if rng.random() < 0.5 else (s, 1, 2) for p, s in zip(rng.sample(range(100), len(slots)), slots)
        }
        args = (found, nstripes, 8192, 69632, limit)
        assert speedups.slot_runs(*args) == slot_runs(*args)
    for bad, exc, match in [
        (({0: [1]}, 1, 0, 1, 1), TypeError, "its slot first"),
        (({0: ()}, 1, 0, 1, 1), TypeError, "its slot first"),
        (({0: (-1,)}, 1, 0, 1, 1), ValueError, "slot -1"),
        (({}, 0, 0, 1, 1), ValueError, "nstripes"),
        (([], 1, 0, 1, 1), TypeError, "a dict"),
    ]:
        with pytest.raises(exc, match=match):
            speedups.slot_runs(*bad)


def test_a_load_jobs_pins_match_their_references_from_random_states(speedups: Any) -> None:
    """Pins of stored keys (some twice, some missing) and their ends: the same index after
    each, freed slots freed once unpinned."""
    rng = random.Random(11)
    for _ in range(60):
        idx = random_index(rng)
        keys = [b"k%d" % rng.randrange(90) for _ in range(rng.randrange(0, 12))]
        found, _ = both(speedups, idx, "pin_many", keys)
        slots = [s for s, _, _ in found.values()]
        for s in rng.sample(slots, k=len(slots) // 2):  # evicted or removed while being read
            if idx.slot_key[s]:
                idx.drop(idx.slot_key[s])
                idx.release(s, rng.randrange(1, 99))
        both(speedups, idx, "unpin_many", rng.sample(slots, k=len(slots)))
    idx = random_index(rng)
    before = state(clone(idx))
    free = next(s for s in range(NSLOTS) if not idx.pins.get(s))
    for name, args, exc, match in [
        ("unpin_many", (idx, [free]), KeyError, "not pinned"),
        ("unpin_many", (idx, [NSLOTS]), IndexError, "slot 64"),
        ("pin_many", (idx, ["k1"]), TypeError, "a key is bytes"),
    ]:
        with pytest.raises(exc, match=match):
            getattr(speedups, name)(*args)
        assert state(idx) == before, name


def test_an_index_whose_links_are_broken_is_refused_not_written_past(speedups: Any) -> None:
    """A slot whose LRU links point outside the arrays (an index that lost its consistency)
    fails the step with ValueError; nothing is written outside the index's arrays."""
    rng = random.Random(12)
    idx = random_index(rng)
    while len(idx.entries) < 2:
        idx = random_index(rng)
    key = next(k for k, s in idx.entries.items() if s != idx.tail)
    idx.prev[idx.entries[key]] = NSLOTS + 5
    with pytest.raises(ValueError, match="LRU list is broken"):
        speedups.pin_many(idx, [key])
    idx.head = NSLOTS
    with pytest.raises(ValueError, match="LRU ends are out of range"):
        speedups.evict_oldest(idx, 1, 0)


def _load_args(area: _Area, runs: list[bulk.Run], cids: list[int], hb_len: int) -> list[Any]:
    return [area.table, JOB_LAYOUT.size * GROUP_MAX, 1, runs, cids, [7, 9, 11], buffer_address(area.hb), hb_len,
            area.iov, ctypes.addressof(area.iov), ctypes.addressof(area.sums), 1 << 30, 65536, 1]  # fmt: skip


def test_a_load_jobs_runs_pack_as_their_reference_packs_them(speedups: Any) -> None:
    rng = random.Random(17)
    for _ in range(40):
        runs, _, cids, _ = _random_runs(rng, 8)
        if len(runs) > GROUP_MAX:
            continue
        area, sides = _Area(32, 512), []
        for fn in (speedups.pack_slot_reads, bulk.pack_slot_reads):
            area.fill(random.Random(2))
            fn(*_load_args(area, runs, cids, 512))
            sides.append(area.bytes())
        assert sides[0] == sides[1]
        job = JOB_LAYOUT.unpack_from(sides[0][0], JOB_LAYOUT.size * GROUP_MAX)
        assert job[2:4] == (6, 1) and job[6] in (7, 9, 11) and job[9] == 1  # READV, prio, a stripe's fd, hashed
        assert job[13:16:2] == (2 * len(runs[0]), len(runs[0])) and job[16] == runs[0][0][3]


def test_packing_load_runs_refuses_without_writing_a_byte(speedups: Any) -> None:
    cids = list(range(8))
    cases: list[tuple[Any, type[BaseException], str]] = [
        (lambda a: a.__setitem__(4, [[(0, 1, 1, 0)], [(1, 1, 3, 0)]]), ValueError, "stripe 3 of 3"),
        (lambda a: a.__setitem__(4, [[]]), TypeError, "non-empty list"),
        (lambda a: a.__setitem__(4, [[(8, 1, 0, 0)]]), ValueError, "position 8 of 8 keys"),
        (lambda a: a.__setitem__(5, [0, -1, *cids[2:]]), OverflowError, "negative"),
        (lambda a: a.__setitem__(2, JOB_LAYOUT.size * (2 * GROUP_MAX - 1) + 1), ValueError, "descriptors at offset"),
        (lambda a: a.__setitem__(9, (ctypes.c_uint64 * 4)()), ValueError, "bytes of iovecs"),
    ]
    for mutate, exc, match in cases:
        area = _Area(32, 512)
        args = [None, *_load_args(area, [[(p, 1, 0, 4096 * p) for p in range(8)]], cids, 512)]
        mutate(args)
        before = area.bytes()
        with pytest.raises(exc, match=match):
            speedups.pack_slot_reads(*args[1:])
        assert area.bytes() == before


def test_a_load_jobs_chunks_check_as_their_reference_checks_them(speedups: Any) -> None:
    """runs_loaded from random outcomes: runs read whole or not; header blocks with the
    header expected, another key's, another sequence number or checksum, or torn; payload
    checksums right or wrong; verify on and off; keys of several lengths (one of 1,100)."""
    from asynctier.integrity import pack_header

    rng = random.Random(19)
    hb_len, n, digest = 2048, 65536, b"d" * 16
    for _ in range(120):
        runs, keys, _, _ = _random_runs(rng, rng.choice((1, 16, 200, 1100)))
        total = sum(map(len, runs))
        found = {p: (s, rng.getrandbits(63), rng.getrandbits(64)) for run in runs for p, s, _, _ in run}
        hb = bytearray(hb_len * total + 1200)
        sums = (ctypes.c_uint64 * total)()
        res = bytearray(RESULT_LAYOUT.size * (len(runs) + 1))
        c = 0
        for j, run in enumerate(runs):
            whole = rng.random() < 0.8
            RESULT_LAYOUT.pack_into(res, RESULT_LAYOUT.size * (j + 1), 1 if whole else -5, 0, 0 if whole else 3,
                                    1 if whole else 0)  # fmt: skip
            for p, _, _, _ in run:
                _, seq, csum = found[p]
                r = rng.random()
                head = pack_header(keys[p] if r > 0.1 else b"other", n, csum if r > 0.2 else csum ^ 1, digest,
                                   seq if r > 0.3 else seq + 1)  # fmt: skip
                if r < 0.05:
                    head = head[:-1] + bytes([head[-1] ^ 1])
                hb[c * hb_len : c * hb_len + len(head)] = head
                sums[c] = csum if rng.random() < 0.85 else csum + 1
                c += 1
        for verify in (True, False):
            sides = []
            for fn in (speedups.runs_loaded, bulk.runs_loaded):
                bad: list[int] = [99]
                unpins: list[int] = [98]
                good = fn(memoryview(res), RESULT_LAYOUT.size, runs, keys, found, memoryview(hb), hb_len, sums, n,
                          digest, verify, bad, unpins)  # fmt: skip
                sides.append((good, bad, unpins))
            assert sides[0] == sides[1]
            assert sides[0][0] + len(sides[0][1]) - 1 == total == len(sides[0][2]) - 1
    args: list[Any] = [memoryview(res), RESULT_LAYOUT.size, runs, keys, found, memoryview(hb), hb_len, sums, n, digest,
                       True, [], []]  # fmt: skip
    for i, value, exc, match in [
        (1, len(res), ValueError, "outcomes at offset"),
        (4, {}, KeyError, "was not pinned"),
        (4, dict.fromkeys(found, (1, 2)), TypeError, "\\(slot, seq, csum\\) tuples"),
        (7, (ctypes.c_uint64 * 0)(), ValueError, "0 of checksums"),
        (9, b"short", ValueError, "layout_digest"),
        (11, (), TypeError, "bad and unpins lists"),
    ]:
        bad_args = args[:]
        bad_args[i] = value
        with pytest.raises(exc, match=match):
            speedups.runs_loaded(*bad_args)
        assert bad_args[11] in ([], ()) and bad_args[12] == []
