"""The C twins of the LRU index's group steps (asynctier/_speedups_lru.c) do what their Python
references in asynctier/lru.py do: from random states, the same index after and the same
answers, a group's reservations made in one call where they are plain and one key at a time
where they are not (a key stored or being removed, an entry passed over, no room)."""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import pytest

from asynctier import lru
from asynctier.errors import CapacityError
from asynctier.lru import LRUIndex, RemovalPending

NBYTES = 100


@pytest.fixture(autouse=True, params=["LRUEntry", "_PyEntry"])
def entry_type(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Any]]:
    """Each test with the index's entries of either type: the twins read and make both."""
    kind = pytest.importorskip("asynctier._speedups").LRUEntry if request.param == "LRUEntry" else lru._PyEntry
    monkeypatch.setattr(lru, "_Entry", kind)
    yield kind


def clone(idx: LRUIndex) -> LRUIndex:
    out = LRUIndex(idx.capacity_bytes, track_removals=idx.track_removals)
    out._entries = OrderedDict()
    for k, e in idx._entries.items():
        c = lru._Entry(e.nbytes, e.committed, e.writers)
        c.pins = e.pins
        out._entries[k] = c
    out._removing = dict.fromkeys(idx._removing)
    out._used, out._committed = idx._used, idx._committed
    return out


def state(idx: LRUIndex) -> tuple[Any, ...]:
    entries = [(k, e.nbytes, e.committed, e.writers, e.pins) for k, e in idx._entries.items()]
    return entries, sorted(idx._removing), idx._used, idx._committed


def answer(a: object) -> object:
    return (type(a).__name__, getattr(a, "key", None)) if isinstance(a, Exception) else a


def random_index(rng: random.Random) -> LRUIndex:
    """An index after a random history of stores (some of other sizes), loads (pins), writes
    in flight, removals in progress."""
    cap = rng.choice((None, 4 * NBYTES, 20 * NBYTES, 30 * NBYTES + 50))
    idx = LRUIndex(cap, track_removals=rng.random() < 0.7)
    for _ in range(rng.randrange(10, 120)):
        k = b"k%d" % rng.randrange(60)
        r = rng.random()
        try:
            if r < 0.5:
                victims = idx.reserve(k, rng.choice((NBYTES, NBYTES, 60, 250)))
                if victims is not None and rng.random() < 0.9:
                    idx.commit(k, victims if rng.random() < 0.7 else ())
            elif r < 0.65:
                idx.pin(k)
            elif r < 0.75:
                idx.unpin(k)
            elif r < 0.85:
                idx.begin_remove(k)
            else:
                idx.removed([k])
        except (CapacityError, RemovalPending):
            pass
    return idx


