"""The tiers' large indexes are left out of the cycle collector's traversals (asynctier/untracked.py):
only containers of objects that reference nothing, and they stay out as they grow."""

from __future__ import annotations

import gc
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest

from asynctier import untracked as untracked_mod
from asynctier.lru import LRUIndex
from asynctier.tiers.nvme import read_checkpoint, write_checkpoint
from asynctier.tiers.nvme.slots import SlotIndex
from asynctier.untracked import untracked

pytestmark = pytest.mark.skipif(untracked_mod._untrack is None, reason="asynctier._speedups not built")


def test_a_list_or_dict_of_atoms_is_left_out_and_stays_out_as_it_grows() -> None:
    from asynctier._speedups import LRUEntry

    items = untracked([b"a", 1, b""])
    assert items == [b"a", 1, b""] and not gc.is_tracked(items)
    items += [b"b"] * 10
    items.append(2)
    assert not gc.is_tracked(items)
    d: dict[bytes, Any] = untracked(OrderedDict([(b"k", LRUEntry(1, True))]))
    d[b"j"] = LRUEntry(2, False)
    d.move_to_end(b"k")
    assert not gc.is_tracked(d)
    d[b"x"] = []  # (a container goes in: CPython tracks the dict again, so no cycle through it is missed)
    assert gc.is_tracked(d)
    assert not gc.is_tracked(untracked([]))


def test_anything_that_may_reference_is_refused_and_stays_tracked() -> None:
    for bad, where in (([b"a", []], "a list holds a list at 1"), ({b"k": [1]}, "a dict holds a list at 0"),
                       (OrderedDict([((b"k", b"j"), 1)]), "OrderedDict holds a tuple at 0")):  # fmt: skip
        with pytest.raises(TypeError, match=rf"{where}; only objects that reference nothing"):
            untracked(bad)
        assert gc.is_tracked(bad)
    with pytest.raises(TypeError, match="a list or a dict, not tuple"):
        untracked((b"a",))  # type: ignore[type-var]


def test_the_nvme_index_lists_and_the_lru_entries_are_left_out(tmp_path: Path) -> None:
    """What grows with the tier: the nvme index's keys and free list (as made, rebuilt, read
    back from a checkpoint and copied for one), the fs and memory tiers' LRU entries."""
    idx = SlotIndex(1000)
    idx.rebuild_free()
    for s in range(0, 1000, 7):
        idx.slot_key[s] = b"key-%d" % s
    idx.rebuild_free()
    assert not gc.is_tracked(idx.slot_key) and not gc.is_tracked(idx.free)
    ck = idx.snapshot(b"s" * 16, 1)
    assert ck.slot_key == idx.slot_key and not gc.is_tracked(ck.slot_key)
    write_checkpoint(tmp_path / "ck", ck)
    back = read_checkpoint(tmp_path / "ck")
    assert back is not None
    again = SlotIndex(1000)
    again.load(back)
    assert again.slot_key == idx.slot_key and not gc.is_tracked(again.slot_key)
    lru = LRUIndex(1 << 20)
    for i in range(100):
        lru.reserve(b"k%d" % i, 10)
        lru.commit(b"k%d" % i)
    lru.pin(b"k3")
    assert not gc.is_tracked(lru._entries) and len(lru) == 100
    assert not gc.get_referrers(idx.slot_key[7])  # (the collector's own view: nothing it tracks holds the key)


def test_the_chains_removal_stamps_are_left_out() -> None:
    """A chain's removal fence keeps up to 65,536 stamps (key -> int) as long as the chain lives."""
    from asynctier.tiers.chain.background import RemovalFence

    fence = RemovalFence()
    for ks in ([b"r%d" % i for i in range(1000)], [b"r1", b"s1"]):
        fence.removing(ks)
        fence.removed(ks)
    assert not gc.is_tracked(fence._removed_at) and fence.stale(b"r1", 1)
