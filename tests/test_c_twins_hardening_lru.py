"""The C twins of the LRU index's group steps (asynctier/_speedups_lru.c) stay memory safe and
match their references in asynctier/lru.py when Python code runs midway: an entry type, an
entry's getters or a dict key's ``__eq__`` that changes the caller's list of keys or drops the
index's entry. Each such case runs in a subprocess, so that a crash fails the test; the
reference runs there too and the two outcomes are compared. Also: sizes past a long long, a
failed write of ``committed``, and the counts written back while an error is pending."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest

from asynctier import lru
from asynctier.errors import CapacityError
from asynctier.lru import LRUIndex

c: Any = pytest.importorskip("asynctier._speedups")

# What each script starts with: the twin under test is named by the first argument.
PROLOGUE = """
import sys
from collections import OrderedDict
from asynctier import lru, _speedups as c
MODE = sys.argv[1]
def twin(name):
    return getattr(lru, name) if MODE == "py" else getattr(c, "lru_" + name)
def outcome(call):
    try:
        return "returned %r" % (call(),)
    except Exception as ex:
        return "raised %s: %s" % (type(ex).__name__, ex)
"""


def run(script: str, mode: str) -> str:
    """What ``script`` prints with the reference (``py``) or the twin (``c``); it must exit 0."""
    code = PROLOGUE + textwrap.dedent(script)
    proc = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{mode}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout


def assert_same_as_reference(script: str) -> str:
    want = run(script, "py")
    assert run(script, "c") == want
    return want


def test_reserve_plain_survives_an_entry_type_that_empties_the_keys() -> None:
    """The entry type clears the caller's list of keys: the twin goes on with the keys it was
    given, as the reference does with its slice of them."""
    out = assert_same_as_reference(
        """
        keys = [b"a", b"b", b"c"]
        def etype(n, committed, writers):
            keys.clear()
            return lru._PyEntry(n, committed, writers)
        idx = lru.LRUIndex(None)
        got = outcome(lambda: twin("reserve_plain")(idx, etype, keys, 0, 10, []))
        print(got, list(idx._entries), idx._used)
        """
    )
    assert out.split() == ["returned", "3", "[b'a',", "b'b',", "b'c']", "30"]


def test_pin_all_survives_a_getter_that_empties_the_keys() -> None:
    """An entry's ``committed`` getter clears the caller's list: the twin stops where the
    reference's loop over that list stops, and holds each entry it returns."""
    out = assert_same_as_reference(
        """
        class E:
            pins = 0
            @property
            def committed(self):
                keys.clear()
                return True
        keys = [b"a", b"b", b"c"]
        idx = lru.LRUIndex(None)
        for k in keys:
            idx._entries[k] = E()
        got = twin("pin_all")(idx, keys)
        print([type(e).__name__ for e in got], [e.pins for e in idx._entries.values()])
        """
    )
    assert out.strip() == "['E'] [1, 0, 0]"


def test_unpin_all_survives_a_getter_that_empties_keys_and_entries() -> None:
    """An entry's ``pins`` getter clears both caller's lists: the twin stops where the
    reference's zip over them stops."""
    assert_same_as_reference(
        """
        class E:
            def __init__(self):
                self._p = 1
            @property
            def pins(self):
                keys.clear()
                ents.clear()
                return self._p
            @pins.setter
            def pins(self, v):
                self._p = v
        keys = [b"a", b"b", b"c"]
        ents = [E(), E(), E()]
        held = list(ents)
        idx = lru.LRUIndex(None)
        for k, e in zip(keys, ents):
            idx._entries[k] = e
        got = outcome(lambda: twin("unpin_all")(idx, E, keys, ents))
        print(got, [e._p for e in held], list(idx._entries))
        """
    )


def test_commit_all_holds_a_key_the_caller_drops_midway() -> None:
    """An entry's ``writers`` getter drops the list's reference to the key (its only one) and
    fills memory: the twin still moves that key, not what was freed, to the end."""
    out = assert_same_as_reference(
        """
        log, junk = [], []
        class E:
            __slots__ = ("nbytes", "committed", "pins", "_w")
            def __init__(self):
                self.nbytes, self.committed, self.pins, self._w = 1, False, 0, 1
            @property
            def writers(self):
                keys.clear()
                junk.extend(b"%029d" % i for i in range(2000))
                return self._w
            @writers.setter
            def writers(self, v):
                self._w = v
        class OD(OrderedDict):
            def move_to_end(self, key, last=True):
                log.append(key)
                return OrderedDict.move_to_end(self, key, last)
        idx = lru.LRUIndex(None)
        idx._entries = OD()
        idx._entries[b"%029d" % 10**28] = E()
        idx._entries[b"b"] = E()
        keys = [b"%029d" % 10**28]
        got = outcome(lambda: twin("commit_all")(idx, keys))
        print(got, log, [(k, e.committed, e._w) for k, e in idx._entries.items()], idx._committed)
        """
    )
    assert out.startswith("returned None [b'1")


