"""The memory tier: LRU eviction under capacity, verification, and the index behind it."""

from __future__ import annotations

import asyncio
import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asynctier import CapacityError, IntegrityError, OffloadingSpec, SecondaryTierFactory, TierConfigError
from asynctier.lru import LRUIndex, RemovalPending
from asynctier.tiers.memory import MemoryTier

SPEC = OffloadingSpec(1024, 8)


def make(**cfg: object) -> tuple[MemoryTier, bytearray]:
    buf = bytearray(SPEC.total_bytes)
    for i in range(SPEC.num_chunks):
        buf[i * 1024 : (i + 1) * 1024] = bytes([i + 1]) * 1024
    tier = SecondaryTierFactory.create_secondary_tier({"type": "memory", **cfg}, memoryview(buf), SPEC)
    assert isinstance(tier, MemoryTier)
    return tier, buf


async def test_lru_eviction_keeps_capacity_and_respects_touch_and_load() -> None:
    tier, _ = make(capacity_bytes=3 * 1024)
    async with tier:
        assert (await tier.offload([b"a", b"b", b"c"], [0, 1, 2])).ok
        await tier.touch([b"a"])
        assert (await tier.load([b"b"], [7])).ok  # b is now most recent
        assert (await tier.offload([b"d"], [3])).ok  # evicts c (least recent)
        assert await tier.lookup([b"a", b"b", b"c", b"d"]) == [True, True, False, True]
        s = tier.stats()
        assert s.evictions == 1 and s.used_bytes == 3 * 1024 and s.stored_chunks == 3
        assert s.capacity_bytes == 3 * 1024
        res = await tier.load([b"c"], [6])
        assert list(res.failed) == [b"c"]


async def test_a_capacity_below_one_chunk_is_refused_at_construction() -> None:
    """It was accepted, and every store then failed with a CapacityError."""
    with pytest.raises(TierConfigError, match=r"capacity_bytes=512 is less than one chunk \(1024 bytes\)"):
        make(capacity_bytes=512)
    tier, _ = make(capacity_bytes=1024)  # one chunk: the second evicts the first
    async with tier:
        assert (await tier.offload([b"a"], [0])).ok and (await tier.offload([b"b"], [1])).ok
        assert await tier.lookup([b"a", b"b"]) == [False, True]


async def test_corrupted_chunk_fails_verification_and_is_removed() -> None:
    tier, _ = make()
    async with tier:
        assert (await tier.offload([b"a", b"b"], [0, 1])).ok
        stored = tier._chunks[b"a"]
        stored[100] ^= 0xFF  # flip bits in the stored copy, as bad memory or a bug would
        res = await tier.load([b"a", b"b"], [5, 6])
        assert res.succeeded == [b"b"] and isinstance(res.failed[b"a"], IntegrityError)
        assert await tier.lookup([b"a"]) == [False]
        assert b"a" not in tier._chunks
        assert tier.stats().failures["checksum"] == 1


async def test_verify_chunks_reports_without_removing_unless_asked() -> None:
    tier, buf = make()
    async with tier:
        assert (await tier.offload([b"a", b"b"], [0, 1])).ok
        tier._chunks[b"b"][-1] ^= 1  # the last payload byte
        before = bytes(buf)
        res = await tier.verify_chunks(await tier.stored_keys())
        assert res.succeeded == [b"a"] and isinstance(res.failed[b"b"], IntegrityError)
        assert bytes(buf) == before, "verify touched the primary buffer"
        assert await tier.lookup([b"b"]) == [True]
        res = await tier.verify_chunks([b"b"], remove_bad=True)
        assert await tier.lookup([b"b"]) == [False]


