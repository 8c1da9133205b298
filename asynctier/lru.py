"""A thread-safe in-memory index of stored chunks with LRU eviction under a byte capacity.

Tiers that know what they hold (memory, fs) keep one; it answers ``lookup`` in O(1) and
decides what to evict. Entries go through three stages: *reserved* (a write is in progress;
invisible to lookups; its bytes already counted so the medium never exceeds capacity),
*committed* (visible), and gone. Readers *pin* an entry so eviction never removes a chunk
that is being read.

With ``track_removals=True`` a key that leaves the index for the caller to delete from its
medium (an eviction victim, a removed key, a bad copy) stays *being removed* until the
caller says :meth:`~LRUIndex.removed`: a new write of that key must not publish its copy
before the old one's deletion is over, or the deletion would take the new copy with it.
:meth:`~LRUIndex.reserve` raises :class:`RemovalPending` meanwhile; wait on it, then reserve
again.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any, TypeVar, cast

from .errors import CapacityError
from .untracked import untracked

if TYPE_CHECKING:
    from _typeshed import SupportsRichComparison

__all__ = [
    "LRUIndex",
    "RemovalPending",
    "commit_all",
    "pin_all",
    "removed_all",
    "reserve_plain",
    "sorted_in_pieces",
    "unpin_all",
]

#: entries a recovery merge adds per hold of the index lock (about a millisecond)
MERGE_STEP = 1024

_T = TypeVar("_T", bound="SupportsRichComparison")


def sorted_in_pieces(items: Iterable[_T], piece: int = MERGE_STEP) -> Iterator[_T]:
    """``sorted(items)``, lazily: pieces of ``piece`` items sorted on their own, then merged.

    A recovery's finds are sorted on a thread while the event loop runs: one ``sorted`` of
    them all is one call holding the GIL (a million tuples: 0.8 s). A piece is well under a
    millisecond, and the merge runs as Python, which hands the GIL over."""
    it = iter(items)
    pieces: list[list[_T]] = []
    while chunk := list(islice(it, piece)):
        chunk.sort()
        pieces.append(chunk)
    return heapq.merge(*pieces)


class RemovalPending(Exception):
    """The key's previous copy is still being deleted from the medium: :meth:`wait`, then retry."""

    def __init__(self, key: bytes, done: threading.Event) -> None:
        super().__init__(f"chunk {key.hex()[:32]} is being removed")
        self.key = key
        self.done = done

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the removal is over (or ``timeout`` seconds); whether it is over."""
        return self.done.wait(timeout)


class _PyEntry:
    """An entry (the reference of ``asynctier._speedups.LRUEntry``, which the index uses when
    it is built: made and read without Python calls)."""

    __slots__ = ("committed", "nbytes", "pins", "writers")

    def __init__(self, nbytes: int, committed: bool, writers: int = 0) -> None:
        self.nbytes = nbytes
        self.committed = committed
        self.writers = writers
        self.pins = 0


class LRUIndex:
    """Key -> stored size, least recently used first; ``capacity_bytes=None`` never evicts."""

    def __init__(self, capacity_bytes: int | None = None, *, track_removals: bool = False) -> None:
        self.capacity_bytes = capacity_bytes
        #: keys handed out for deletion stay "being removed" until :meth:`removed` (see the module doc)
        self.track_removals = track_removals
        self._lock = threading.Lock()
        # (bytes -> LRUEntry where built: nothing the cycle collector follows; see untracked)
        self._entries: OrderedDict[bytes, _PyEntry] = untracked(OrderedDict())
        # keys being deleted -> the event a write of one waits on, made when one first does
        # (a threading.Event costs more than the rest of an eviction's bookkeeping)
        self._removing: dict[bytes, threading.Event | None] = {}
        self._used = 0
        self._committed = 0

    # -- queries ---------------------------------------------------------------------------
    def __contains__(self, key: object) -> bool:
        e = self._entries.get(key)  # type: ignore[call-overload]
        return e is not None and e.committed

    def has_entry(self, key: bytes) -> bool:
        """Whether ``key`` has an entry at all: committed, or reserved by a write in progress."""
        return key in self._entries

    def __len__(self) -> int:
        """Number of committed (visible) entries."""
        return self._committed

    @property
    def used_bytes(self) -> int:
        """Bytes of committed and reserved entries."""
        return self._used

    def being_removed(self, key: bytes) -> bool:
        """Whether ``key`` was handed out for deletion and :meth:`removed` has not been called yet."""
        return key in self._removing

    def keys(self) -> list[bytes]:
        """Committed keys, least recently used first."""
        with self._lock:
            return [k for k, e in self._entries.items() if e.committed]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.keys())

    # -- writes ----------------------------------------------------------------------------
    def reserve(self, key: bytes, nbytes: int) -> list[bytes] | None:
        """Make room for a write of ``key`` and return the keys evicted to make it.

        Returns ``None`` when ``key`` is already committed (the caller skips the write and
        the entry becomes most recently used). Raises :class:`CapacityError` when
        ``nbytes`` cannot fit even after evicting every unpinned entry, and
        :class:`RemovalPending` while an old copy of ``key`` is being deleted. The caller
        must delete the evicted keys from its medium *before* writing (and, tracking
        removals, then call :meth:`removed` for them), then call :meth:`commit` or
        :meth:`abort`.
        """
        with self._lock:
            return self._reserve_locked(key, nbytes)

    def reserve_many(self, keys: Iterable[bytes], nbytes: int) -> list[list[bytes] | Exception | None]:
        """:meth:`reserve` of each of ``keys`` in turn, under one lock (a group of stores):
        for each, what it returns, or the :class:`CapacityError` or :class:`RemovalPending`
        it raises."""
        out: list[list[bytes] | Exception | None] = []
        keys = list(keys)
        with self._lock:
            i = 0
            while i < len(keys):
                # new keys whose room the oldest entries make, in one call; then one the usual way
                i += _reserve_plain(self, _Entry, keys, i, nbytes, out)
                if i < len(keys):
                    try:
                        out.append(self._reserve_locked(keys[i], nbytes))
                    except (CapacityError, RemovalPending) as e:
                        out.append(e)
                    i += 1
        return out

    def _reserve_locked(self, key: bytes, nbytes: int) -> list[bytes] | None:
        if key in self._removing:
            raise RemovalPending(key, self._removal_event(key))
        e = self._entries.get(key)
        if e is not None:
            if e.committed:
                self._entries.move_to_end(key)
                return None
            e.writers += 1  # a concurrent write of the same key: both write, one entry
            return []
        cap = self.capacity_bytes
        victims = [] if cap is None or self._used + nbytes <= cap else self._make_room(nbytes, key, cap)
        self._entries[key] = _Entry(nbytes, False, 1)
        self._used += nbytes
        return victims

    def _make_room(self, nbytes: int, key: bytes, cap: int) -> list[bytes]:
        # Victims: committed, not pinned by a reader, and not being written again (a second
        # writer of a committed key would publish over the eviction's rename or unlink).
        # Taken off the LRU end one by one (in a full cache every store evicts, and the
        # oldest entry is nearly always the one); entries passed over go back in front.
        if nbytes > cap:
            raise CapacityError(f"chunk of {nbytes} bytes exceeds capacity_bytes={cap}", key)
        entries = self._entries
        need = self._used + nbytes - cap
        victims: list[bytes] = []
        taken: list[tuple[bytes, _PyEntry, bool]] = []  # every entry popped, oldest first; a victim?
        freed = 0
        while need > 0 and entries:
            k, e = entries.popitem(last=False)
            victim = e.committed and e.pins == 0 and e.writers == 0  # not while a write of it runs
            taken.append((k, e, victim))
            if victim:
                victims.append(k)
                need -= e.nbytes
                freed += e.nbytes
        if need > 0 or len(taken) > len(victims):
            for k, e, victim in reversed(taken):  # back in front, as they were
                if need > 0 or not victim:
                    entries[k] = e
                    entries.move_to_end(k, last=False)
            if need > 0:
                raise CapacityError(
                    f"no room for {nbytes} bytes: capacity_bytes={cap}, everything evictable is in use", key
                )
        self._used -= freed
        self._committed -= len(victims)
        self._hand_out(victims)
        return victims

    def _removal_event(self, key: bytes) -> threading.Event:
        """Under the lock: the event set when the deletion of ``key`` is over."""
        ev = self._removing[key]
        if ev is None:
            ev = self._removing[key] = threading.Event()
        return ev

    def _hand_out(self, keys: Iterable[bytes]) -> None:
        """Under the lock: ``keys`` left the index for the caller to delete."""
        if self.track_removals:
            for k in keys:
                self._removing.setdefault(k, None)

    def removed(self, keys: Iterable[bytes]) -> None:
        """The deletion of ``keys`` (handed out as victims, by :meth:`begin_remove` or by
        :meth:`discard` with ``removing``) is over, done or failed: writes of them may go on.
        Harmless for keys not being removed."""
        with self._lock:
            self._removed_locked(keys)

    def _removed_locked(self, keys: Iterable[bytes]) -> None:
        if keys:
            _removed_all(self, keys)

    def begin_remove(self, key: bytes) -> bool:
        """Before deleting ``key`` from the medium on request: drop its entry and, tracking
        removals, hold new writes of it until :meth:`removed`. False (nothing dropped, do not
        delete) while a write of ``key`` is in progress: that write wins, as if the removal
        had come first. Raises :class:`RemovalPending` while another deletion of it runs."""
        with self._lock:
            if key in self._removing:
                raise RemovalPending(key, self._removal_event(key))
            e = self._entries.get(key)
            if e is not None and (not e.committed or e.writers):
                return False
            if e is not None:
                del self._entries[key]
                self._used -= e.nbytes
                self._committed -= 1
            self._hand_out((key,))
            return True

    def commit(self, key: bytes, removed: Iterable[bytes] = ()) -> None:
        """The write of ``key`` succeeded: make it visible and most recently used. With
        ``removed``: :meth:`removed` of them too, under the same lock (a store's victims)."""
        with self._lock:
            self._removed_locked(removed)
            self._commit_locked(key)

    def commit_many(self, keys: Iterable[bytes], removed: Iterable[bytes] = ()) -> None:
        """:meth:`commit` of each of ``keys``, and :meth:`removed` of ``removed``, under one lock."""
        with self._lock:
            self._removed_locked(removed)
            _commit_all(self, keys)

    def _commit_locked(self, key: bytes) -> None:
        e = self._entries.get(key)
        if e is None:  # removed while being written; nothing to publish
            return
        e.writers = max(0, e.writers - 1)
        if not e.committed:
            e.committed = True
            self._committed += 1
        self._entries.move_to_end(key)

    def abort(self, key: bytes) -> bool:
        """The write of ``key`` failed: release its reservation. True if that gave its room
        back (False: another write of ``key`` holds it, or committed it)."""
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                return False
            e.writers = max(0, e.writers - 1)
            if not e.committed and e.writers == 0:
                del self._entries[key]
                self._used -= e.nbytes
                return True
            return False

    def restore(self, victims: Iterable[bytes], nbytes: int) -> None:
        """Undo an eviction whose deletion never started (the store that made it was
        withdrawn): each of ``victims`` is stored again, at the least recently used end where
        it was, unless a new entry of it was made meanwhile; the deletion is over
        (:meth:`removed`). Call after :meth:`abort` of the store's own key, which gives the room
        back."""
        victims = list(victims)
        with self._lock:
            self._removed_locked(victims)
            entries = self._entries
            for key in reversed(victims):  # the oldest ends up first, as they were taken
                if key in entries:
                    continue
                entries[key] = _Entry(nbytes, committed=True)
                entries.move_to_end(key, last=False)
                self._used += nbytes
                self._committed += 1

    def add(self, key: bytes, nbytes: int) -> None:
        """Record a chunk found on the medium (recovery) as most recently used, without eviction
        (not one being removed: its file is on its way out)."""
        with self._lock:
            if key in self._removing:
                return
            old = self._entries.pop(key, None)
            if old is not None:
                self._used -= old.nbytes
                self._committed -= old.committed
            self._entries[key] = _Entry(nbytes, committed=True)
            self._used += nbytes
            self._committed += 1

    def evict_over_capacity(self) -> list[bytes]:
        """Drop least recently used unpinned entries until within capacity; return them."""
        with self._lock:
            cap = self.capacity_bytes
            if cap is None or self._used <= cap:
                return []
            return self._drop_oldest_locked(self._used - cap)

    def merge_older(self, found: list[tuple[int, bytes, int]], skip: set[bytes]) -> int:
        """Recovery: add chunks found by a scan (``(mtime_ns, key, nbytes)``) as *older* than every entry
        made meanwhile, oldest first; keys already present or in ``skip`` are left alone."""
        return self.merge_older_newest_first(sorted(found, reverse=True), skip)

    def merge_older_newest_first(self, found: Iterable[tuple[int, bytes, int]], skip: set[bytes]) -> int:
        """:meth:`merge_older` of entries given newest first, :data:`MERGE_STEP` of them per
        hold of the lock: a scan of a large namespace merges from a thread, and the event
        loop's calls wait for the lock (100,000 files at once: 100 ms)."""
        added = 0
        it = iter(found)
        first = True
        while step := list(islice(it, MERGE_STEP)):
            if not first:
                # the GIL handed over between steps: a merge is Python on a thread, and the
                # loop otherwise waits a switch interval (5 ms) for it each time (the p99 lag
                # of reopening 100,000 files: 5.3-5.4 ms without, 1.3-3.7 ms with)
                time.sleep(0)
            first = False
            with self._lock:
                for _, key, nbytes in step:  # each to the front
                    if key in self._entries or key in skip or key in self._removing:
                        continue
                    self._entries[key] = _Entry(nbytes, committed=True)
                    self._entries.move_to_end(key, last=False)
                    self._used += nbytes
                    self._committed += 1
                    added += 1
        return added

    def adopt_pinned(self, key: bytes, nbytes: int) -> bool:
        """Pin ``key``, adding it as a committed entry first if absent (for example a chunk
        another process stored, found on the medium). False if it is being written or removed
        here right now."""
        return self.adopt_pinned_entry(key, nbytes) is not None

    def adopt_pinned_entry(self, key: bytes, nbytes: int) -> object | None:
        """:meth:`adopt_pinned`, returning the entry pinned (for :meth:`unpin` and
        :meth:`discard`) or None."""
        got = self.adopt_pinned_new(key, nbytes)
        return None if got is None else got[0]

    def adopt_pinned_new(self, key: bytes, nbytes: int) -> tuple[object, bool] | None:
        """:meth:`adopt_pinned_entry`, with whether the entry was added by this call (a load
        that then gets no answer from the medium takes it out again: it may not exist)."""
        with self._lock:
            if key in self._removing:
                return None
            e = self._entries.get(key)
            added = e is None
            if e is None:
                e = _Entry(nbytes, committed=True)
                self._entries[key] = e
                self._used += nbytes
                self._committed += 1
            elif not e.committed:
                return None
            e.pins += 1
            return e, added

    def pop_lru(self, nbytes: int) -> list[bytes]:
        """Drop least recently used unpinned entries worth at least ``nbytes``, capacity or not
        (the medium itself is full); return them for the caller to delete."""
        with self._lock:
            return self._drop_oldest_locked(nbytes)

    def _drop_oldest_locked(self, nbytes: int) -> list[bytes]:
        """Drop the least recently used unpinned committed entries worth at least ``nbytes``
        (or all there are) and hand them out. Only the entries looked at are read: a copy of
        the whole index per call (a million entries: 373-558 ms under the lock, for 8 chunks)
        would be paid by every store while the medium is full."""
        victims: list[bytes] = []
        entries = self._entries
        for k, e in entries.items():  # (nothing changes while iterating: dropped after)
            if nbytes <= 0:
                break
            if e.committed and e.pins == 0 and e.writers == 0:  # not while a write of it runs
                victims.append(k)
                nbytes -= e.nbytes
        for k in victims:
            e = entries.pop(k)
            self._used -= e.nbytes
            self._committed -= 1
        self._hand_out(victims)
        return victims

    # -- reads -----------------------------------------------------------------------------
    def pin(self, key: bytes) -> bool:
        """Protect a committed entry from eviction while it is read; False if absent."""
        return self.pin_entry(key) is not None

    def pin_entry(self, key: bytes) -> object | None:
        """:meth:`pin`, returning the entry pinned or None. Pass it to :meth:`unpin` and
        :meth:`discard`: if the key was removed and stored again meanwhile, they then leave
        the new entry alone instead of taking its pin or dropping it."""
        with self._lock:
            e = self._entries.get(key)
            if e is None or not e.committed:
                return None
            e.pins += 1
            return e

    def pin_entries(self, keys: Iterable[bytes]) -> list[object | None]:
        """:meth:`pin_entry` of each of ``keys``, under one lock (a group of loads)."""
        with self._lock:
            return _pin_all(self, keys)

    def unpin_entries(self, keys: Iterable[bytes], entries: Iterable[object]) -> None:
        """:meth:`unpin` of each key's entry from :meth:`pin_entries` (touched), under one lock."""
        with self._lock:
            _unpin_all(self, _Entry, keys, entries)

    def unpin(self, key: bytes, *, touch: bool = True, entry: object | None = None) -> None:
        """Release a :meth:`pin`; ``touch`` makes the entry most recently used. With
        ``entry`` (from :meth:`pin_entry`), only if the key still has that entry."""
        with self._lock:
            e = self._entries.get(key)
            if entry is not None and e is not entry:
                assert isinstance(entry, _Entry)
                entry.pins = max(0, entry.pins - 1)  # it left the index meanwhile
                return
            if e is None:
                return
            e.pins = max(0, e.pins - 1)
            if touch:
                self._entries.move_to_end(key)

    def touch(self, keys: Iterable[bytes]) -> None:
        """Make the committed entries among ``keys`` most recently used."""
        with self._lock:
            for k in keys:
                e = self._entries.get(k)
                if e is not None and e.committed:
                    self._entries.move_to_end(k)

    def discard(self, key: bytes, *, removing: bool = False, entry: object | None = None) -> bool:
        """Forget ``key``; True if it was committed. ``removing``: the caller deletes its copy
        next (a bad one), and calls :meth:`removed` after (tracking removals). With ``entry``
        (from :meth:`pin_entry`), only if the key still has that entry: else nothing is
        dropped or handed out, and False says that copy is gone already."""
        with self._lock:
            if entry is not None and self._entries.get(key) is not entry:
                return False
            e = self._entries.pop(key, None)
            if removing:
                self._hand_out((key,))
            if e is None:
                return False
            self._used -= e.nbytes
            if e.committed:
                self._committed -= 1
            return e.committed


# A group of stores' reservations and commits (the plain case), and a group of loads' pins: the C twins where built
# (asynctier/_speedups_lru.c), whose references these are. Call them with the index's lock held.


def reserve_plain(
    index: LRUIndex, entry_type: type[_PyEntry], keys: list[bytes], start: int, nbytes: int, out: list[Any]
) -> int:
    """Reserve ``nbytes`` for each of ``keys[start:]`` as :meth:`LRUIndex.reserve` would, in
    order, while each is plain: bytes, without an entry, not being removed, and, when there
    is no room, the oldest entries that make it all evictable (committed, not pinned, not
    being written). Appends each one's victims to ``out``; returns how many it reserved (the
    caller reserves the next one the usual way)."""
    entries, removing, cap = index._entries, index._removing, index.capacity_bytes
    done = 0
    for key in keys[start:]:
        if type(key) is not bytes or key in removing or key in entries:
            break
        victims: list[bytes] = []
        if cap is not None and index._used + nbytes > cap:
            if nbytes > cap:
                break
            need, freed = index._used + nbytes - cap, 0
            for k, e in entries.items():
                if need <= 0:
                    break
                if not (e.committed and e.pins == 0 and e.writers == 0):
                    break
                victims.append(k)
                need -= e.nbytes
                freed += e.nbytes
            if need > 0:
                break
            for k in victims:
                del entries[k]
            index._used -= freed
            index._committed -= len(victims)
            index._hand_out(victims)
        entries[key] = entry_type(nbytes, False, 1)
        index._used += nbytes
        out.append(victims)
        done += 1
    return done


def pin_all(index: LRUIndex, keys: Iterable[bytes]) -> list[object | None]:
    """:meth:`LRUIndex.pin_entry` of each of ``keys``, without the lock (the caller holds it)."""
    get = index._entries.get
    out: list[object | None] = []
    for key in keys:
        e = get(key)
        if e is None or not e.committed:
            out.append(None)
        else:
            e.pins += 1
            out.append(e)
    return out


def unpin_all(index: LRUIndex, entry_type: type[_PyEntry], keys: Iterable[bytes], entries: Iterable[object]) -> None:
    """:meth:`LRUIndex.unpin` of each key's entry from :func:`pin_all`, touched, without the lock."""
    get, to_end = index._entries.get, index._entries.move_to_end
    for key, entry in zip(keys, entries, strict=True):
        assert isinstance(entry, entry_type)
        entry.pins = max(0, entry.pins - 1)
        if get(key) is entry:  # else it left the index meanwhile: only its pin goes
            to_end(key)


def commit_all(index: LRUIndex, keys: Iterable[bytes]) -> None:
    """:meth:`LRUIndex.commit` of each of ``keys``, without the lock (the caller holds it)."""
    for key in keys:
        index._commit_locked(key)


def removed_all(index: LRUIndex, keys: Iterable[bytes]) -> None:
    """:meth:`LRUIndex.removed` of ``keys``, without the lock (the caller holds it): each
    leaves ``_removing``, and a write that waits for it is woken."""
    removing = index._removing
    for k in keys:
        ev = removing.pop(k, None)
        if ev is not None:  # someone waits
            ev.set()


_Entry: type[_PyEntry] = _PyEntry  # what the index makes: LRUEntry where it is built
try:
    from . import _speedups
except ImportError:  # pragma: no cover - installed without a C compiler
    _reserve_plain, _commit_all, _pin_all, _unpin_all = reserve_plain, commit_all, pin_all, unpin_all
    _removed_all = removed_all
else:
    _reserve_plain, _commit_all = _speedups.lru_reserve_plain, _speedups.lru_commit_all
    _pin_all, _unpin_all = _speedups.lru_pin_all, _speedups.lru_unpin_all
    _removed_all = _speedups.lru_removed_all
    _Entry = cast("type[_PyEntry]", _speedups.LRUEntry)