def test_removed_all_holds_a_key_the_caller_drops_midway() -> None:
    """A stored key's ``__eq__`` (run by the lookup) drops the list's reference to the key
    and fills memory: the twin still removes that key, as the reference does."""
    out = assert_same_as_reference(
        """
        seen, junk = set(), []
        class Stored:
            def __init__(self, h):
                self.h = h
            def __hash__(self):
                return self.h
            def __eq__(self, o):
                keys.clear()
                junk.extend(b"%029d" % i for i in range(2000))
                seen.add(repr(o))  # (not o: that would hold it)
                return True
        key = b"%029d" % 10**28
        idx = lru.LRUIndex(None, track_removals=True)
        idx._removing[Stored(hash(key))] = None
        idx._removing[b"other"] = None
        keys = [key]
        del key
        got = outcome(lambda: twin("removed_all")(idx, keys))
        print(got, sorted(seen), sorted(map(repr, idx._removing)))
        """
    )
    assert out.strip() == "returned None [\"b'10000000000000000000000000000'\"] [\"b'other'\"]"


@pytest.mark.parametrize("step", ["pin_all", "reserve_plain"])
def test_an_entry_its_getter_drops_from_the_index_stays_readable(step: str) -> None:
    """An entry's ``committed`` getter pops it from the index (its only reference): the twin
    reads its other attributes from the live entry, with the reference's outcome."""
    assert_same_as_reference(
        f"""
        log = []
        class E:
            def __init__(self, k):
                self.k, self._pins, self.writers, self.nbytes = k, 0, 0, 10
            @property
            def committed(self):
                idx._entries.pop(self.k, None)
                log.append("committed read")
                return True
            @property
            def pins(self):
                log.append("pins read")
                return self._pins
            @pins.setter
            def pins(self, v):
                self._pins = v
            def __del__(self):
                log.append("entry freed")
        step = {step!r}
        idx = lru.LRUIndex(15 if step == "reserve_plain" else None)
        idx._entries[b"a"] = E(b"a")
        idx._used, idx._committed = 10, 1
        if step == "pin_all":
            got = outcome(lambda: [type(x).__name__ for x in twin("pin_all")(idx, [b"a"])])
        else:
            got = outcome(lambda: twin("reserve_plain")(idx, lru._PyEntry, [b"x"], 0, 10, []))
        print(got, log, list(idx._entries), idx._used, idx._committed)
        """
    )


def _reserved(reserve_plain: Any, cap: int | None, used: int, nbytes: int, keys: list[bytes]) -> tuple[Any, ...]:
    """reserve_many of ``keys`` with ``reserve_plain`` doing the plain part: the answers and the index after."""
    idx = LRUIndex(cap)
    idx.commit(b"a", idx.reserve(b"a", 1) or ())
    idx._used = used
    old = lru._reserve_plain
    lru._reserve_plain = reserve_plain
    try:
        got = idx.reserve_many(keys, nbytes)
    finally:
        lru._reserve_plain = old
    answers = [type(a).__name__ if isinstance(a, CapacityError) else a for a in got]
    return answers, idx._used, idx._committed, list(idx._entries)


@pytest.mark.parametrize(
    ("cap", "used", "nbytes", "keys"),
    [
        (1000, 100, 2**63 - 1, [b"x"]),  # used + nbytes past a long long: CapacityError, as the reference
        (None, 2**62, 2**62, [b"x"]),  # no capacity: _used past a long long, as Python's ints go
        (None, 0, 2**62, [b"x", b"y"]),  # the second key's room past it
        (2**63 - 1, 2**63 - 2, 2, [b"x"]),  # evicting: the room check past it
    ],
)
def test_reservations_past_a_long_long_are_the_references(
    cap: int | None, used: int, nbytes: int, keys: list[bytes]
) -> None:
    """Sizes whose sums do not fit a long long: the twin leaves them to the caller's Python
    path, so that a group's answers and the index are the reference's (no wrapped count)."""
    want = _reserved(lru.reserve_plain, cap, used, nbytes, keys)
    assert _reserved(c.lru_reserve_plain, cap, used, nbytes, keys) == want
    idx = LRUIndex(1000)
    idx._used = 100
    assert c.lru_reserve_plain(idx, lru._PyEntry, [b"x"], 0, 2**63 - 1, []) == 0 and idx._used == 100