@pytest.mark.parametrize("seed", range(4))
def test_a_groups_reservations_and_commits_match_the_references(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    c = pytest.importorskip("asynctier._speedups")
    rng = random.Random(seed)
    for _ in range(80):
        idx = random_index(rng)
        keys = [b"k%d" % rng.randrange(90) for _ in range(rng.randrange(0, 12))]
        keys = list(dict.fromkeys(keys))  # distinct within a call, as the fs tier's are
        ref = clone(idx)
        monkeypatch.setattr(lru, "_reserve_plain", c.lru_reserve_plain)
        got = idx.reserve_many(keys, NBYTES)
        monkeypatch.setattr(lru, "_reserve_plain", lru.reserve_plain)
        want = ref.reserve_many(keys, NBYTES)
        assert list(map(answer, got)) == list(map(answer, want))
        assert state(idx) == state(ref)
        done = [k for k, a in zip(keys, got, strict=True) if isinstance(a, list)]
        removed = [v for a in got if isinstance(a, list) for v in a]
        ok = rng.sample(done, k=len(done) // 2 + 1) if done else [b"absent"]
        monkeypatch.setattr(lru, "_commit_all", c.lru_commit_all)
        monkeypatch.setattr(lru, "_removed_all", c.lru_removed_all)
        idx.commit_many(ok, removed)
        monkeypatch.setattr(lru, "_commit_all", lru.commit_all)
        monkeypatch.setattr(lru, "_removed_all", lru.removed_all)
        ref.commit_many(ok, removed)
        assert state(idx) == state(ref)
        assert all(type(e) is lru._Entry for e in idx._entries.values())


def test_the_plain_reservation_stops_where_the_usual_way_takes_over() -> None:
    c = pytest.importorskip("asynctier._speedups")
    idx = LRUIndex(3 * NBYTES, track_removals=True)
    for k in (b"a", b"b", b"c"):
        idx.commit(k, idx.reserve(k, NBYTES) or ())
    idx.pin(b"a")  # the oldest is passed over: not plain
    out: list[Any] = []
    assert c.lru_reserve_plain(idx, lru._Entry, [b"x"], 0, NBYTES, out) == 0 and out == []
    idx.unpin(b"a", touch=False)
    assert c.lru_reserve_plain(idx, lru._Entry, [b"x", b"b", b"y"], 0, NBYTES, out) == 1  # b is stored
    assert out == [[b"a"]] and idx.being_removed(b"a") and idx.used_bytes == 3 * NBYTES
    assert c.lru_reserve_plain(idx, lru._Entry, [b"x", b"a"], 1, NBYTES, out) == 0  # a is being removed
    assert c.lru_reserve_plain(idx, lru._Entry, [b"big"], 0, 4 * NBYTES, out) == 0  # never fits
    with pytest.raises(ValueError, match="out is a list"):
        c.lru_reserve_plain(idx, lru._Entry, [b"z"], 0, NBYTES, ())
    with pytest.raises(TypeError, match="takes 6 arguments"):
        c.lru_reserve_plain(idx, lru._Entry, [b"z"], 0, NBYTES)
    assert idx.used_bytes == 3 * NBYTES and len(out) == 1


@pytest.mark.parametrize("seed", range(3))
def test_a_groups_pins_and_their_ends_match_the_references(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    """Pins of committed keys (absent and reserved ones get None), then their ends, some keys
    removed or stored again meanwhile: the same index and answers as the references."""
    c = pytest.importorskip("asynctier._speedups")
    rng = random.Random(100 + seed)
    for _ in range(80):
        idx = random_index(rng)
        keys = list(dict.fromkeys(b"k%d" % rng.randrange(90) for _ in range(rng.randrange(0, 12))))
        ref = clone(idx)
        monkeypatch.setattr(lru, "_pin_all", c.lru_pin_all)
        got = idx.pin_entries(keys)
        monkeypatch.setattr(lru, "_pin_all", lru.pin_all)
        want = ref.pin_entries(keys)
        assert [g is None for g in got] == [w is None for w in want]
        assert state(idx) == state(ref)
        pinned = [(k, g, w) for k, g, w in zip(keys, got, want, strict=True) if g is not None]
        for k, _, _ in rng.sample(pinned, k=len(pinned) // 3):  # gone meanwhile, some stored again
            again = rng.random() < 0.5
            for side in (idx, ref):
                side.discard(k)
                if again:
                    try:
                        side.commit(k, side.reserve(k, NBYTES) or ())
                    except CapacityError:  # (the same on both sides)
                        pass
        monkeypatch.setattr(lru, "_unpin_all", c.lru_unpin_all)
        idx.unpin_entries([k for k, _, _ in pinned], [g for _, g, _ in pinned])
        monkeypatch.setattr(lru, "_unpin_all", lru.unpin_all)
        ref.unpin_entries([k for k, _, _ in pinned], [w for _, _, w in pinned])
        assert state(idx) == state(ref)
        assert [g.pins for _, g, _ in pinned] == [w.pins for _, _, w in pinned]  # type: ignore[attr-defined]
    idx = random_index(rng)
    with pytest.raises(TypeError, match="not an entry"):
        c.lru_unpin_all(idx, lru._Entry, [b"k1"], [object()])
    with pytest.raises(ValueError, match="1 keys and 0 entries"):
        c.lru_unpin_all(idx, lru._Entry, [b"k1"], [])


def test_the_end_of_a_removal_wakes_the_write_that_waits_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """removed_all and its twin: each key leaves ``_removing``; a waiter's event is set; keys
    not being removed are passed over."""
    c = pytest.importorskip("asynctier._speedups")
    for removed_all in (c.lru_removed_all, lru.removed_all):
        monkeypatch.setattr(lru, "_removed_all", removed_all)
        idx = LRUIndex(2 * NBYTES, track_removals=True)
        for k in (b"a", b"b"):
            idx.commit(k, idx.reserve(k, NBYTES) or ())
        assert idx.reserve(b"c", NBYTES) == [b"a"]
        idx.commit(b"c")  # a's deletion not over yet
        assert idx.being_removed(b"a")
        with pytest.raises(RemovalPending) as info:
            idx.reserve(b"a", NBYTES)
        waiter = info.value
        woke = threading.Thread(target=waiter.wait, args=(5.0,))
        woke.start()
        idx.removed([b"zz", b"a"])
        woke.join(5.0)
        assert not woke.is_alive() and waiter.done.is_set() and not idx.being_removed(b"a")
        idx.removed([b"a"])  # harmless again
    with pytest.raises(TypeError, match="takes 2 arguments"):
        c.lru_removed_all(idx)


def test_the_c_entry_has_the_references_attributes_and_refuses_wrong_types() -> None:
    c = pytest.importorskip("asynctier._speedups")
    e = c.LRUEntry(7, False, 2)
    ref = lru._PyEntry(7, False, 2)
    names = ("nbytes", "committed", "writers", "pins")
    assert [getattr(e, n) for n in names] == [getattr(ref, n) for n in names] == [7, False, 2, 0]
    assert c.LRUEntry(nbytes=3, committed=True).writers == 0
    e.pins += 1
    e.committed = True
    assert repr(e) == "LRUEntry(nbytes=7, committed=True, writers=2, pins=1)"
    with pytest.raises(TypeError, match="bool"):
        e.committed = 1  # as a flag, only a bool
    with pytest.raises(TypeError):
        e.pins = "1"
    with pytest.raises(AttributeError):
        e.other = 1
    with pytest.raises(TypeError):
        c.LRUEntry("7", False)
