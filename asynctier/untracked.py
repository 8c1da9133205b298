"""Large indexes left out of the cycle collector's traversals.

A tier's index can hold an item per chunk: the nvme tier's per-slot keys and free list, the
fs tier's LRU entries, a million of each on a large tier. The collector reads every tracked
container it collects, holding the GIL, on whichever thread triggered it: the first young
collections after such a list is made, and every full collection for as long as it lives
(``bench/bench_gc.py``; figures in docs/benchmarks-issue-28.md, twenty-third pass). These
containers hold only bytes, ints and the fs index's entries, none of which references
anything, so they can be in no reference cycle and need not be traversed. CPython leaves
such dicts untracked by itself; not lists or OrderedDicts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["untracked"]

_C = TypeVar("_C", bound="list[Any] | dict[Any, Any]")

_untrack: Callable[[list[Any] | dict[Any, Any]], None] | None
try:
    from asynctier._speedups import untrack as _untrack
except ImportError:  # pragma: no cover - installed without a C compiler
    _untrack = None


def untracked(index: _C) -> _C:
    """``index``, a list or dict whose items (keys and values) reference nothing (bytes, ints),
    no longer traversed by the cycle collector where the C speedups are built (else as it is:
    Python cannot untrack an object). Raises :class:`TypeError` if it holds anything else.

    Keep it so: a list stays untracked whatever is put in it later (a dict is tracked again
    once a container goes in)."""
    if _untrack is not None:
        _untrack(index)
    return index