class _Uncommittable:
    """An entry whose ``committed`` cannot be set."""

    __slots__ = ("_c", "nbytes", "pins", "writers")

    def __init__(self) -> None:
        self.nbytes, self.writers, self.pins, self._c = 10, 1, 0, False

    @property
    def committed(self) -> bool:
        return self._c

    @committed.setter
    def committed(self, v: bool) -> None:
        raise RuntimeError("no")


def test_commit_all_counts_an_entry_only_once_it_is_committed() -> None:
    """Setting an entry's ``committed`` fails: the error comes out and ``_committed`` is not
    counted up, as with the reference."""
    results = []
    for commit_all in (lru.commit_all, c.lru_commit_all):
        idx = LRUIndex(None)
        idx._entries[b"a"] = _Uncommittable()  # type: ignore[assignment]
        idx._used = 10
        with pytest.raises(RuntimeError, match="no"):
            commit_all(idx, [b"a"])
        results.append((idx._committed, idx._entries[b"a"].writers))
    assert results[1] == results[0] == (0, 0)


class _SetattrIndex(LRUIndex):
    """An index whose attributes are set by Python code (a ``__setattr__``)."""

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


class _WritersFail:
    __slots__ = ("committed", "nbytes", "pins")

    def __init__(self) -> None:
        self.nbytes, self.committed, self.pins = 1, False, 0

    @property
    def writers(self) -> int:
        raise ValueError("writers failed")


def _entry_type_fails(nbytes: int, committed: bool, writers: int) -> Any:
    raise ValueError("entry type failed")


@pytest.mark.parametrize("step", ["reserve_plain", "commit_all"])
def test_an_error_comes_out_as_is_past_the_counts_written_back(step: str) -> None:
    """An error midway, then the counts written back through a Python ``__setattr__``: the
    error comes out unchanged (not a SystemError), with the reference's counts."""
    results = []
    for impl in ("py", "c"):
        fn = getattr(lru, step) if impl == "py" else getattr(c, "lru_" + step)
        idx = _SetattrIndex(None)
        with pytest.raises(ValueError, match="failed") as info:
            if step == "reserve_plain":
                fn(idx, _entry_type_fails, [b"x"], 0, 10, [])
            else:
                idx._entries[b"a"] = _WritersFail()  # type: ignore[assignment]
                fn(idx, [b"a"])
        assert info.value.__context__ is None
        results.append((str(info.value), idx._used, idx._committed, list(idx._entries)))
    assert results[1] == results[0]


class _Key(bytes):
    """A bytes subclass: its ``__hash__`` and ``__eq__`` would run Python code in a lookup."""

    __hash__ = bytes.__hash__


@pytest.mark.parametrize("step", ["commit_all", "pin_all", "unpin_all", "removed_all"])
def test_a_key_other_than_bytes_is_refused_before_any_change(step: str) -> None:
    """A key that is not exact bytes (a subclass, a str) is refused with TypeError before the
    twin changes anything: each lookup's Python code would run between its checks and writes."""
    idx = LRUIndex(None, track_removals=True)
    for k in (b"a", b"b"):
        idx.commit(k, idx.reserve(k, 1) or ())
    idx._removing[b"a"] = None
    pinned = idx.pin_entries([b"a", b"b"])
    before = [(k, e.committed, e.writers, e.pins) for k, e in idx._entries.items()], dict(idx._removing)
    for bad in (_Key(b"b"), "b"):
        keys = [b"a", bad]
        with pytest.raises(TypeError, match="a key is bytes"):
            if step == "unpin_all":
                c.lru_unpin_all(idx, lru._Entry, keys, pinned)
            else:
                getattr(c, "lru_" + step)(idx, keys)
        after = [(k, e.committed, e.writers, e.pins) for k, e in idx._entries.items()], dict(idx._removing)
        assert after == before
