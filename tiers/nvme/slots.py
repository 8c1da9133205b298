"""The in-memory slot index: key -> slot in LRU order, per-slot sequence numbers and
checksums, free slots, pins."""

from __future__ import annotations

import logging
import operator
import threading
import time
from array import array
from collections.abc import Callable, Iterable
from itertools import compress, pairwise
from typing import TypeVar

from asynctier.untracked import untracked

from . import checkpoint
from .checkpoint import Checkpoint

__all__ = ["PICK_MAX", "IndexLock", "SlotIndex"]

#: free lists up to this long are searched for adjacent slots (a full tier's: the victims of
#: an eviction batch and a few left over); a longer one is popped from its end as it lies
PICK_MAX = 128


log = logging.getLogger(__name__)

_Seq = TypeVar("_Seq", "list[bytes]", "array[int]")


def _copy_in_steps(items: _Seq) -> _Seq:
    """``items[:]`` a step at a time: the checkpointer thread holds the GIL through each copy
    (one C call): whole, the keys' copy is 2-5 ms at 370,000 slots, and at a million an
    array of sequence numbers is 1-3 ms (its fresh pages faulted in); between steps the
    event loop gets the GIL."""
    out = items[:0]
    if type(out) is list:  # (an empty list: the keys copied in are bytes, never containers)
        untracked(out)
    for i, j in checkpoint.steps(len(items), hand_over=False):  # (under the index lock)
        out += items[i:j]
    return out


def release_in_steps(items: list[bytes]) -> None:
    """Empty a snapshot's copy a step at a time: dropped whole, a list of a million keys is
    one 5 ms call holding the GIL, as its copy was."""
    while items:
        del items[-checkpoint.STEP :]
        time.sleep(0)  # the GIL handed over at once (else the loop waits a switch interval)


