"""Which key is in which slot, in memory and on disk, and the order rules that keep the two
consistent through a crash: allocate (evicting when full), publish after the data, evict
before reuse, never reuse a sequence number; recovery at open; checkpoints.

Memory holds the authoritative :class:`~.slots.SlotIndex`; the disk holds a checkpoint plus
the journal records written after it (docs/tiers/nvme.md).
"""

from __future__ import annotations

import errno
import logging
import operator
import os
import threading
import weakref
from collections.abc import Callable
from types import ModuleType

from asynctier import CapacityError, ChunkNotFoundError, TierConfigError
from asynctier.core.backend import in_this_process
from asynctier.engines.speedups import speedups
from asynctier.errors import MediumDamagedError

from . import bulk as _py_bulk
from .checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from .files import TEMP_MARK, IndexDir
from .format import EVICT, PUBLISH, pack_record, pack_records
from .journal import Journal, damage_of, journal_name, replay
from .slots import PICK_MAX, SlotIndex, release_in_steps

_slot_of = operator.itemgetter(1)  # of a record (key, slot, seq, csum)

__all__ = ["Catalog"]

log = logging.getLogger(__name__)

EPOCH_SHIFT = 32  # seq = epoch << 32 | counter
#: Free slots a full slab keeps ahead of its stores, in eviction batches, and at most this
#: fraction of its slots (evict_ahead_locked)
EVICT_AHEAD, EVICT_AHEAD_MOST = 4, 1 / 32
_CKPT_RETRY_MIN_S, _CKPT_RETRY_MAX_S = 0.5, 60.0  # pause after a failed checkpoint, doubling

#: per key position in a group: (slot, seq)
Slots = dict[int, tuple[int, int]]

# a store job's steps on the index, each for the whole job: the C twins where built
# (bulk.py holds their Python references)
_fast = speedups()
_bulk: ModuleType = _py_bulk if _fast is None else _fast


def index_files(where: IndexDir, base: str) -> list[str]:
    """The names of the index files (checkpoint, journal generations, temporaries) under ``base``."""
    return [n for n in where.names() if n.startswith(base + ".")]


def generations(names: list[str], base: str) -> list[int]:
    """The journal generations among ``names`` (``<base>.journal.<gen>``), in order."""
    head = base + ".journal."
    return sorted(int(n[len(head) :]) for n in names if n.startswith(head) and n[len(head) :].isdigit())


def clear_index_for_format(where: IndexDir, base: str, new_set: bool) -> None:
    """Before a slab set is formatted: a new one (its files held none) finding index files under
    its name refuses them (:class:`TierConfigError`): they are another set's (two slabs of one
    file name sharing an ``index_dir``), or left by a slab deleted since; a set formatted over
    one of its own (``reformat``, a damaged set) deletes its old index first, so that a kill
    before its new index is written never leaves the old one to be taken for another set's."""
    found = index_files(where, base)
    if base + ".ckpt" not in found and not generations(found, base):
        return
    if new_set:  # (a leftover temporary is no index: recovery removes it)
        raise TierConfigError(
            f"nvme: {where.name} {str(where.path)!r} already holds index files named {base}.* for a new slab set: "
            "another slab set's (two slabs of one file name share this index_dir), or left by a slab deleted "
            "since. Nothing of them was changed: give each slab set its own index_dir or slab file name, or "
            "delete those files"
        )
    for n in found:
        where.unlink(n)


def find_index(
    where: IndexDir, base: str, slab_id: bytes, nslots: int, fresh: bool
) -> tuple[Checkpoint | None, list[int], list[str], str | None]:
    """What the index directory holds for slab set ``slab_id``: its checkpoint (None: none
    usable), its journal generations, every name there, and why the index is lost, if it is:
    a checkpoint there but unusable (torn, corrupt), or none while the oldest generation is
    not the first; every open leaves a generation or a checkpoint, so a set of ours with
    neither lost its index (or the config names another ``index_dir``; or, never holding a
    chunk, its formatting open was killed in the milliseconds before its first generation).

    A checkpoint of another slab set under the same name (two slabs of one file name sharing
    an ``index_dir``) is refused (:class:`TierConfigError`), not taken for lost: recovery
    would delete it."""
    names = where.names()
    gens = generations(names, base)
    ckpt = where.path / (base + ".ckpt")
    ck = None if fresh else read_checkpoint(ckpt, where=where)
    if ck is not None and ck.slab_id != slab_id:
        raise TierConfigError(
            f"nvme: the checkpoint {str(ckpt)!r} is another slab set's (two slabs of one file name share this "
            "index_dir?): nothing was changed; give each slab set its own index_dir or slab file name"
        )
    if ck is not None and ck.nslots != nslots:
        ck = None
    lost = None
    if not fresh and ck is None and (ckpt.name in names or not gens or gens[0] > 1):
        why = "unusable (torn or corrupt)" if ckpt.name in names else "missing"
        lost = f"the index's checkpoint {str(ckpt)!r} is {why}"
    return ck, gens, names, lost