def test_dropping_the_oldest_passes_over_pinned_and_written_entries() -> None:
    """pop_lru (the medium is full) and evict_over_capacity (a smaller capacity at restart)
    take the oldest committed, unpinned entries, in order, as many as the bytes need, and
    leave every other entry where it was."""
    idx = LRUIndex(capacity_bytes=None, track_removals=True)
    for i in range(8):
        idx.add(b"k%d" % i, 10)
    idx.pin(b"k0")
    assert idx.reserve(b"k1", 10) is None  # committed already: the write is skipped, k1 used
    assert idx.reserve(b"w", 10) == []  # a write in progress: reserved, not committed
    assert idx.pop_lru(25) == [b"k2", b"k3", b"k4"]
    assert idx.keys() == [b"k0", b"k5", b"k6", b"k7", b"k1"] and idx.used_bytes == 60
    assert all(idx.being_removed(k) for k in (b"k2", b"k3", b"k4"))
    idx.capacity_bytes = 35
    assert idx.evict_over_capacity() == [b"k5", b"k6", b"k7"]  # k0 pinned, w being written
    assert idx.keys() == [b"k0", b"k1"] and idx.used_bytes == 30 and len(idx) == 2
    assert idx.evict_over_capacity() == [] and idx.pop_lru(100) == [b"k1"]


@pytest.mark.parametrize("piece", [1, 3, 7, 1024])
def test_sorted_in_pieces_is_sorted(piece: int) -> None:
    """A recovery's finds, sorted a piece at a time and merged: sorted() of them all, ties
    (the same file time) and a last piece shorter than the others included."""
    from asynctier.lru import sorted_in_pieces

    rng = random.Random(piece)
    found = [(rng.randrange(20), b"k%d" % rng.randrange(50), rng.choice((1, 2))) for _ in range(100)]
    assert list(sorted_in_pieces(iter(found), piece)) == sorted(found)
    assert list(sorted_in_pieces([], piece)) == []


def test_pinned_entries_are_never_evicted() -> None:
    idx = LRUIndex(capacity_bytes=2)
    for k in (b"a", b"b"):
        assert idx.reserve(k, 1) == []
        idx.commit(k)
    assert idx.pin(b"a")
    assert idx.reserve(b"c", 1) == [b"b"]  # a is least recent but pinned
    idx.commit(b"c")
    assert idx.pin(b"c")
    with pytest.raises(CapacityError):
        idx.reserve(b"d", 1)  # everything evictable is in use
    idx.unpin(b"a")
    assert idx.reserve(b"d", 1) == [b"a"]


def test_entries_pinned_and_unpinned_together_are_as_if_one_by_one() -> None:
    """pin_entries: each committed key's entry pinned, None for the others; unpin_entries
    touches each still held and only drops the pin of one that left the index meanwhile."""
    idx = LRUIndex(capacity_bytes=3)
    for k in (b"a", b"b", b"c"):
        assert idx.reserve(k, 1) == []
        idx.commit(k)
    assert idx.reserve(b"r", 0) == []  # reserved, not committed
    entries = idx.pin_entries([b"a", b"r", b"b", b"x"])
    assert entries[1] is None and entries[3] is None
    a, b = entries[0], entries[2]
    assert a is not None and b is not None
    with pytest.raises(CapacityError):
        idx.reserve(b"d", 2)  # a and b are pinned: only c is evictable
    assert idx.discard(b"b")  # b leaves while pinned; a new b is stored
    assert idx.reserve(b"b", 1) == []
    idx.commit(b"b")
    idx.unpin_entries([b"a", b"b"], [a, b])
    assert b.pins == 0  # type: ignore[attr-defined]  # the old entry's pin dropped; the new one not touched
    assert idx.reserve(b"e", 1) == [b"c"]
    assert idx.reserve(b"f", 1) == [b"b"]  # a was touched (unpinned): most recently used
    with pytest.raises(ValueError):
        idx.unpin_entries([b"a"], [])


def _index_state(idx: LRUIndex) -> tuple[object, ...]:
    entries = [(k, e.nbytes, e.committed, e.pins, e.writers) for k, e in idx._entries.items()]
    return entries, idx.used_bytes, len(idx), sorted(idx._removing)


