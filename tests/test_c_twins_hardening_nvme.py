"""The C twins of the nvme index steps (asynctier/_speedups_nvme*.c) hold on edges where they
once crashed or parted from their references (asynctier/tiers/nvme/bulk.py): counts far past
the index's slots, arguments whose conversion runs Python code (``__index__``, a bytes
subclass's ``__hash__``), a general-path ``SlotIndex.put`` that fails midway, numbers at the
edge of 64 bits and a killed write without a checksum. A crash would take pytest with it: those
run in a subprocess."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_c_twins_nvme import clone, state

from asynctier.tiers.nvme import bulk
from asynctier.tiers.nvme.slots import SlotIndex

# what each subprocess starts with: the twins, the references and the tests' index helpers
_PRELUDE = f"""
import gc, sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from asynctier import _speedups as sp
from asynctier.tiers.nvme import bulk
from asynctier.tiers.nvme.slots import SlotIndex
from test_c_twins_nvme import clone, state

def full_index(n):
    idx = SlotIndex(n)
    idx.rebuild_free()
    taken = idx.take_free(n)
    keys = [b"key%05d" % i for i in range(n)]
    bulk.begin_writes(idx, keys, taken, 1)
    slots = {{p: (s, 1 + p) for p, s in enumerate(taken)}}
    recs = bulk.end_writes(idx, keys, list(slots), slots, {{p: 7 for p in slots}})
    bulk.put_published(idx, recs, 1)
    return idx

def churn():  # allocations that trip over a heap written out of bounds
    x = [bytes(50) * i for i in range(2000)]
    del x
    gc.collect()
"""


def _run(script: str) -> str:
    """Run the prelude and ``script`` in a fresh interpreter; its stdout, once it exited 0."""
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + textwrap.dedent(script)], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    return proc.stdout


@pytest.mark.parametrize("n, more", [(2**61, 0), (sys.maxsize, 1), (sys.maxsize, 0), (2**40, 2**40)])
def test_evicting_far_more_than_the_index_holds_evicts_what_the_reference_does(
    speedups: Any, n: int, more: int
) -> None:
    """evict_oldest with n and more past the index's slots (their sum past Py_ssize_t, its
    bytes past size_t): no heap overflow, no MemoryError; every unpinned slot evicted, the
    same records and index as the reference's."""
    out = _run(f"""
        idx = full_index(4096)
        idx.pins[5] = 1
        ref = clone(idx)
        got = sp.evict_oldest(idx, {n}, {more})
        want = bulk.evict_oldest(ref, {n}, {more})
        churn()
        assert got == want, (len(got), len(want))
        assert state(idx) == state(ref)
        print("evicted", len(got))
    """)
    assert out.split() == ["evicted", "4095"]


# each twin called with an element whose __index__ empties the list it lies in (the caller's
# own list, or the index's free list) and drops what it held
_REENTRANT_CALLS = {
    "take_free": "idx.free[0] = Evil(idx.free); args = (2, 128)",
    "release_many": "slots = [0] + [1] * 20000; slots[0] = Evil(slots); args = (slots, 1)",
    "begin_writes": "taken = [0] + [1] * 20000; taken[0] = Evil(taken); args = ([b'k'] * 20001, taken, 1)",
    "unpin_many": "idx.pins[1] = 20001; slots = [0] + [1] * 20000; slots[0] = Evil(slots); args = (slots,)",
    "put_published": "recs = [(b'a', 0, 1, 0)] + [(b'b', 1, 1, 0)] * 20000; recs[0] = (b'a', Evil(recs), 1, 0);"
    " args = (recs, 1)",
    "end_writes": "written = [0] + [1] * 20000; written[0] = Evil(written);"
    " args = ([b'a', b'b'], written, {0: (0, 1), 1: (1, 1)}, {0: 0, 1: 0})",
}


@pytest.mark.parametrize("name", sorted(_REENTRANT_CALLS))
def test_an_argument_that_would_run_python_code_is_refused_before_anything_changes(speedups: Any, name: str) -> None:
    """A slot or position that is not an exact int (its __index__ here empties the list the
    twin reads, a use after free once) is refused with TypeError before it is converted: no
    crash, __index__ never called, the index as it was."""
    out = _run(f"""
        calls = []
        class Evil:
            def __init__(self, lst):
                self.lst = lst
            def __index__(self):
                calls.append(1)
                del self.lst[:]
                gc.collect()
                return 0
        idx = SlotIndex(64)
        idx.rebuild_free()
        {_REENTRANT_CALLS[name]}
        before = state(clone(idx))
        try:
            sp.{name}(idx, *args)
        except TypeError as e:
            assert "an int is expected" in str(e), e
            print("refused")
        churn()
        assert not calls, "__index__ ran"
        assert state(idx) == before
    """)
    assert out.split() == ["refused"]