def _replay_from(
    where: IndexDir, base: str, slab_id: bytes, gens: list[int], start: int, idx: SlotIndex
) -> tuple[int, int | None, list[tuple[str, str, int]]]:
    """Replay every journal generation from ``start`` on into ``idx`` (recovery, and the check
    of an open that may not create): the last usable generation and its valid end (0, None:
    none), and the damage found, as ``(file name, what, stretches)`` for each generation with any."""
    last_gen, last_end = 0, None
    damage: list[tuple[str, str, int]] = []
    for g in gens:
        if g < start:
            continue
        name = journal_name(base, g)
        data = where.read(name)
        done = replay(data, slab_id, idx.nslots, idx)
        if done is not None:
            last_gen, last_end = g, done.end
        said = damage_of(data, done)
        if said:
            damage.append((name, said, done.damaged if done is not None else 1))
    return last_gen, last_end, damage


class Catalog:
    """The slot index and its journal, with the operations that change them together.

    ``count`` is the tier's stats counter. Every method takes the index lock itself, except
    those named ``*_locked``.
    """

    def __init__(
        self, where: IndexDir, base: str, slab_id: bytes, epoch: int, nslots: int, data_fds: list[int], *,
        durable: bool, evict_batch: int, checkpoint_every: int, count: Callable[..., None],
    ) -> None:  # fmt: skip
        self.where = where  # the index directory, open; its files' names start with ``base``
        self.base = base
        self.slab_id = slab_id
        self.epoch = epoch
        self.counter = 0
        self.evict_batch = evict_batch
        self.evicted_for_room = False  # a store has lacked a free slot since open (evict_ahead_locked)
        self.checkpoint_every = checkpoint_every
        self._count = count
        self.ckpt_path = where.path / (base + ".ckpt")
        self.index = SlotIndex(nslots)
        self.journal = Journal(where, base, slab_id, data_fds, durable, count)
        self._ckpt_lock = threading.Lock()
        self._ckpt_wake = threading.Event()
        #: set to end the checkpointer: by :meth:`stop_checkpointer`, or by the finalizer of a
        #: catalog never closed (at interpreter exit it runs while the catalog is still alive)
        self._ckpt_stop = threading.Event()
        #: the checkpointer waits out a failed checkpoint; stores do not wake it meanwhile
        self.ckpt_retrying = False
        self._ckpt_thread: threading.Thread | None = None
        self._finalizer: weakref.finalize[..., Catalog] | None = None

    # -- recovery and lifetime ---------------------------------------------------------------
    @staticmethod
    def check_index(where: IndexDir, base: str, slab_id: bytes, nslots: int) -> None:
        """Refuse (:class:`~asynctier.MediumDamagedError`) to go on with the slab set ``slab_id`` whose index
        is lost (:func:`find_index`), or whose journal has a damaged record between valid ones
        (:func:`.journal.replay`): an open that may not create (``create=False``) checks this
        before it writes anything."""
        ck, gens, _, lost = find_index(where, base, slab_id, nslots, False)
        if lost:
            raise MediumDamagedError(
                f"nvme: {lost}: the chunks it listed cannot be served, and an open that may create starts "
                "without them. Nothing was written (create=False)"
            )
        idx = SlotIndex(nslots)
        if ck is not None:
            idx.load(ck)
        start = ck.gen if ck is not None else (gens[0] if gens else 1)
        damage = _replay_from(where, base, slab_id, gens, start, idx)[2]
        if damage:
            name, said, _ = damage[0]
            raise MediumDamagedError(
                f"nvme: the journal {str(where.path / name)!r}: {said}. An open that may create serves the rest and "
                "counts the loss (journal_damaged). Nothing was written (create=False)"
            )

    def recover(self, fresh: bool) -> None:
        """Rebuild the index (checkpoint, then every journal generation from its own on) and
        open the journal for appending; ``fresh``: a new slab set, so forget any old files.
        An index found lost (:func:`find_index`) is counted (``index_lost_at_open``): the
        chunks it held cannot be served, and their slots are reused."""
        where, journal, nslots = self.where, self.journal, self.index.nslots
        ck, gens, names, lost = find_index(where, self.base, self.slab_id, nslots, fresh)
        for n in names:  # temporaries of checkpoints a crash interrupted
            if n.startswith(self.ckpt_path.name + TEMP_MARK):
                where.unlink(n)
        idx = self.index
        if lost:
            log.warning("nvme: %s: the chunks it listed are lost", lost)
            self._count("index_lost_at_open", 1)
        start_gen = 1
        if ck is not None:
            idx.load(ck)
            start_gen = ck.gen
        elif not fresh and gens:
            start_gen = gens[0]
        last_gen, last_end = 0, None
        damage: list[tuple[str, str, int]] = []
        if not fresh:
            last_gen, last_end, damage = _replay_from(where, self.base, self.slab_id, gens, start_gen, idx)
        for name, said, stretches in damage:
            log.warning("nvme: the journal %s: %s", name, said)
            self._count("journal_damaged", stretches)
        damaged = bool(damage)
        # drop what recovery did not use: older generations, other slab sets
        for g in gens:
            if fresh or g < start_gen or (g > last_gen and last_gen):
                where.unlink(journal.name(g))
        if fresh:
            where.unlink(self.ckpt_path.name)
        if last_end is not None:
            journal.open_gen(last_gen, last_end)
        else:
            journal.open_gen(max(start_gen, 1), None)
        idx.rebuild_free()
        self._count("recovered_chunks", len(idx.entries))
        if lost or damaged:  # the loss accepted: a checkpoint now, or every open until the next finds it again
            try:
                self.checkpoint()
            except OSError as e:  # (a full index_dir): served all the same, the loss said again next time
                log.warning("nvme: a checkpoint after the loss found at open failed (%s): the next open finds it "
                            "again", e)  # fmt: skip

    def start_checkpointer(self, fds: list[int]) -> None:
        """Start the checkpoint thread. It holds only a weak reference, so a tier dropped
        without ``aclose()`` can still be collected; a finalizer then ends the thread and
        closes the journal and ``fds``."""
        self._ckpt_stop.clear()
        thread = self._ckpt_thread = threading.Thread(
            target=_checkpointer,
            args=(weakref.ref(self), self._ckpt_wake, self._ckpt_stop),
            name="asynctier-nvme-ckpt",
            daemon=True,
        )
        thread.start()
        self._finalizer = weakref.finalize(
            self, in_this_process(_release), self._ckpt_stop, self._ckpt_wake, thread, fds, self.journal, self.where
        )

    def stop_checkpointer(self) -> None:
        self._ckpt_stop.set()
        self._ckpt_wake.set()
        if self._ckpt_thread is not None:
            self._ckpt_thread.join()
            self._ckpt_thread = None

    def close(self) -> None:
        """Stop the checkpointer and write a final checkpoint (a clean reopen replays nothing)."""
        self.stop_checkpointer()
        try:
            if self.journal.broken is None:
                self.checkpoint()
        finally:
            self.release_files()

    def release_files(self) -> None:
        """Close the journal and the index directory (the slabs are the slab set's)."""
        if self._finalizer is not None:
            self._finalizer.detach()
        try:
            self.journal.close()
        finally:
            self.where.close()

    # -- checkpoints ---------------------------------------------------------------------------
    def checkpoint(self) -> None:
        """Write the whole index to a new checkpoint and start a new journal generation (blocking)."""
        idx, journal = self.index, self.journal
        with self._ckpt_lock:
            with idx.lock:
                old_gen = journal.gen
                ck = idx.snapshot(self.slab_id, old_gen + 1)
                taken = journal.start_rotation()
            # the rotation's I/O (the records' write and sync, the new generation's file) with
            # the index free: stores allocate and publish meanwhile (3-7 ms at 390,000 slots),
            # their records queued for the new generation
            journal.rotate(taken, old_gen + 1)
            try:
                write_checkpoint(self.ckpt_path, ck, where=self.where)
            finally:
                release_in_steps(ck.slot_key)
            for g in range(old_gen, 0, -1):
                if not self.where.unlink(journal.name(g)):
                    break
            self._count("checkpoints")

    def checkpoint_if_due(self) -> None:
        """Wake the checkpointer once enough records are queued (not while it waits to retry)."""
        if self.journal.since_checkpoint >= self.checkpoint_every and not self.ckpt_retrying:
            self._ckpt_wake.set()

    # -- stores ----------------------------------------------------------------------------------
    def _begin_writes_locked(self, keys: list[bytes], taken: list[int]) -> tuple[range, int]:
        """Number the writes of ``keys`` into the slots ``taken`` (in order, each number new
        to this open): their sequence numbers, and the journal ticket to flush before any is
        written (the latest ``EVICT`` record that freed one). Raises, changing nothing, once
        this open's numbers are exhausted."""
        n = len(taken)
        if self.counter + n >= 1 << EPOCH_SHIFT:  # pragma: no cover - 2**32 stores in one open
            raise OSError(errno.EOVERFLOW, "sequence numbers exhausted for this open; reopen the tier")
        first = (self.epoch << EPOCH_SHIFT) | (self.counter + 1)
        self.counter += n
        return range(first, first + n), _bulk.begin_writes(self.index, keys, taken, first)

    def allocate(self, key: bytes) -> tuple[int, int, int]:
        """Take a free slot (evicting LRU entries when none is): (slot, seq, ticket to await)."""
        with self.index.lock:
            return self.allocate_locked(key)

    def allocate_locked(self, key: bytes) -> tuple[int, int, int]:
        """:meth:`allocate` for a caller that holds the index lock."""
        idx = self.index
        if not idx.free:
            self.evicted_for_room = True
            self._evict_locked(self._evict_quota())
            if not idx.free:
                raise CapacityError(f"no free slot: all {idx.nslots} slots are being written or read", key)
        slot = idx.free[-1]
        (seq,), ticket = self._begin_writes_locked([key], [slot])
        idx.free.pop()
        idx.run_end[slot] = 1
        return slot, seq, ticket

    def evict_ahead_locked(self) -> None:
        """(the index lock held) Before a journal commit of stores, once stores lacked room
        (a full slab): evict until :data:`EVICT_AHEAD` batches of slots are free (at most
        :data:`EVICT_AHEAD_MOST` of them; none in a small slab), so that the commit carries
        their ``EVICT`` records and the stores that take those slots next write at once,
        instead of each evicting as it lacks room and waiting for a commit of its own
        records first (docs/tiers/nvme.md, "Evicting ahead")."""
        if not self.evicted_for_room:  # filling up: no chunk leaves before the slab is full
            return
        idx = self.index
        short = min(EVICT_AHEAD * self._evict_quota(), int(idx.nslots * EVICT_AHEAD_MOST)) - len(idx.free)
        if short > 0:
            self._evict_locked(short)

    def _evict_quota(self) -> int:
        # a batch: one journal flush then covers the next few stores; at most an eighth of
        # the slots, or a small slab is emptied whole (chunks just stored too)
        return min(self.evict_batch, max(1, self.index.nslots // 8))

    def _evict_locked(self, n: int) -> None:
        """Evict up to ``n`` least recently used unpinned slots (their ``EVICT`` records
        queued together; each slot free once its record is in)."""
        idx = self.index
        # and the rest of the last victim's run, while the batch stays within an eighth of the slots
        recs = _bulk.evict_oldest(idx, n, min(n, idx.nslots // 8 - n))
        if recs:
            last = self.journal.append_many(pack_records(EVICT, recs))
            _bulk.release_many(idx, list(map(_slot_of, recs)), last - len(recs) + 1)
            self._count("evictions", len(recs))
        self.checkpoint_if_due()

    def allocate_many(self, keys: list[bytes]) -> tuple[Slots, dict[int, BaseException], int, list[int], int]:
        """Under one lock, a slot for every key not stored yet: (position -> (slot, seq), the
        positions that got none with why, the journal ticket to flush before writing any of
        them, the positions found stored already and the ticket to flush before saying so:
        the record that published them may still be queued)."""
        with self.index.lock:
            return self.allocate_many_locked(keys)

    def allocate_many_locked(self, keys: list[bytes]) -> tuple[Slots, dict[int, BaseException], int, list[int], int]:
        """:meth:`allocate_many` for a caller that holds the index lock."""
        idx = self.index
        entries = idx.entries
        slots: Slots = {}
        failed: dict[int, BaseException] = {}
        wait = skip_ticket = 0
        skipped: list[int] = []
        new: list[int] = []
        if entries.keys().isdisjoint(keys):  # the usual case: none stored yet
            new = list(range(len(keys)))
        else:
            for p, k in enumerate(keys):
                have = entries.get(k)
                if have is None:
                    new.append(p)
                    continue
                idx.touch_slot(have)  # already stored: skip the write
                skipped.append(p)
                skip_ticket = max(skip_ticket, idx.slot_ticket[have])
        n = len(new)
        if self.counter + n < 1 << EPOCH_SHIFT:
            # the usual case, in bulk (this runs per chunk on the event loop's thread): in a
            # full tier, what the batch lacks evicted in one go (at least a quota, as
            # allocate_locked evicts), then slots taken in runs of adjacent ones where the
            # free list allows (SlotIndex.take_free), numbered together
            short = n - len(idx.free)
            if 0 < short <= max(1, idx.nslots // 8):
                self.evicted_for_room = True
                self._evict_locked(max(short, self._evict_quota()))
            if n <= len(idx.free):
                taken = _bulk.take_free(idx, n, PICK_MAX)
                seqs, wait = self._begin_writes_locked(keys if n == len(keys) else [keys[p] for p in new], taken)
                slots = dict(zip(new, zip(taken, seqs)))
                return slots, failed, wait, skipped, skip_ticket
        for p in new:  # evicting on the way
            try:
                slot, seq, ticket = self.allocate_locked(keys[p])
            except BaseException as e:
                failed[p] = e
                continue
            slots[p] = (slot, seq)
            if ticket > wait:
                wait = ticket
        return slots, failed, wait, skipped, skip_ticket

    def stored_ticket(self, key: bytes) -> int | None:
        """For a store of ``key``: None if it is not stored, else (made most recently used)
        the ticket of the record that published it, to await before saying it is stored."""
        idx = self.index
        with idx.lock:
            slot = idx.entries.get(key)
            if slot is None:
                return None
            idx.touch_slot(slot)
            return int(idx.slot_ticket[slot])

    def publish(self, key: bytes, slot: int, seq: int, csum: int) -> int:
        """Make ``key`` -> ``slot`` visible and queue its record; return the ticket to await."""
        return self.publish_many([key], [0], {0: (slot, seq)}, {0: csum})

    def publish_many(self, keys: list[bytes], written: list[int], slots: Slots, csums: dict[int, int]) -> int:
        """Publish the chunks at positions ``written`` under one lock (records queued in index
        order); return the journal ticket to await (0: nothing published)."""
        with self.index.lock:
            return self.publish_many_locked(keys, written, slots, csums)

    def publish_many_locked(self, keys: list[bytes], written: list[int], slots: Slots, csums: dict[int, int]) -> int:
        """:meth:`publish_many` for a caller that holds the index lock."""
        idx = self.index
        # a key removed while being written gets no record (its slot freed)
        recs = _bulk.end_writes(idx, keys, written, slots, csums)
        if not recs:
            return 0
        last = self.journal.append_many(pack_records(PUBLISH, recs))
        first = last - len(recs) + 1
        # an earlier store of the same key won: free its slot
        for i, old in _bulk.put_published(idx, recs, first):
            idx.release(old, first + i)
        self.checkpoint_if_due()
        return last

    def abort(self, key: bytes, slot: int, ticket: int = 0) -> None:
        """A write into ``slot`` failed: free it, still behind ``ticket`` (its ``EVICT`` record,
        which may not be in the journal yet if waiting for it is what failed)."""
        with self.index.lock:
            self.index.done_writing(key, 0)
            self.index.release(slot, ticket)

    def forget(self, key: bytes, slot: int | None = None, seq: int | None = None) -> int:
        """Drop ``key`` from the index; return a ticket or 0. With ``slot`` and ``seq`` (a bad
        copy just read), only that very copy: not one stored since, though it may have got
        the same slot back; without, whatever the key maps to, and the stores of it in
        flight are cancelled (an explicit removal)."""
        idx = self.index
        with idx.lock:
            if slot is None and key in idx.writing:  # the writes in flight now: numbered up to here
                idx.killed[key] = (self.epoch << EPOCH_SHIFT) | self.counter
            cur = idx.entries.get(key)
            if cur is None or (slot is not None and (cur != slot or idx.slot_seq[cur] != seq)):
                return 0
            idx.drop(key)
            ticket = self.journal.append(pack_record(EVICT, key, cur, idx.slot_seq[cur], 0))
            idx.release(cur, ticket)
            return ticket

    # -- loads -------------------------------------------------------------------------------------
    def pin(self, key: bytes) -> tuple[int, int, int]:
        """Pin the slot of ``key`` for a read (made most recently used): (slot, seq, checksum)."""
        with self.index.lock:
            return self.pin_locked(key)

    def pin_many(self, keys: list[bytes]) -> tuple[dict[int, tuple[int, int, int]], dict[int, BaseException]]:
        """Under one lock, pin the slot of every key stored: (position -> (slot, seq,
        checksum), the positions not stored with their error)."""
        with self.index.lock:
            return self.pin_many_locked(keys)

    def pin_many_locked(self, keys: list[bytes]) -> tuple[dict[int, tuple[int, int, int]], dict[int, BaseException]]:
        """:meth:`pin_many` for a caller that holds the index lock (one pass over the keys:
        a load job's batch, on the event loop's thread)."""
        found, missing = _bulk.pin_many(self.index, keys)
        return found, {
            p: ChunkNotFoundError(f"no chunk stored under key {keys[p].hex()[:32]}", keys[p]) for p in missing
        }

    def pin_locked(self, key: bytes) -> tuple[int, int, int]:
        """:meth:`pin` for a caller that holds the index lock."""
        found, missing = self.pin_many_locked([key])
        if missing:
            raise missing[0]
        return found[0]

    def unpin(self, slots: list[int]) -> None:
        with self.index.lock:
            self.unpin_locked(slots)

    def unpin_locked(self, slots: list[int]) -> None:
        """:meth:`unpin` for a caller that holds the index lock: the reads of ``slots`` ended."""
        _bulk.unpin_many(self.index, slots)

    def touch(self, keys: list[bytes]) -> None:
        """Make the stored ones of ``keys`` most recently used."""
        idx = self.index
        with idx.lock:
            for k in keys:
                slot = idx.entries.get(k)
                if slot is not None:
                    idx.touch_slot(slot)


def _checkpointer(ref: weakref.ReferenceType[Catalog], wake: threading.Event, stop: threading.Event) -> None:
    """Body of a catalog's checkpoint thread: a checkpoint each time the journal asks for one.

    A failed checkpoint (a full or failing index directory) is retried after a pause that
    doubles up to :data:`_CKPT_RETRY_MAX_S`, not on every store: each try snapshots the whole
    index under its lock. The journal keeps every record meanwhile; only replay grows.
    """
    delay: float | None = None
    while True:
        wake.wait(delay)
        wake.clear()
        if stop.is_set():
            return
        cat = ref()
        if cat is None:
            return
        try:
            cat.checkpoint()
        except Exception as e:
            delay = min(_CKPT_RETRY_MAX_S, 2 * delay if delay else _CKPT_RETRY_MIN_S)
            cat.ckpt_retrying = True
            cat._count("checkpoint_failures")
            log.warning("nvme: checkpoint failed (%r); the journal holds everything, next try in %.1f s", e, delay)
        else:
            delay = None
            cat.ckpt_retrying = False
        del cat


def _release(
    stop: threading.Event, wake: threading.Event, thread: threading.Thread, fds: list[int], journal: Journal,
    where: IndexDir,
) -> None:  # fmt: skip
    """Finalizer of a catalog collected without ``close()``, or still open at interpreter exit:
    end its checkpoint thread (a checkpoint it is writing ends first; none is started on
    files being closed), then close its files. What was acknowledged is in the journal."""
    stop.set()
    wake.set()
    if thread is not threading.current_thread():  # the thread's own last reference may be the one dropped
        thread.join()
    try:
        journal.close()
    finally:
        where.close()
        while fds:
            os.close(fds.pop())