@pytest.mark.parametrize("seed", range(40))
def test_reserving_many_is_reserving_each_in_turn(seed: int) -> None:
    """reserve_many gives, for each key, what reserve gives (the victims, None, or the
    exception) and leaves the index as reserving them one by one does: from random states
    with pinned, reserved, committed and being-removed entries of mixed sizes."""
    rng = random.Random(seed)
    cap = rng.choice([None, 8, 12, 20])
    twins = [LRUIndex(capacity_bytes=cap, track_removals=True) for _ in range(2)]
    pool = [bytes([i]) for i in range(24)]
    for _ in range(rng.randrange(5, 40)):  # the same history for both
        k, n, op = rng.choice(pool), rng.choice([1, 1, 1, 2, 3]), rng.choice(["store", "store", "hold", "pin", "rm"])
        done = rng.random() < 0.5  # a removal that ends at once
        for idx in twins:
            try:
                if op == "rm":
                    if idx.begin_remove(k) and done:
                        idx.removed([k])
                    continue
                if op == "pin":
                    idx.pin(k)
                    continue
                victims = idx.reserve(k, n)
            except (CapacityError, RemovalPending):
                continue
            if victims is not None and op == "store":
                idx.commit(k, victims)
    assert _index_state(twins[0]) == _index_state(twins[1])
    keys, n = rng.sample(pool, rng.randrange(1, 12)), rng.choice([1, 1, 2, 4])
    got = twins[0].reserve_many(keys, n)
    want: list[object] = []
    for k in keys:
        try:
            want.append(twins[1].reserve(k, n))
        except (CapacityError, RemovalPending) as e:
            want.append(e)
    assert [type(g) if isinstance(g, Exception) else g for g in got] == [
        type(w) if isinstance(w, Exception) else w for w in want
    ]
    assert _index_state(twins[0]) == _index_state(twins[1])


def test_reserved_entries_are_invisible_until_commit() -> None:
    idx = LRUIndex(capacity_bytes=10)
    assert idx.reserve(b"a", 4) == []
    assert b"a" not in idx and idx.used_bytes == 4 and len(idx) == 0
    assert idx.reserve(b"a", 4) == []  # concurrent writer of the same key
    idx.abort(b"a")
    assert idx.used_bytes == 4  # the other writer still holds it
    idx.commit(b"a")
    assert b"a" in idx and idx.reserve(b"a", 4) is None  # present: skip


def test_a_key_being_removed_holds_its_writers_until_removed() -> None:
    """With track_removals, a victim handed out for deletion cannot be reserved (a new copy
    would be published before the old one is deleted, and go with it) until removed()."""
    idx = LRUIndex(capacity_bytes=2, track_removals=True)
    for k in (b"a", b"b"):
        assert idx.reserve(k, 1) == []
        idx.commit(k)
    assert idx.reserve(b"c", 1) == [b"a"]
    assert idx.being_removed(b"a") and not idx.has_entry(b"a") and b"a" not in idx
    with pytest.raises(RemovalPending) as info:
        idx.reserve(b"a", 1)
    assert info.value.key == b"a" and not info.value.wait(0)
    assert not idx.adopt_pinned(b"a", 1)  # found on the medium meanwhile: on its way out
    idx.add(b"a", 1)
    assert not idx.has_entry(b"a")
    idx.removed([b"a"])
    assert info.value.wait(0) and not idx.being_removed(b"a")
    idx.commit(b"c")
    assert idx.reserve(b"a", 1) == [b"b"]  # a new copy may be written now
    idx.removed([b"b", b"never-handed-out"])  # harmless for keys not being removed


def test_a_key_being_written_is_neither_a_victim_nor_removed() -> None:
    """A second writer of a committed key keeps it from eviction (its publish would land after
    the eviction's unlink or rename); a removal while a write runs leaves the entry to the write."""
    idx = LRUIndex(capacity_bytes=2, track_removals=True)
    assert idx.reserve(b"a", 1) == []
    assert idx.reserve(b"a", 1) == []  # a concurrent writer of the same key
    idx.commit(b"a")  # the first is done: committed, one writer left
    assert not idx.begin_remove(b"a")  # the write wins: nothing dropped, nothing to delete
    assert b"a" in idx
    assert idx.reserve(b"b", 1) == []
    idx.commit(b"b")
    assert idx.pin(b"b")
    with pytest.raises(CapacityError):
        idx.reserve(b"c", 1)  # a is still being written, b is being read: nothing to evict
    idx.commit(b"a")  # the second writer is done
    assert idx.reserve(b"c", 1) == [b"a"]
    idx.unpin(b"b")
    assert idx.begin_remove(b"b") and idx.being_removed(b"b") and b"b" not in idx
    with pytest.raises(RemovalPending):
        idx.begin_remove(b"b")  # one deletion at a time
    idx.removed([b"b"])
    assert idx.begin_remove(b"never-stored")  # nothing indexed: the medium may still hold one
    idx.removed([b"never-stored"])