def test_a_bytes_subclass_key_is_refused_by_pin_many_before_it_is_hashed(speedups: Any) -> None:
    """pin_many takes exact bytes keys: a subclass's __hash__ (Python code, in the middle of
    the pins) never runs; TypeError, the index as it was."""
    hashed: list[bytes] = []

    class Key(bytes):
        def __hash__(self) -> int:
            hashed.append(self)
            return super().__hash__()

    idx = SlotIndex(8)
    idx.put_many([(b"a", 0), (b"b", 1)])
    before = state(clone(idx))
    with pytest.raises(TypeError, match="a key is bytes"):
        speedups.pin_many(idx, [b"a", Key(b"b")])
    assert not hashed
    assert state(idx) == before


def _both_raise(speedups: Any, idx: SlotIndex, name: str, *args: Any) -> type[BaseException]:
    """Run ``name`` as the C twin on ``idx`` and as the reference on a copy, both expected to
    raise: the same exception type, the same index left behind."""
    ref = clone(idx)
    with pytest.raises(Exception) as got:
        getattr(speedups, name)(idx, *args)
    with pytest.raises(Exception) as want:
        getattr(bulk, name)(ref, *args)
    assert got.type is want.type
    assert state(idx) == state(ref)
    return got.type


def _both(speedups: Any, idx: SlotIndex, name: str, *args: Any) -> Any:
    """Run ``name`` as the C twin on ``idx`` and as the reference on a copy: the same result,
    the same index after."""
    ref = clone(idx)
    got = getattr(speedups, name)(idx, *args)
    assert got == getattr(bulk, name)(ref, *args)
    assert state(idx) == state(ref)
    return got


def test_a_general_put_that_fails_midway_leaves_the_ends_it_made(speedups: Any) -> None:
    """put_published: a record on the fast path, then one that SlotIndex.put takes and fails
    in (an index broken at slot 2) after moving the LRU ends: the twin leaves put's ends, as
    the reference does, not the ones it held before put ran."""
    idx = SlotIndex(8)
    idx.put_many([(b"a", 0), (b"b", 1), (b"c", 2)])
    idx.prev[2] = 100
    assert _both_raise(speedups, idx, "put_published", [(b"d", 3, 1, 0), (b"c", 0, 2, 0)], 1) is IndexError
    assert idx.slot_key[idx.head] == b"b"


def test_numbers_past_64_bits_are_refused_before_anything_changes(speedups: Any) -> None:
    """Tickets and sequence numbers counted up from first past 2**64 - 1 (wrapped to 0 once)
    are refused with OverflowError, the index as it was; up to 2**64 - 1 they match the
    reference."""
    top = 2**64 - 1
    for name, args in [
        ("release_many", ([3, 4], top)),
        ("begin_writes", ([b"a", b"b"], [0, 1], top)),
        ("put_published", ([(b"a", 0, 1, 0), (b"b", 1, 2, 0)], top)),
    ]:
        idx = SlotIndex(8)
        before = state(clone(idx))
        with pytest.raises(OverflowError, match="pass 2"):
            getattr(speedups, name)(idx, *args)
        assert state(idx) == before, name
    idx = SlotIndex(8)
    _both(speedups, idx, "release_many", [3, 4], top - 1)
    assert _both(speedups, idx, "begin_writes", [b"a", b"b"], [3, 4], top - 1) == top
    _both(speedups, idx, "put_published", [(b"a", 3, top - 1, 0), (b"b", 4, top, 0)], top - 1)
    assert list(idx.slot_seq[3:5]) == list(idx.slot_ticket[3:5]) == [top - 1, top]


def test_a_killed_mark_is_compared_as_the_reference_compares_it(speedups: Any) -> None:
    """end_writes reads killed[key] as the Python int it is: a mark of 2**63 and more (a
    sequence number of 64 bits) kills the writes numbered up to it, a negative one none."""
    for killed in (2**63, 2**64 - 1, 2**64 + 5, 2**200, 0, -1, -(2**70)):
        for seq in (2, 2**63, 2**64 - 1):
            idx = SlotIndex(8)
            idx.writing[b"a"] = 1
            idx.killed[b"a"] = killed
            _both(speedups, idx, "end_writes", [b"a"], [0], {0: (2, seq)}, {0: 5})


def test_a_killed_write_needs_no_checksum(speedups: Any) -> None:
    """end_writes reads csums[p] only for a write that gets a record, as the reference does:
    a killed write without one frees its slot; a record without one fails with KeyError
    where the reference fails, leaving the same index."""
    idx = SlotIndex(8)
    idx.writing[b"a"] = 1
    idx.killed[b"a"] = 10
    assert _both(speedups, idx, "end_writes", [b"a"], [0], {0: (2, 5)}, {}) == []
    assert idx.free == [2]
    idx = SlotIndex(8)
    idx.writing.update({b"a": 1, b"b": 1})
    idx.killed[b"a"] = 10
    csums: dict[int, int] = {}
    assert _both_raise(speedups, idx, "end_writes", [b"a", b"b"], [0, 1], {0: (2, 5), 1: (3, 6)}, csums) is KeyError
    assert idx.free == [2] and not idx.writing