class IndexLock:
    """A ``threading.Lock`` that calls back, from the releasing thread, whoever asked
    (:meth:`when_free`) after its next release. ``acquire`` is the plain lock's own.

    Only the event loop's thread asks, after a failed try: no one waits for its own holds
    (never across a turn of the loop), so it releases with ``release_quiet``, the plain
    lock's own release, without a Python call."""

    __slots__ = ("_lock", "_waiters", "acquire", "locked", "release_quiet")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.acquire = self._lock.acquire
        self.locked = self._lock.locked
        self.release_quiet = self._lock.release
        self._waiters: list[Callable[[], object]] = []

    def release(self) -> None:
        self._lock.release()
        if self._waiters:  # (a list's length is read and popped atomically under the GIL)
            self._wake()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def when_free(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` after the next release (a few calls of it are harmless). Asked
        after a failed try: a release between the two found no one to call, so it is called
        now if the lock is free."""
        self._waiters.append(callback)
        if not self._lock.locked():
            self._wake()

    def _wake(self) -> None:
        waiters = self._waiters
        while waiters:
            try:
                callback = waiters.pop()
            except IndexError:  # another releasing thread took it
                return
            try:
                callback()
            except Exception:  # a release never fails its holder
                log.exception("nvme index lock: a waiter's callback failed")


class SlotIndex:
    """Key -> slot, slots linked in LRU order, per-slot seq/checksum, free slots, pins.

    The LRU list runs through two per-slot arrays (``prev``/``nxt``) rather than an
    OrderedDict, so a checkpoint restores it with two bulk copies. One lock guards it all.
    A free slot carries the journal ticket that must be flushed before it may be rewritten
    (its ``EVICT`` record); slots being read are pinned and freed only when unpinned.
    """

    def __init__(self, nslots: int) -> None:
        self.nslots = nslots
        self.lock = IndexLock()
        self.entries: dict[bytes, int] = {}
        self.slot_key = untracked([b""] * nslots)  # b"": free (keys are never empty)
        self.prev = array("i", [-1]) * nslots
        self.nxt = array("i", [-1]) * nslots
        self.head = -1  # least recently used
        self.tail = -1  # most recently used
        self.slot_seq = array("Q", bytes(8 * nslots))
        self.slot_csum = array("Q", bytes(8 * nslots))
        # the journal ticket of the record that published each slot's key (0: recovered, so
        # already in the journal): a store that finds its key stored waits for that one only
        self.slot_ticket = array("Q", bytes(8 * nslots))
        self.free: list[int] = []
        # 0 where the next slot was allocated with this one, in one run (see oldest_unpinned);
        # 1 otherwise, and for every slot until allocated (a recovered index knows no runs)
        self.run_end = bytearray(b"\x01") * nslots
        self.reuse_ticket: dict[int, int] = {}
        self.pins: dict[int, int] = {}
        self.zombies: dict[int, int] = {}  # freed while pinned: slot -> ticket
        self.writing: dict[bytes, int] = {}
        # a removal cancels the writes of a key in flight when it ran: those with a sequence
        # number up to this one (stores that start after it are new ones)
        self.killed: dict[bytes, int] = {}

    def load(self, ck: Checkpoint) -> None:
        """Adopt a checkpoint's arrays (bulk operations only: this is the reopen fast path)."""
        entries: dict[bytes, int] = {}
        for i, j in checkpoint.steps(ck.nslots):  # (whole: one call of 190-280 ms at a million slots)
            entries.update(zip(ck.slot_key[i:j], range(i, j)))
        entries.pop(b"", None)
        self.entries = entries
        self.slot_key = untracked(ck.slot_key)
        self.prev, self.nxt, self.head, self.tail = ck.prev, ck.nxt, ck.head, ck.tail
        self.slot_seq, self.slot_csum = ck.slot_seq, ck.slot_csum

    def snapshot(self, slab_id: bytes, gen: int) -> Checkpoint:
        """A copy of the index as a checkpoint (call with the lock held)."""
        return Checkpoint(
            slab_id,
            gen,
            self.nslots,
            self.head,
            self.tail,
            _copy_in_steps(self.slot_key),
            _copy_in_steps(self.prev),
            _copy_in_steps(self.nxt),
            _copy_in_steps(self.slot_seq),
            _copy_in_steps(self.slot_csum),
        )

    def _unlink(self, s: int) -> None:
        p, q = self.prev[s], self.nxt[s]
        if p >= 0:
            self.nxt[p] = q
        else:
            self.head = q
        if q >= 0:
            self.prev[q] = p
        else:
            self.tail = p
        self.prev[s] = self.nxt[s] = -1

    def _link_tail(self, s: int) -> None:
        t = self.tail
        self.prev[s] = t
        self.nxt[s] = -1
        if t >= 0:
            self.nxt[t] = s
        else:
            self.head = s
        self.tail = s

    def touch_slot(self, s: int) -> None:
        """Make slot ``s`` most recently used."""
        if self.tail != s:
            self._unlink(s)
            self._link_tail(s)

    def put(self, key: bytes, slot: int) -> int | None:
        """Map ``key`` to ``slot`` as most recently used; return the slot it had before, if any."""
        other = self.slot_key[slot]
        if other and other != key:  # only an inconsistent journal gets here
            self.drop(other)
        old = self.entries.get(key)
        if old is not None:
            self._unlink(old)
            self.slot_key[old] = b""
        self.entries[key] = slot
        self.slot_key[slot] = key
        self._link_tail(slot)
        return old if old != slot else None

    def put_many(self, pairs: list[tuple[bytes, int]]) -> list[tuple[int, int]]:
        """:meth:`put` for each ``(key, slot)`` in order (a store's batch: this runs per chunk
        on the event loop's thread); the ``(position, slot it had)`` of each key that had one."""
        entries, slot_key = self.entries, self.slot_key
        had: list[tuple[int, int]] = []
        for i, (key, slot) in enumerate(pairs):
            if slot_key[slot] or key in entries:  # the general case
                old = self.put(key, slot)
                if old is not None:
                    had.append((i, old))
                continue
            entries[key] = slot
            slot_key[slot] = key
            self._link_tail(slot)
        return had

    def drop(self, key: bytes) -> int | None:
        """Forget ``key``; return the slot it had."""
        slot = self.entries.pop(key, None)
        if slot is not None:
            self._unlink(slot)
            self.slot_key[slot] = b""
        return slot

    def oldest_unpinned(self, n: int, more: int = 0) -> list[int]:
        """Up to ``n`` used slots, least recently used first, skipping pinned ones; then up to
        ``more`` others while each is the next slot of the last one's run (the rest of a run
        of adjacent slots allocated together: published together, in slot order, its slots
        lie together in LRU order too, and freed together they stay one run for a store)."""
        out: list[int] = []
        s = self.head
        pins, nxt = self.pins, self.nxt
        while s >= 0 and len(out) < n:
            if not pins.get(s):
                out.append(s)
            s = nxt[s]
        ends = self.run_end
        while out and more > 0 and not ends[out[-1]] and s == out[-1] + 1 and not pins.get(s):
            out.append(s)
            s = nxt[s]
            more -= 1
        return out

    def keys_lru(self) -> list[bytes]:
        """Every key, least recently used first."""
        out: list[bytes] = []
        s = self.head
        while s >= 0:
            k = self.slot_key[s]
            assert k
            out.append(k)
            s = self.nxt[s]
        return out

    def rebuild_free(self) -> None:
        """Free = every slot without a key; a stack popped from the end, so low slots go first
        and consecutive stores rotate across stripes."""
        free: list[int] = untracked([])
        keys = self.slot_key
        for i, j in checkpoint.steps(self.nslots):  # (whole: one call of 30-45 ms at a million slots)
            hi, lo = self.nslots - i, self.nslots - j  # highest slots first
            free += compress(range(hi - 1, lo - 1, -1), map(operator.not_, reversed(keys[lo:hi])))
        self.free = free

    def pin(self, slot: int) -> None:
        """Keep ``slot`` from being freed while it is read (call with the lock held)."""
        self.pins[slot] = self.pins.get(slot, 0) + 1

    def unpin(self, slot: int) -> None:
        """End a read of ``slot``; a slot freed meanwhile is freed now (call with the lock held)."""
        self.unpin_many((slot,))

    def unpin_many(self, slots: Iterable[int]) -> None:
        """:meth:`unpin` each of ``slots`` (a batch of ends, on the event loop's thread)."""
        pins, zombies = self.pins, self.zombies
        for slot in slots:
            n = pins[slot] - 1
            if n:
                pins[slot] = n
                continue
            del pins[slot]
            if zombies:
                t = zombies.pop(slot, None)
                if t is not None:
                    self.release(slot, t)

    def take_free(self, n: int, pick_max: int = PICK_MAX) -> list[int]:
        """Take ``n`` (at most ``len(free)``) free slots, in as few runs of consecutive slots
        as the free list holds (call with the lock held); a free list longer than
        ``pick_max`` is taken from its low end as it lies.

        A full tier frees its LRU victims, which lie wherever earlier stores put them; taken
        as they were freed, a store's slots drifted apart, each store made the next worse,
        and a job of 8 chunks came to need 7-8 separate writes (docs/tiers/nvme.md). One run
        is the shortest that holds them all (the longer ones kept for later); else the
        lowest slots go."""
        free = self.free
        if len(free) > pick_max or n >= len(free):  # a long list: its low end; or all of it
            taken = free[: -n - 1 : -1]
            del free[len(free) - len(taken) :]
            self.mark_runs(taken)
            return taken
        asc = sorted(free)
        m = len(asc)
        starts = [0, *[i for i in range(1, m) if asc[i] != asc[i - 1] + 1], m]
        fits = [(b - a, a) for a, b in pairwise(starts) if b - a >= n]
        if fits:
            i = min(fits)[1]
            taken, kept = asc[i : i + n], asc[:i] + asc[i + n :]
        else:  # in pieces only: the lowest (no better for runs to come than the longest first, and cheaper)
            taken, kept = asc[:n], asc[n:]
        kept.reverse()  # low slots popped first, as rebuild_free orders them
        self.free = kept
        self.mark_runs(taken)
        return taken

    def mark_runs(self, taken: list[int]) -> None:
        """Note ``taken``'s runs of adjacent slots, allocated together (for oldest_unpinned)."""
        if not taken:
            return
        ends, lo, hi = self.run_end, min(taken), max(taken)
        if hi - lo == len(taken) - 1:  # one run (the usual case: slots are distinct), in bulk
            ends[lo:hi] = bytes(hi - lo)
            ends[hi] = 1
            return
        asc = sorted(taken)
        for i in range(len(asc) - 1):
            ends[asc[i]] = asc[i + 1] != asc[i] + 1
        ends[hi] = 1

    def done_writing(self, key: bytes, seq: int) -> bool:
        """The write of ``key`` numbered ``seq`` ended; True if ``key`` was removed while it
        ran (a store that began after the removal is not affected)."""
        killed = seq <= self.killed.get(key, -1)
        n = self.writing.get(key, 0) - 1
        if n > 0:
            self.writing[key] = n
        else:
            self.writing.pop(key, None)
            self.killed.pop(key, None)
        return killed

    def release(self, slot: int, ticket: int) -> None:
        """Free ``slot`` once unpinned; it may be rewritten after journal ticket ``ticket``."""
        if self.pins.get(slot):
            self.zombies[slot] = max(ticket, self.zombies.get(slot, 0))
            return
        if ticket:
            self.reuse_ticket[slot] = ticket
        self.free.append(slot)