def test_untracked_index_hands_out_victims_as_before() -> None:
    """Without track_removals (the default) nothing waits: victims may be written again at once."""
    idx = LRUIndex(capacity_bytes=1)
    assert idx.reserve(b"a", 1) == []
    idx.commit(b"a")
    assert idx.reserve(b"b", 1) == [b"a"]
    assert not idx.being_removed(b"a")
    idx.commit(b"b")
    assert idx.discard(b"b", removing=True) and not idx.being_removed(b"b")
    assert idx.reserve(b"a", 1) == []


def _unpin(idx: LRUIndex, k: int, pins: dict[int, int], order: list[int]) -> None:
    """The models' unpin: the last reader of an entry makes it the most recently used."""
    idx.unpin(bytes([k]))
    pins[k] -= 1
    order.remove(k)
    order.append(k)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["put", "touch", "discard", "pin", "unpin"]), st.integers(0, 7)), max_size=60)
)
def test_index_matches_a_reference_model(ops: list[tuple[str, int]]) -> None:
    """The index against a plain-list LRU model: same contents, same order, never over capacity."""
    cap = 4
    idx = LRUIndex(capacity_bytes=cap)
    order: list[int] = []  # least recent first
    pins: dict[int, int] = {}
    for op, k in ops:
        key = bytes([k])
        if op == "put":
            if k in order:
                assert idx.reserve(key, 1) is None
                order.remove(k)
                order.append(k)
                continue
            evictable = [x for x in order if not pins.get(x)]
            if len(order) + 1 > cap and not evictable:
                with pytest.raises(CapacityError):
                    idx.reserve(key, 1)
                continue
            victims = idx.reserve(key, 1)
            expected = evictable[: max(0, len(order) + 1 - cap)]
            assert victims == [bytes([x]) for x in expected]
            for x in expected:
                order.remove(x)
            idx.commit(key)
            order.append(k)
        elif op == "touch":
            idx.touch([key])
            if k in order:
                order.remove(k)
                order.append(k)
        elif op == "discard":
            assert idx.discard(key) == (k in order)
            if k in order:
                order.remove(k)
                pins.pop(k, None)
        elif op == "pin":
            assert idx.pin(key) == (k in order)
            if k in order:
                pins[k] = pins.get(k, 0) + 1
        elif op == "unpin" and pins.get(k):
            _unpin(idx, k, pins, order)
        assert idx.keys() == [bytes([x]) for x in order]
        assert idx.used_bytes == len(order) <= cap


def test_entries_passed_over_keep_their_order() -> None:
    """Pinned and still-written entries a store passes over keep their places, in order,
    whether it then fits or not."""
    idx = LRUIndex(capacity_bytes=5, track_removals=True)
    for k in (b"a", b"b", b"c", b"d", b"e"):
        assert idx.reserve(k, 1) == []
        if k != b"b":  # b is still being written
            idx.commit(k)
    assert idx.pin(b"a") and idx.pin(b"c")
    with pytest.raises(CapacityError):  # room for 2 of 3 (d, e): nothing taken
        idx.reserve(b"x", 3)
    assert idx.keys() == [b"a", b"c", b"d", b"e"] and idx.used_bytes == 5
    assert idx.reserve(b"y", 2) == [b"d", b"e"]  # a, b, c passed over
    idx.commit(b"y", [b"d", b"e"])
    assert idx.keys() == [b"a", b"c", b"y"] and idx.used_bytes == 5
    idx.commit(b"b")
    assert idx.keys() == [b"a", b"c", b"y", b"b"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["put", "hold", "commit", "pin", "unpin"]), st.integers(0, 9)), max_size=80))
def test_eviction_of_chunks_of_several_sizes_matches_a_reference_model(ops: list[tuple[str, int]]) -> None:
    """Chunks of 1-3 bytes into 7: a store evicts the oldest entries that may go (committed,
    not pinned, not being written) until it fits, passing over the others, which keep their
    place; one that cannot fit changes nothing. Writes held open ("hold", then "commit")
    take room but are neither visible nor victims."""
    cap = 7
    idx = LRUIndex(capacity_bytes=cap, track_removals=True)
    order: list[int] = []  # every entry, least recent first
    held: set[int] = set()  # reserved, not committed
    pins: dict[int, int] = {}

    def size(k: int) -> int:
        return k % 3 + 1

    for op, k in ops:
        key = bytes([k])
        if op in ("put", "hold") and k not in order:
            need = sum(map(size, order)) + size(k) - cap
            victims: list[int] = []
            for x in order:
                if need <= 0:
                    break
                if x not in held and not pins.get(x):
                    victims.append(x)
                    need -= size(x)
            if need > 0:
                with pytest.raises(CapacityError):
                    idx.reserve(key, size(k))
            else:
                assert idx.reserve(key, size(k)) == [bytes([x]) for x in victims]
                for x in victims:
                    order.remove(x)
                order.append(k)
                if op == "put":
                    idx.commit(key, [bytes([x]) for x in victims])
                else:
                    held.add(k)
                    idx.removed([bytes([x]) for x in victims])
        elif op == "put" and k not in held:  # stored already: most recent now
            assert idx.reserve(key, size(k)) is None
            order.remove(k)
            order.append(k)
        elif op == "commit" and k in held:
            idx.commit(key)
            held.discard(k)
            order.remove(k)
            order.append(k)
        elif op == "pin" and k in order and k not in held:
            assert idx.pin(key)
            pins[k] = pins.get(k, 0) + 1
        elif op == "unpin" and pins.get(k):
            _unpin(idx, k, pins, order)
        assert idx.keys() == [bytes([x]) for x in order if x not in held]
        assert idx.used_bytes == sum(map(size, order)) <= cap
        assert len(idx) == len(order) - len(held)
        assert not any(idx.being_removed(bytes([x])) for x in range(10))


class HeldMemoryTier(MemoryTier):
    """The memory tier, its reads and writes held on events when asked."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.read_gate, self.write_gate = threading.Event(), threading.Event()
        self.read_gate.set()
        self.write_gate.set()
        self.in_read, self.in_write = threading.Event(), threading.Event()

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        self.in_read.set()
        assert self.read_gate.wait(30)
        super().read_chunk(key, out)

    def write_chunk(self, key: bytes, data: memoryview) -> None:
        self.in_write.set()
        assert self.write_gate.wait(30)
        super().write_chunk(key, data)


async def test_a_late_load_leaves_a_copy_stored_since_alone() -> None:
    """A load pins K; K is removed and stored again while the load runs; the load then fails
    (not found): it must neither drop the new copy's entry nor take its pin. It used to
    discard the new reservation by key: the new copy was reported stored, lookup said no,
    and it sat on the medium outside capacity for good."""
    view = memoryview(bytearray(SPEC.total_bytes))
    tier = HeldMemoryTier(offloading_spec=SPEC, primary_kv_view=view, tier_type="memory", capacity_bytes=4 * 1024)
    async with tier:
        assert (await tier.offload([b"K"], [0])).ok
        tier.read_gate.clear()
        loading = asyncio.ensure_future(tier.load([b"K"], [1]))
        assert await asyncio.to_thread(tier.in_read.wait, 30)
        assert (await tier.remove([b"K"])).ok
        tier.write_gate.clear()
        storing = asyncio.ensure_future(tier.offload([b"K"], [2]))
        assert await asyncio.to_thread(tier.in_write.wait, 30)
        tier.read_gate.set()
        res = await loading
        assert set(res.failed) == {b"K"}
        tier.write_gate.set()
        assert (await storing).ok
        assert await tier.lookup([b"K"]) == [True]
        assert tier.stats().used_bytes == 1024 and tier.stats().stored_chunks == 1
        for i in range(4):  # fill up: K is evicted like any other, the medium stays within capacity
            assert (await tier.offload([b"x%d" % i], [3 + i])).ok
        assert len(tier._chunks) == 4 and tier.stats().used_bytes == 4 * 1024


async def test_keys_or_chunk_ids_that_are_no_sequence_are_refused_saying_what_is_accepted() -> None:
    """``offload([key], 0)`` or ``offload(None, ...)`` failed with "'int' object is not iterable"."""
    tier, _ = make()
    async with tier:
        with pytest.raises(TypeError, match=r"chunk_ids must be an ordered sequence of ints .*; got a int"):
            await tier.offload([b"a"], 0)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"keys must be an ordered sequence .*; got a NoneType"):
            await tier.load(None, [0])  # type: ignore[arg-type]
