"""``nvme``: preallocated O_DIRECT slabs cut into fixed slots, with a crash-safe index.

``{"type": "nvme", "path": "/mnt/nvme/kv.slab", "capacity_bytes": 64 << 30}``, or
``{"type": "nvme", "paths": ["/mnt/a/kv.slab", "/mnt/b/kv.slab"], ...}`` to stripe slots
across several devices (slot ``g`` lives on stripe ``g % n``), or a block device
(``"path": "/dev/nvme1n1", "index_dir": "/var/lib/asynctier"``).

On the medium
-------------
Each slab (file or block device) starts with a one-block *superblock* (format, geometry,
layout digest, the slab set's random id and an *epoch* bumped at every open), followed by
fixed *slots*. A slot is a header area (one :class:`~asynctier.integrity.ChunkHeader`:
key, payload length, xxh3 checksum, sequence number, layout digest; padded to the logical
block) and the payload area (``chunk_bytes`` rounded up to the logical block). One slot
is written by one ``pwritev`` of ``[header block, primary chunk]`` and read by one
``preadv`` of the same shape, with O_DIRECT straight from and into the primary view when
its address and length are block-aligned; otherwise through a per-thread aligned bounce
buffer (counted in ``stats().extra["bounce_copies"]``).

The index
---------
Memory holds the authoritative index (key -> slot, in LRU order; per-slot sequence number
and checksum) so ``lookup`` is O(1). On disk it is a *checkpoint* (the whole index as flat
arrays, one checksum) plus an append-only *journal* of checksummed ``PUBLISH`` / ``EVICT``
records written after it. Why no acknowledged chunk is lost and no wrong bytes are served
after a crash at any moment:

* **Publish after data.** A ``PUBLISH(key, slot, seq, checksum)`` record is appended only
  after the slot's ``pwritev`` returned; with ``durability="fsync"`` the slabs are
  ``fdatasync``-ed before the record is written and the journal is ``fdatasync``-ed before
  the offload reports success (group commit: one pair of syncs covers every record queued
  meanwhile). With ``durability="none"`` the record still reaches the kernel before success,
  which survives a killed process (not a power cut).
* **Evict before reuse.** A slot taken from a key (eviction, removal, a newer copy) is
  freed with the ticket of its ``EVICT`` record; nothing is written into it until that
  record is in the journal (durable, under ``"fsync"``). So the journal never maps a key to
  a slot that may hold other bytes.
* **Unique sequence numbers.** ``seq = epoch << 32 | counter`` and the epoch is bumped
  (and synced) at every open, so a sequence number is never reused, even after a crash
  mid-write. A load checks the slot header against the index entry (key, seq, checksum),
  then the payload checksum (``verify``): a torn, stale or reused slot is a miss, never a hit.
* **Torn journal tail.** Replay stops at the first record whose checksum fails and the
  journal is truncated there before new records are appended.
* **Checkpoints** are written to a temporary file, synced and renamed; the journal rotates
  to a new generation at the snapshot, so replay is "checkpoint + every journal of a
  generation >= the checkpoint's", whatever moment the crash hit.
* **A failing index directory** (full, read-only, EIO) fails the stores whose records did
  not make it, not the tier: a failed journal write is cut back to its last good length
  and its records are queued again (``journal_mended`` in stats); a generation that cannot
  be started leaves the journal in the one it had. A failed checkpoint is retried after a
  pause that doubles up to a minute (``checkpoint_failures``); replay grows meanwhile.

Recovery reads one checkpoint (per-slot arrays: keys, LRU links, seqs, checksums; one
checksum; restored with bulk operations) and replays at most ``checkpoint_every`` records,
so reopening with a million slots indexed takes about a second here
(``bench/bench_nvme.py`` measures it). LRU order is exact while open (a linked list through
the slots); after a crash, recency since the last checkpoint is approximated by the
journal's publish order.

Engine
------
``io_engine="psync"`` (default): ``preadv``/``pwritev`` on ``max_inflight`` worker threads
(the runtime's ThreadEngine, with its bound, priorities, back-pressure and cancellation).
``"io_uring"``: no worker thread; each job is a coroutine on the event loop whose slot I/O
is one ``writev``/``readv`` entry on an io_uring served by the loop
(:class:`asynctier.ioring.LoopRing`, the ring the fs tier uses: ctypes, no binding); journal
flushes that must wait, and chunks of 1 MiB or more to checksum, go to the tier's own
threads. ``"auto"``: io_uring where a ring can be set up, else psync. A call of many small
chunks runs as *group* jobs of up to ``coalesce_bytes`` (default 1 MiB): each group writes
every run of adjacent slots with one I/O and takes the index lock twice (allocate all,
publish all), which more than halves the CPU spent per 64 KiB chunk.

psync stays the default: over four ``bench/bench_nvme.py`` runs on the 2-core bench machine
it led the 2 MiB offloads in three, and on 64 KiB chunks and on loads the engines traded
places (bench/README.md, "nvme tier"). The ring does each chunk's header and bookkeeping on
the loop thread, and its ``io_uring_enter`` runs the block layer's submission work there.
Hashing 2 MiB chunks on the loop as well held the loop's p99 lag at 6.3-8.8 ms while they
streamed at depth 16; on threads, 2.5-3.7 ms (``bench/results/loop_lag_nvme.md``: both
engines under 5 ms).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import operator
import os
import stat
import struct
import threading
import time
import uuid as uuidlib
import weakref
from array import array
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import accumulate, compress
from pathlib import Path
from typing import Any, TypeVar

import xxhash

from asynctier import (
    BlockingChunkTier,
    CapacityError,
    ChunkNotFoundError,
    IntegrityError,
    TierConfigError,
    engines,
    ioring,
)
from asynctier.chunked import MAX_KEY_BYTES
from asynctier.engines import Engine
from asynctier.integrity import ChunkHeader, checksum, header_matches, pack_header
from asynctier.posix_io import O_DIRECT, O_NOATIME, aligned_buffer, buffer_address, fsync_dir, logical_block_size

__all__ = [
    "Checkpoint",
    "NvmeTier",
    "read_checkpoint",
    "write_checkpoint",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

_SB_MAGIC = b"ATNVSLAB"
_CK_MAGIC = b"ATNVCKPT"
_JR_MAGIC = b"ATNVJRNL"
_VERSION = 1
# superblock: magic, version, block, chunk_bytes, slot_size, slots in this stripe, epoch,
# stripe index, stripe count, slab-set id, layout digest, data offset
_SB = struct.Struct("<8sIIQQQQII16s16sQ")
# checkpoint header: magic, version, flags, journal generation to replay from, slab-set id,
# slots, LRU head, LRU tail, key bytes
_CK = struct.Struct("<8sIIQ16sQqqQ")
# journal file header: magic, version, pad, generation, slab-set id
_JH = struct.Struct("<8sIIQ16s")
# journal record: type, pad, key length, slot, seq, payload checksum (then key, then xxh3)
_REC = struct.Struct("<BBHIQQ")
_U64 = struct.Struct("<Q")
_PUBLISH, _EVICT = 1, 2
_IO_ENGINES = ("psync", "io_uring", "auto")
_EPOCH_SHIFT = 32
_CKPT_RETRY_MIN_S, _CKPT_RETRY_MAX_S = 0.5, 60.0  # pause after a failed checkpoint, doubling


def _xxh(data: bytes | memoryview | bytearray) -> int:
    return xxhash.xxh3_64_intdigest(data)


def _round_up(n: int, block: int) -> int:
    return -(-n // block) * block


# -- checkpoint file --------------------------------------------------------------------------
@dataclass
class Checkpoint:
    """The whole index as per-slot arrays, so that reading it back is a few bulk copies.

    ``slot_key[s]`` is the key stored in slot ``s`` (``b""``: free; keys are never empty); ``prev``/``nxt`` link the
    used slots from least (``head``) to most (``tail``) recently used (-1 ends the list);
    ``slot_seq``/``slot_csum`` are each slot's sequence number and payload checksum. ``gen``
    is the first journal generation to replay on top of it.
    """

    slab_id: bytes
    gen: int
    nslots: int
    head: int
    tail: int
    slot_key: list[bytes]
    prev: array[int]
    nxt: array[int]
    slot_seq: array[int]
    slot_csum: array[int]

    @classmethod
    def from_lru(
        cls,
        slab_id: bytes,
        gen: int,
        nslots: int,
        entries: Sequence[tuple[bytes, int]],
        slot_seq: array[int] | None = None,
        slot_csum: array[int] | None = None,
    ) -> Checkpoint:
        """Build a checkpoint from ``(key, slot)`` pairs, least recently used first."""
        slot_key = [b""] * nslots
        prev = array("i", [-1]) * nslots
        nxt = array("i", [-1]) * nslots
        last = -1
        for k, s in entries:
            slot_key[s] = k
            prev[s] = last
            if last >= 0:
                nxt[last] = s
            last = s
        head = entries[0][1] if entries else -1
        zeros = array("Q", bytes(8 * nslots))
        return cls(
            slab_id,
            gen,
            nslots,
            head,
            last,
            slot_key,
            prev,
            nxt,
            slot_seq if slot_seq is not None else zeros,
            slot_csum if slot_csum is not None else array("Q", zeros),
        )

    def lru(self) -> list[tuple[bytes, int]]:
        """``(key, slot)`` pairs, least recently used first."""
        out: list[tuple[bytes, int]] = []
        s = self.head
        while s >= 0:
            out.append((self.slot_key[s], s))
            s = self.nxt[s]
        return out


def write_checkpoint(path: Path, ck: Checkpoint) -> None:
    """Write ``ck`` to ``path`` atomically and durably (temporary file, fsync, rename, fsync dir)."""
    n = ck.nslots
    if not (len(ck.slot_key) == len(ck.prev) == len(ck.nxt) == len(ck.slot_seq) == len(ck.slot_csum) == n):
        raise ValueError("inconsistent checkpoint arrays")
    keylens = array("H", map(len, ck.slot_key))
    blob = b"".join(ck.slot_key)
    head = _CK.pack(_CK_MAGIC, _VERSION, 0, ck.gen, ck.slab_id, n, ck.head, ck.tail, len(blob))
    parts: list[bytes | memoryview] = [
        head,
        memoryview(keylens).cast("B"),
        blob,
        memoryview(ck.prev).cast("B"),
        memoryview(ck.nxt).cast("B"),
        memoryview(ck.slot_seq).cast("B"),
        memoryview(ck.slot_csum).cast("B"),
    ]
    h = xxhash.xxh3_64()
    for p in parts:
        h.update(p)
    parts.append(_U64.pack(h.intdigest()))
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for p in parts:
            _write_all(fd, memoryview(p))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_checkpoint(path: Path) -> Checkpoint | None:
    """Read a checkpoint; None when absent, torn or corrupt (the caller starts from empty)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(data) < _CK.size + 8:
        return None
    body = memoryview(data)[:-8]
    if _xxh(body) != _U64.unpack_from(data, len(data) - 8)[0]:
        log.warning("nvme: checkpoint %s fails its checksum; ignoring it", path)
        return None
    magic, version, _flags, gen, slab_id, n, head, tail, keys_len = _CK.unpack_from(data)
    if magic != _CK_MAGIC or version != _VERSION:
        return None
    off = _CK.size
    keylens = array("H")
    keylens.frombytes(body[off : off + 2 * n])
    off += 2 * n
    blob = data[off : off + keys_len]
    off += keys_len
    arrays: list[array[int]] = []
    for code, size in (("i", 4), ("i", 4), ("Q", 8), ("Q", 8)):
        a = array(code)
        a.frombytes(body[off : off + size * n])
        off += size * n
        arrays.append(a)
    if off != len(body):
        return None
    # bulk slicing (map over slices runs in C): free slots come out as b""
    ends = list(accumulate(keylens))
    slot_key = list(map(blob.__getitem__, map(slice, [0, *ends[:-1]], ends)))
    return Checkpoint(slab_id, gen, n, head, tail, slot_key, *arrays)


def _write_all(fd: int, view: memoryview) -> None:
    while view.nbytes:
        n = os.write(fd, view)
        view = view[n:]


def _pack_record(typ: int, key: bytes, slot: int, seq: int, csum: int) -> bytes:
    body = _REC.pack(typ, 0, len(key), slot, seq, csum) + key
    return body + _U64.pack(_xxh(body))


# -- journal with group commit -----------------------------------------------------------------
class _Journal:
    """Append-only record log with group commit.

    Records are queued in memory (:meth:`append`, under the index lock so the journal's order
    is the index's order) and written by whichever waiter first finds no flush running
    (:meth:`wait`); one write (and, when durable, one ``fdatasync`` of the slabs then one of
    the journal) covers every record queued meanwhile. A ticket is the record's position.
    """

    def __init__(
        self,
        prefix: Path,
        slab_id: bytes,
        data_fds: list[int],
        durable: bool,
        count: Callable[[str], None] = lambda name: None,
    ) -> None:
        self.prefix = prefix
        self._count = count  # the tier's stats counter
        self.slab_id = slab_id
        self.data_fds = data_fds
        self.durable = durable
        self.fd = -1
        self.gen = 0
        self._cv = threading.Condition(threading.Lock())
        self._pending: list[bytes] = []
        self._appended = 0
        self._done = 0
        self._busy = False
        self.since_checkpoint = 0
        self.flushes = 0
        #: flushes that failed and were mended (their records cut off and queued again)
        self.mended = 0
        self.broken: BaseException | None = None
        self._end = 0  # the file's length up to the last record flushed

    def path(self, gen: int) -> Path:
        return self.prefix.with_name(f"{self.prefix.name}.journal.{gen:08d}")

    def open_gen(self, gen: int, valid_end: int | None) -> None:
        """Append to generation ``gen``: truncate it to ``valid_end``, or create it afresh."""
        p = self.path(gen)
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if valid_end is None else os.open(p, os.O_WRONLY)
        try:
            if valid_end is None:
                head = _JH.pack(_JR_MAGIC, _VERSION, 0, gen, self.slab_id)
                _write_all(fd, memoryview(head + _U64.pack(_xxh(head))))
                os.fsync(fd)
                fsync_dir(p.parent)  # the new file must exist after a crash before records in it count
            else:
                os.ftruncate(fd, valid_end)  # drop a torn tail so new records are not hidden behind it
                os.fsync(fd)
            end = os.lseek(fd, 0, os.SEEK_END)
        except BaseException:
            os.close(fd)  # not ours to keep: the current generation's descriptor stays
            raise
        self._end = end
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = fd
        self.gen = gen

    def append(self, rec: bytes) -> int:
        with self._cv:
            self._pending.append(rec)
            self._appended += 1
            self.since_checkpoint += 1
            return self._appended

    def append_many(self, recs: list[bytes]) -> int:
        """Queue several records at once; return the last one's ticket (the first's is
        ``last - len(recs) + 1``)."""
        with self._cv:
            self._pending += recs
            self._appended += len(recs)
            self.since_checkpoint += len(recs)
            return self._appended

    @property
    def appended(self) -> int:
        """The ticket of the last record queued (read it under the index lock, which orders appends)."""
        return self._appended

    def flushed(self, ticket: int) -> bool:
        """Whether record ``ticket`` is in the journal already (no waiting, no I/O)."""
        return ticket <= self._done and self.broken is None

    def wait(self, ticket: int) -> None:
        """Return once record ``ticket`` is in the journal file (and synced, when durable)."""
        if ticket <= 0:
            return
        cv = self._cv
        with cv:
            while self._done < ticket:
                if self.broken is not None:
                    raise OSError(errno.EIO, f"nvme journal unusable: {self.broken!r}")
                if not self._busy:
                    self._busy = True
                    batch, self._pending = self._pending, []
                    target = self._appended
                    break
                cv.wait()
            else:
                return
        self._flush(batch, target)

    def _flush(self, batch: list[bytes], target: int, rotate_to: int | None = None) -> None:
        """Write ``batch`` (records up to ``target``); with ``rotate_to``, then sync and switch
        to that journal generation. The caller holds ``_busy``."""
        err: BaseException | None = None
        written = False
        start = self._end
        data = b"".join(batch)
        try:
            if self.durable:
                for fd in self.data_fds:  # slot data before the records that publish it
                    os.fdatasync(fd)
            if batch:
                _write_all(self.fd, memoryview(data))
            if self.durable or rotate_to is not None:
                os.fdatasync(self.fd)
            self._end = start + len(data)
            written = True
            if rotate_to is not None:
                self.open_gen(rotate_to, None)
        except BaseException as e:
            err = e
        mended = False
        if written:
            if err is not None:
                # The records are in; only the switch failed (open_gen left this generation
                # current): go on appending here, a later checkpoint tries again.
                log.warning(
                    "nvme journal %s: cannot start generation %s (%r); appending to this one",
                    self.path(self.gen),
                    rotate_to,
                    err,
                )
        elif err is not None:
            # A full or failing disk may recover. Cut off what may be half-written and queue
            # the batch again, ahead of what came meanwhile: the next wait() writes it. Its
            # waiters hear of this failure now (a store so reported may still end up stored).
            try:
                os.ftruncate(self.fd, start)
                os.lseek(self.fd, start, os.SEEK_SET)
                mended = True
            except OSError:
                pass
            what = "cut back, its records are queued again" if mended else "cannot cut back: no more stores"
            log.warning("nvme journal %s: a flush failed (%r); %s", self.path(self.gen), err, what)
        with self._cv:
            self._busy = False
            if written:
                self._done = target
                self.flushes += 1
                if err is None and rotate_to is not None:
                    self.since_checkpoint = 0
            elif mended:
                self._pending[:0] = batch
                self.mended += 1
                self._count("journal_mended")
            else:  # records may be half-written and cannot be cut off: no more acknowledgements
                self.broken = err
            self._cv.notify_all()
        if err is not None:
            raise err

    def rotate(self, new_gen: int) -> None:
        """Flush what is queued into the current generation, then switch to ``new_gen``.

        Called with the index lock held, so no record is queued meanwhile; the records up to
        here are exactly those the caller's snapshot reflects.
        """
        with self._cv:
            while self._busy:
                self._cv.wait()
            self._busy = True
            batch, self._pending = self._pending, []
            target = self._appended
        self._flush(batch, target, rotate_to=new_gen)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _replay(path: Path, slab_id: bytes, nslots: int, index: _SlotIndex) -> int | None:
    """Apply one journal generation to ``index``; return its valid length (None if unusable)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    hs = _JH.size + 8
    if len(data) < hs:
        return None
    magic, version, _pad, _gen, sid = _JH.unpack_from(data)
    if magic != _JR_MAGIC or version != _VERSION or sid != slab_id:
        return None
    if _xxh(memoryview(data)[: _JH.size]) != _U64.unpack_from(data, _JH.size)[0]:
        return None
    mv = memoryview(data)
    off = hs
    n = len(data)
    rs = _REC.size
    entries = index.entries
    seqs = index.slot_seq
    csums = index.slot_csum
    put = index.put
    while off + rs + 8 <= n:
        typ, _, klen, slot, seq, csum = _REC.unpack_from(data, off)
        end = off + rs + klen
        if end + 8 > n or _xxh(mv[off:end]) != _U64.unpack_from(data, end)[0]:
            break  # torn tail
        if slot >= nslots or typ not in (_PUBLISH, _EVICT):
            break
        key = data[off + rs : end]
        if typ == _PUBLISH:
            put(key, slot)
            seqs[slot] = seq
            csums[slot] = csum
        elif entries.get(key) == slot and seqs[slot] == seq:
            index.drop(key)
        off = end + 8
    return off


# -- the in-memory index and slot allocator -----------------------------------------------------
class _SlotIndex:
    """Key -> slot, slots linked in LRU order, per-slot seq/checksum, free slots, pins.

    The LRU list runs through two per-slot arrays (``prev``/``nxt``) rather than an
    OrderedDict, so a checkpoint restores it with two bulk copies. One lock guards it all.
    A free slot carries the journal ticket that must be flushed before it may be rewritten
    (its ``EVICT`` record); slots being read are pinned and freed only when unpinned.
    """

    def __init__(self, nslots: int) -> None:
        self.nslots = nslots
        self.lock = threading.Lock()
        self.entries: dict[bytes, int] = {}
        self.slot_key = [b""] * nslots  # b"": free (keys are never empty)
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
        self.reuse_ticket: dict[int, int] = {}
        self.pins: dict[int, int] = {}
        self.zombies: dict[int, int] = {}  # freed while pinned: slot -> ticket
        self.writing: dict[bytes, int] = {}
        # a removal cancels the writes of a key in flight when it ran: those with a sequence
        # number up to this one (stores that start after it are new ones)
        self.killed: dict[bytes, int] = {}

    def load(self, ck: Checkpoint) -> None:
        """Adopt a checkpoint's arrays (bulk operations only: this is the reopen fast path)."""
        entries = dict(zip(ck.slot_key, range(ck.nslots)))
        entries.pop(b"", None)
        self.entries = entries
        self.slot_key = ck.slot_key
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
            list(self.slot_key),
            self.prev[:],
            self.nxt[:],
            self.slot_seq[:],
            self.slot_csum[:],
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

    def drop(self, key: bytes) -> int | None:
        """Forget ``key``; return the slot it had."""
        slot = self.entries.pop(key, None)
        if slot is not None:
            self._unlink(slot)
            self.slot_key[slot] = b""
        return slot

    def oldest_unpinned(self, n: int) -> list[int]:
        """Up to ``n`` used slots, least recently used first, skipping pinned ones."""
        out: list[int] = []
        s = self.head
        pins = self.pins
        while s >= 0 and len(out) < n:
            if not pins.get(s):
                out.append(s)
            s = self.nxt[s]
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
        self.free = list(compress(range(self.nslots - 1, -1, -1), map(operator.not_, reversed(self.slot_key))))

    def release(self, slot: int, ticket: int) -> None:
        """Free ``slot`` once unpinned; it may be rewritten after journal ticket ``ticket``."""
        if self.pins.get(slot):
            self.zombies[slot] = max(ticket, self.zombies.get(slot, 0))
            return
        if ticket:
            self.reuse_ticket[slot] = ticket
        self.free.append(slot)


class _Geometry:
    """Where slot ``g`` lives: stripe ``g % n``, position ``g // n`` in that stripe."""

    def __init__(self, block: int, chunk_bytes: int, stripe_bytes: int, nstripes: int) -> None:
        self.block = block
        self.hdr_area = _round_up(ChunkHeader.packed_size(MAX_KEY_BYTES), block)
        self.payload_area = _round_up(chunk_bytes, block)
        self.slot_size = self.hdr_area + self.payload_area
        self.data_off = _round_up(max(_SB.size + 8, 4096), block)
        self.per_stripe = max(0, (stripe_bytes - self.data_off) // self.slot_size)
        self.nstripes = nstripes
        self.nslots = self.per_stripe * nstripes

    def locate(self, slot: int) -> tuple[int, int]:
        stripe, pos = divmod(slot, self.nstripes)[::-1]
        return stripe, self.data_off + pos * self.slot_size


class _Buffers(threading.local):
    """Per-thread aligned buffers: a header block, and a whole-slot bounce buffer on demand."""

    hdr: memoryview | None = None
    bounce: memoryview | None = None
    group: memoryview | None = None


# -- the tier ------------------------------------------------------------------------------------
def _open_noatime(p: Path, flags: int) -> int:
    """``os.open`` with O_NOATIME where the process may ask it (it owns the slab, or has
    CAP_FOWNER): a load then never dirties the slab's inode (relatime would, on the first
    read after each write), which costs a journal handle inside the read."""
    if O_NOATIME:
        try:
            return os.open(p, flags | O_NOATIME, 0o644)
        except OSError as e:
            if e.errno != errno.EPERM:
                raise
            # another user's slab (or device node): plain reads
    return os.open(p, flags, 0o644)


class NvmeTier(BlockingChunkTier):
    """Chunks in fixed slots of preallocated slab files or block devices, with O_DIRECT.

    Args (besides the common knobs of :class:`~asynctier.chunked.ChunkTier`):
        path: a slab file (created and preallocated if absent) or a block device.
        paths: several slabs to stripe slots across (instead of ``path``).
        capacity_bytes: total slab bytes (split evenly across ``paths``); defaults to the
            size of an existing slab or device.
        index_dir: where the checkpoint and journal live (default: next to the first slab;
            required for a block device).
        preallocate: ``fallocate`` slab files (default True); False leaves them sparse.
        direct_io: use O_DIRECT (default True); falls back to buffered I/O, counted in
            ``direct_io_fallbacks``, where the file system refuses it.
        checkpoint_every: journal records between checkpoints (bounds replay at open).
        evict_batch: LRU entries evicted at once when no slot is free (one journal flush);
            at most an eighth of the slots.
        coalesce_bytes: a call of many small chunks runs as jobs of up to this many slot
            bytes (default 1 MiB; 0: one job per chunk); adjacent slots in a job move with
            one ``pwritev``/``preadv``.
        io_engine: ``"psync"`` (default: worker threads), ``"io_uring"`` (slot I/O on a ring
            served by the event loop; fails to open where io_uring is unavailable) or
            ``"auto"`` (io_uring where available, else psync); the engine in use after
            ``open()`` is :attr:`active_io_engine`.
    """

    default_type = "nvme"
    supported_durability = ("none", "fsync")
    handles_capacity = True  # the slab's size: its slots are the bound

    def __init__(
        self,
        *,
        path: str | os.PathLike[str] | None = None,
        paths: Sequence[str | os.PathLike[str]] | None = None,
        index_dir: str | os.PathLike[str] | None = None,
        preallocate: bool = True,
        direct_io: bool = True,
        checkpoint_every: int = 1 << 16,
        evict_batch: int = 16,
        coalesce_bytes: int = 1 << 20,
        io_engine: str = "psync",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (path is None) == (paths is None):
            raise TierConfigError("the nvme tier needs exactly one of 'path' or 'paths'")
        if paths is not None:
            if isinstance(paths, (str, bytes, os.PathLike)) or not paths:
                raise TierConfigError(f"paths must be a non-empty list of paths; got {paths!r}")
            self.paths = [Path(os.fspath(p)) for p in paths]
        else:
            assert path is not None
            self.paths = [Path(os.fspath(path))]
        if len(set(self.paths)) != len(self.paths):
            raise TierConfigError("paths must be distinct")
        self.index_dir = Path(os.fspath(index_dir)) if index_dir is not None else None
        for name, v in (("preallocate", preallocate), ("direct_io", direct_io)):
            if not isinstance(v, bool):
                raise TierConfigError(f"{name} must be True or False; got {v!r}")
        for name, iv in (("checkpoint_every", checkpoint_every), ("evict_batch", evict_batch)):
            if isinstance(iv, bool) or not isinstance(iv, int) or iv <= 0:
                raise TierConfigError(f"{name} must be a positive int; got {iv!r}")
        self.preallocate = preallocate
        self.direct_io = direct_io
        self.checkpoint_every = checkpoint_every
        self.evict_batch = evict_batch
        if isinstance(coalesce_bytes, bool) or not isinstance(coalesce_bytes, int) or coalesce_bytes < 0:
            raise TierConfigError(f"coalesce_bytes must be an int >= 0; got {coalesce_bytes!r}")
        self.coalesce_bytes = coalesce_bytes
        if io_engine not in _IO_ENGINES:
            raise TierConfigError(f"io_engine must be one of {', '.join(map(repr, _IO_ENGINES))}; got {io_engine!r}")
        self.io_engine = io_engine
        self._ring_mode = False  # io_engine resolved to io_uring (decided when the engine is made)
        self._lring: ioring.LoopRing | None = None
        self._ring_hdr: memoryview | None = None  # header blocks of the jobs in flight on the ring
        self._ring_hdr_free: list[int] = []
        self._ring_pool: ThreadPoolExecutor | None = None  # the ring's blocking helpers (see _on_pool)
        self._ring_addrs = (0, 0, 0)  # header pool, primary view, one job's header bytes
        self._fds: list[int] = []
        self._direct = False
        self._zc_all = False  # every primary chunk block-aligned (see _zero_copy_chunks)
        self._geo: _Geometry | None = None
        self._idx: _SlotIndex | None = None
        self._journal: _Journal | None = None
        self._slab_id = b""
        self._epoch = 0
        self._counter = 0
        self._bufs = _Buffers()
        self._ckpt_lock = threading.Lock()
        self._ckpt_wake = threading.Event()
        self._ckpt_stop = False
        #: the checkpointer waits out a failed checkpoint; stores do not wake it meanwhile
        self._ckpt_retrying = False
        self._ckpt_thread: threading.Thread | None = None

    # -- geometry and buffers ---------------------------------------------------------------
    def stored_size(self) -> int:
        """Bytes one chunk occupies: its whole slot (header block + rounded payload)."""
        return self._geo.slot_size if self._geo is not None else self.offloading_spec.chunk_bytes

    @property
    def nslots(self) -> int:
        """Slots in the slab set (0 before ``open()``)."""
        return self._geo.nslots if self._geo is not None else 0

    def _hdr_buf(self) -> memoryview:
        b = self._bufs.hdr
        if b is None:
            assert self._geo is not None
            b = self._bufs.hdr = aligned_buffer(self._geo.hdr_area)
        return b

    def _bounce_buf(self) -> memoryview:
        b = self._bufs.bounce
        if b is None:
            assert self._geo is not None
            b = self._bufs.bounce = aligned_buffer(self._geo.slot_size)
        return b

    def _zero_copy_ok(self, view: memoryview) -> bool:
        """Whether ``view`` can go straight to the medium (no bounce copy)."""
        assert self._geo is not None
        if view.nbytes != self._geo.payload_area:
            return False
        if not self._direct:
            return True
        return buffer_address(view) % self._geo.block == 0

    def _zero_copy_chunks(self) -> bool:
        """Whether every chunk of the primary view can go straight to the medium: then the
        group paths skip the per-chunk address check (a ctypes call, a few us each)."""
        geo = self._geo
        assert geo is not None
        cb = self.offloading_spec.chunk_bytes
        if cb != geo.payload_area:
            return False
        if not self._direct:
            return True
        return cb % geo.block == 0 and buffer_address(self._view) % geo.block == 0

    # -- open / close -------------------------------------------------------------------------
    def _index_prefix(self) -> Path:
        first = self.paths[0]
        base = self.index_dir if self.index_dir is not None else first.parent
        return base / (first.name + ".atidx")

    def _open_slab(self, p: Path, size: int | None) -> tuple[int, int]:
        """Open (creating and sizing if needed) one slab; return (fd, its size in bytes)."""
        flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
        is_blk = p.exists() and stat.S_ISBLK(p.stat().st_mode)
        if not is_blk:
            flags |= os.O_CREAT
        fd = -1
        if self.direct_io and O_DIRECT:
            try:
                fd = _open_noatime(p, flags | O_DIRECT)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self._stats.incr("direct_io_fallbacks")
                log.warning("nvme: %s refuses O_DIRECT; using buffered I/O", p)
        if fd < 0:
            fd = _open_noatime(p, flags)
            self._direct = False
        try:
            cur = os.lseek(fd, 0, os.SEEK_END)
            if is_blk:
                return fd, min(cur, size) if size else cur
            if size is None:
                if cur == 0:
                    raise TierConfigError(f"capacity_bytes is required to create the nvme slab {str(p)!r}")
                return fd, cur
            if cur < size:
                if self.preallocate:
                    os.posix_fallocate(fd, 0, size)
                else:
                    os.ftruncate(fd, size)
            return fd, size
        except BaseException:
            os.close(fd)
            raise

    def open_medium(self) -> None:
        """Open the slabs, check or format their superblocks, recover the index."""
        if any(stat.S_ISBLK(p.stat().st_mode) for p in self.paths if p.exists()) and self.index_dir is None:
            raise TierConfigError("an nvme tier on a block device needs 'index_dir' for its checkpoint and journal")
        self._direct = bool(self.direct_io and O_DIRECT)
        n = len(self.paths)
        per = self.capacity_bytes // n if self.capacity_bytes is not None else None
        sizes: list[int] = []
        try:
            for p in self.paths:
                p.parent.mkdir(parents=True, exist_ok=True)
                fd, size = self._open_slab(p, per)
                self._fds.append(fd)
                sizes.append(size)
            if not self._direct:  # one path refused O_DIRECT: one mode for all (chunks go unbounced)
                for fd in self._fds:
                    fl = fcntl.fcntl(fd, fcntl.F_GETFL)
                    if fl & O_DIRECT:
                        fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~O_DIRECT)
            block = max(logical_block_size(p) for p in self.paths)
            geo = _Geometry(block, self.offloading_spec.chunk_bytes, min(sizes), n)
            if geo.per_stripe <= 0:
                raise TierConfigError(
                    f"capacity_bytes={self.capacity_bytes} leaves no room for one slot of {geo.slot_size} bytes"
                )
            self._geo = geo
            fresh = not self._read_superblocks()
            if fresh:
                self._slab_id = uuidlib.uuid4().bytes
                self._epoch = 0
                log.info("nvme: formatting %s (%d slots of %d bytes)", self.paths, geo.nslots, geo.slot_size)
            self._epoch += 1  # a new epoch per open: sequence numbers are never reused
            self._counter = 0
            self._write_superblocks()
            self._recover(fresh)
            self._zc_all = self._zero_copy_chunks()
        except BaseException:
            self._close_fds()
            raise
        self._ckpt_stop = False
        # The thread holds only a weak reference, so a tier dropped without aclose() can
        # still be collected; its finalizer then ends the thread and closes the files.
        self._ckpt_thread = threading.Thread(
            target=_checkpointer, args=(weakref.ref(self), self._ckpt_wake), name="asynctier-nvme-ckpt", daemon=True
        )
        self._ckpt_thread.start()
        assert self._journal is not None
        weakref.finalize(self, _release, self._ckpt_wake, self._fds, self._journal)

    @property
    def active_io_engine(self) -> str:
        """The engine moving slots: ``"io_uring"`` or ``"psync"`` (what ``"auto"`` chose)."""
        return "io_uring" if self._ring_mode else "psync"

    def _pwritev(self, fd: int, bufs: list[memoryview], offset: int) -> None:
        _pwritev_all(fd, bufs, offset)

    def _preadv(self, fd: int, bufs: list[memoryview], offset: int) -> int:
        return _preadv_all(fd, bufs, offset)

    def _read_superblocks(self) -> bool:
        """True if every stripe carries a superblock of this geometry and layout (same slab set)."""
        geo = self._geo
        assert geo is not None
        buf = aligned_buffer(geo.data_off)
        ids: set[bytes] = set()
        epochs: list[int] = []
        for i, fd in enumerate(self._fds):
            if os.preadv(fd, [buf], 0) < _SB.size + 8:
                return False
            (
                magic,
                version,
                block,
                chunk,
                slot_size,
                per_stripe,
                epoch,
                idx,
                count,
                sid,
                digest,
                data_off,
            ) = _SB.unpack_from(buf)
            if magic != _SB_MAGIC or _xxh(buf[: _SB.size]) != _U64.unpack_from(buf, _SB.size)[0]:
                return False
            want = (
                _VERSION,
                geo.block,
                self.offloading_spec.chunk_bytes,
                geo.slot_size,
                geo.per_stripe,
                i,
                len(self._fds),
                self.offloading_spec.layout_digest,
                geo.data_off,
            )
            if (version, block, chunk, slot_size, per_stripe, idx, count, digest, data_off) != want:
                log.warning("nvme: %s holds another layout or geometry; reformatting", self.paths[i])
                return False
            ids.add(sid)
            epochs.append(epoch)
        if len(ids) != 1:
            return False
        self._slab_id = ids.pop()
        self._epoch = max(epochs)
        return True

    def _write_superblocks(self) -> None:
        geo = self._geo
        assert geo is not None
        buf = aligned_buffer(geo.data_off)
        for i, fd in enumerate(self._fds):
            head = _SB.pack(
                _SB_MAGIC,
                _VERSION,
                geo.block,
                self.offloading_spec.chunk_bytes,
                geo.slot_size,
                geo.per_stripe,
                self._epoch,
                i,
                len(self._fds),
                self._slab_id,
                self.offloading_spec.layout_digest,
                geo.data_off,
            )
            buf[: _SB.size + 8] = head + _U64.pack(_xxh(head))
            if os.pwritev(fd, [buf], 0) != buf.nbytes:
                raise OSError(errno.EIO, "short superblock write")
            os.fdatasync(fd)

    def _recover(self, fresh: bool) -> None:
        geo = self._geo
        assert geo is not None
        prefix = self._index_prefix()
        prefix.parent.mkdir(parents=True, exist_ok=True)
        ck_path = prefix.with_name(prefix.name + ".ckpt")
        journal = _Journal(prefix, self._slab_id, self._fds, self.durability == "fsync", self._stats.incr)
        gens = sorted(
            int(p.name.rsplit(".", 1)[1])
            for p in prefix.parent.glob(prefix.name + ".journal.*")
            if p.name.rsplit(".", 1)[1].isdigit()
        )
        idx = _SlotIndex(geo.nslots)
        ck = None if fresh else read_checkpoint(ck_path)
        if ck is not None and (ck.slab_id != self._slab_id or ck.nslots != geo.nslots):
            ck = None
        start_gen = 1
        if ck is not None:
            idx.load(ck)
            start_gen = ck.gen
        elif not fresh and gens:
            start_gen = gens[0]
        last_gen, last_end = 0, None
        if not fresh:
            for g in gens:
                if g < start_gen:
                    continue
                end = _replay(journal.path(g), self._slab_id, geo.nslots, idx)
                if end is not None:
                    last_gen, last_end = g, end
        # drop what recovery did not use: older generations, other slab sets
        for g in gens:
            if fresh or g < start_gen or (g > last_gen and last_gen):
                journal.path(g).unlink(missing_ok=True)
        if fresh:
            ck_path.unlink(missing_ok=True)
        if last_end is not None:
            journal.open_gen(last_gen, last_end)
        else:
            journal.open_gen(max(start_gen, 1), None)
        idx.rebuild_free()
        self._idx = idx
        self._journal = journal
        self._ckpt_path = ck_path
        self._stats.incr("recovered_chunks", len(idx.entries))

    def checkpoint(self) -> None:
        """Write the whole index to a new checkpoint and start a new journal generation (blocking)."""
        idx, journal = self._idx, self._journal
        assert idx is not None and journal is not None and self._geo is not None
        with self._ckpt_lock:
            with idx.lock:
                old_gen = journal.gen
                ck = idx.snapshot(self._slab_id, old_gen + 1)
                journal.rotate(old_gen + 1)
            write_checkpoint(self._ckpt_path, ck)
            for g in range(old_gen, 0, -1):
                p = journal.path(g)
                if not p.exists():
                    break
                p.unlink()
            self._stats.incr("checkpoints")

    def _checkpoint_if_due(self, journal: _Journal) -> None:
        """Wake the checkpointer once enough records are queued (not while it waits to retry)."""
        if journal.since_checkpoint >= self.checkpoint_every and not self._ckpt_retrying:
            self._ckpt_wake.set()

    def close_medium(self) -> None:
        """Stop the checkpointer, write a final checkpoint (a clean reopen replays nothing), close."""
        self._ckpt_stop = True
        self._ckpt_wake.set()
        if self._ckpt_thread is not None:
            self._ckpt_thread.join()
            self._ckpt_thread = None
        try:
            if self._journal is not None and self._journal.broken is None:
                self.checkpoint()
        finally:
            if self._journal is not None:
                self._journal.close()
            self._close_fds()

    def _close_fds(self) -> None:
        fds = self._fds  # emptied in place: the journal and the finalizer share this list
        while fds:
            os.close(fds.pop())

    # -- allocation ---------------------------------------------------------------------------
    def _next_seq(self) -> int:
        # under the index lock
        self._counter += 1
        if self._counter >= 1 << _EPOCH_SHIFT:  # pragma: no cover - 4 billion stores in one open
            raise OSError(errno.EOVERFLOW, "sequence numbers exhausted for this open; reopen the tier")
        return (self._epoch << _EPOCH_SHIFT) | self._counter

    def _allocate(self, key: bytes) -> tuple[int, int, int]:
        """Take a free slot (evicting LRU entries when none is): (slot, seq, ticket to await)."""
        idx = self._idx
        assert idx is not None
        with idx.lock:
            return self._allocate_locked(idx, key)

    def _allocate_locked(self, idx: _SlotIndex, key: bytes) -> tuple[int, int, int]:
        """:meth:`_allocate` for a caller that holds ``idx.lock``."""
        journal = self._journal
        assert journal is not None
        if not idx.free:
            # evict a batch: one journal flush then covers the next few stores; at most an
            # eighth of the slots, or a small slab is emptied whole (chunks just stored too)
            victims = idx.oldest_unpinned(min(self.evict_batch, max(1, idx.nslots // 8)))
            for s in victims:
                k = idx.slot_key[s]
                assert k
                idx.drop(k)
                t = journal.append(_pack_record(_EVICT, k, s, idx.slot_seq[s], 0))
                idx.release(s, t)
            if victims:
                self._stats.incr("evictions", len(victims))
            self._checkpoint_if_due(journal)
            if not idx.free:
                raise CapacityError(f"no free slot: all {idx.nslots} slots are being written or read", key)
        slot = idx.free.pop()
        ticket = idx.reuse_ticket.pop(slot, 0)
        seq = self._next_seq()
        idx.slot_seq[slot] = seq
        idx.writing[key] = idx.writing.get(key, 0) + 1
        return slot, seq, ticket

    def _publish(self, key: bytes, slot: int, seq: int, csum: int) -> int:
        """Make ``key`` -> ``slot`` visible and queue its record; return the ticket to await."""
        idx, journal = self._idx, self._journal
        assert idx is not None and journal is not None
        with idx.lock:
            if self._done_writing(idx, key, seq):  # removed while being written: nothing to publish
                idx.release(slot, 0)
                return 0
            idx.slot_csum[slot] = csum
            ticket = journal.append(_pack_record(_PUBLISH, key, slot, seq, csum))
            idx.slot_ticket[slot] = ticket
            old = idx.put(key, slot)
            if old is not None:  # a concurrent store of the same key won earlier: free its slot
                idx.release(old, ticket)
            self._checkpoint_if_due(journal)
        return ticket

    def _abort(self, key: bytes, slot: int, ticket: int = 0) -> None:
        """A write into ``slot`` failed: free it, still behind ``ticket`` (its ``EVICT`` record,
        which may not be in the journal yet if waiting for it is what failed)."""
        idx = self._idx
        assert idx is not None
        with idx.lock:
            self._done_writing(idx, key, 0)
            idx.release(slot, ticket)

    @staticmethod
    def _done_writing(idx: _SlotIndex, key: bytes, seq: int) -> bool:
        """The write of ``key`` numbered ``seq`` ended; True if ``key`` was removed while it ran
        (a store that began after the removal is not affected)."""
        killed = seq <= idx.killed.get(key, -1)
        n = idx.writing.get(key, 0) - 1
        if n > 0:
            idx.writing[key] = n
        else:
            idx.writing.pop(key, None)
            idx.killed.pop(key, None)
        return killed

    def _forget(self, key: bytes, slot: int | None = None, seq: int | None = None) -> int:
        """Drop ``key`` from the index; return a ticket or 0. With ``slot`` and ``seq`` (a bad
        copy just read), only that very copy: not one stored since, though it may have got
        the same slot back; without, whatever the key maps to, and the stores of it in
        flight are cancelled (an explicit removal)."""
        idx, journal = self._idx, self._journal
        assert idx is not None and journal is not None
        with idx.lock:
            if slot is None and key in idx.writing:  # the writes in flight now: numbered up to here
                idx.killed[key] = (self._epoch << _EPOCH_SHIFT) | self._counter
            cur = idx.entries.get(key)
            if cur is None or (slot is not None and (cur != slot or idx.slot_seq[cur] != seq)):
                return 0
            idx.drop(key)
            ticket = journal.append(_pack_record(_EVICT, key, cur, idx.slot_seq[cur], 0))
            idx.release(cur, ticket)
            return ticket

    # -- the primitives -----------------------------------------------------------------------
    def write_chunk(self, key: bytes, data: memoryview) -> None:
        """Write ``data`` into a free slot, then publish it (see the module docs for the order)."""
        geo, journal = self._geo, self._journal
        assert geo is not None and journal is not None
        slot, seq, ticket = self._allocate(key)
        try:
            journal.wait(ticket)  # the slot's EVICT record first: never overwrite a live mapping
            csum = checksum(data)
            head = ChunkHeader(key, data.nbytes, csum, self.offloading_spec.layout_digest, seq).pack()
            stripe, off = geo.locate(slot)
            fd = self._fds[stripe]
            if self._zero_copy_ok(data):
                hb = self._hdr_buf()
                hb[: len(head)] = head
                self._pwritev(fd, [hb, data], off)
            else:
                bb = self._bounce_buf()
                bb[: len(head)] = head
                bb[geo.hdr_area : geo.hdr_area + data.nbytes] = data  # bounce copy (unaligned view)
                self._stats.incr("bounce_copies")
                self._pwritev(fd, [bb], off)
        except BaseException:
            self._abort(key, slot, ticket)
            raise
        journal.wait(self._publish(key, slot, seq, csum))

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        """Read the slot of ``key`` into ``out`` and verify header (and payload, with ``verify``)."""
        geo, idx = self._geo, self._idx
        assert geo is not None and idx is not None
        with idx.lock:
            slot = idx.entries.get(key)
            if slot is None:
                raise ChunkNotFoundError(f"no chunk stored under key {key.hex()[:32]}", key)
            idx.touch_slot(slot)
            seq, csum = idx.slot_seq[slot], idx.slot_csum[slot]
            idx.pins[slot] = idx.pins.get(slot, 0) + 1
        try:
            stripe, off = geo.locate(slot)
            fd = self._fds[stripe]
            if self._zero_copy_ok(out):
                hb = self._hdr_buf()
                got = self._preadv(fd, [hb, out], off)
                payload = out
            else:
                bb = self._bounce_buf()
                got = self._preadv(fd, [bb], off)
                hb = bb[: geo.hdr_area]
                payload = bb[geo.hdr_area : geo.hdr_area + out.nbytes]
            bad = (
                IntegrityError(f"short read of slot {slot}: {got} bytes", key)
                if got < geo.hdr_area + out.nbytes
                else self._check_loaded(key, slot, seq, csum, hb, payload)
            )
            if bad is not None:
                bad.copy = (slot, seq)  # the copy to drop: not one stored since (_delete_bad_copy)
                raise bad
            if payload is not out:
                out[:] = payload  # bounce copy (unaligned view)
                self._stats.incr("bounce_copies")
        finally:
            # a bad copy is dropped by the caller: a load deletes it, fsck only when asked to
            self._unpin([slot])

    def chunk_exists(self, key: bytes) -> bool:
        """Whether ``key`` is indexed."""
        idx = self._idx
        assert idx is not None
        return key in idx.entries

    def _delete_bad_copy(self, key: bytes, exc: BaseException) -> None:
        """Drop the slot that failed verification, if ``key`` still maps to it with the same
        sequence number: a remove and a new store of ``key`` may have come in between, and a
        store in flight is not cancelled."""
        where = exc.copy if isinstance(exc, IntegrityError) else None
        if isinstance(where, tuple):
            journal = self._journal
            assert journal is not None
            journal.wait(self._forget(key, *where))

    def delete_chunk(self, key: bytes) -> bool:
        """Drop ``key`` (an ``EVICT`` record; its slot is rewritten only after that record)."""
        journal = self._journal
        assert journal is not None
        ticket = self._forget(key)
        journal.wait(ticket)
        return ticket > 0

    def list_chunks(self) -> list[bytes]:
        """Every indexed key, least recently used first."""
        idx = self._idx
        assert idx is not None
        with idx.lock:
            return idx.keys_lru()

    # -- coalesced batches: several chunks per job, contiguous slots in one I/O ----------------------
    def _group_size(self, op: str, n: int) -> int:
        """Chunks per job for a call of ``n`` chunks (1: one job per chunk, the base path)."""
        if op not in ("offload", "load") or n < 2 or self._geo is None:
            return 1
        cmax = self.coalesce_bytes // self._geo.slot_size
        if cmax < 2:
            return 1
        # keep at least one job per worker so the device still sees the full depth
        return max(1, min(cmax, n // (self.max_inflight or 1)))

    def _group_buf(self, g: int) -> memoryview:
        assert self._geo is not None
        need = g * self._geo.slot_size
        b = self._bufs.group
        if b is None or b.nbytes < need:
            b = self._bufs.group = aligned_buffer(need)
        return b

    def _runs(self, items: list[tuple[int, int]]) -> list[list[tuple[int, int, int, int]]]:
        """Group ``(position, slot)`` pairs into runs adjacent on one stripe: (pos, slot, stripe, off)."""
        geo = self._geo
        assert geo is not None
        located = sorted((*geo.locate(s), p, s) for p, s in items)
        runs: list[list[tuple[int, int, int, int]]] = []
        for stripe, off, p, s in located:
            last = runs[-1][-1] if runs else None
            if last is not None and last[2] == stripe and last[3] + geo.slot_size == off and len(runs[-1]) < 512:
                runs[-1].append((p, s, stripe, off))
            else:
                runs.append([(p, s, stripe, off)])
        return runs

    # -- group bookkeeping (shared by the thread and ring paths) ------------------------------
    def _alloc_group(
        self, keys: list[bytes], t0: float
    ) -> tuple[list[BaseException | None], dict[int, tuple[int, int]], int, tuple[list[int], int]]:
        """Under one lock, a slot for every key not stored yet: (each key's failure so far,
        position -> (slot, seq), the journal ticket to flush before writing any of them, and
        the keys stored already with the ticket to flush before saying so: the record that
        published them may still be queued). Keys that got no slot are booked here, the
        skipped ones by :meth:`_settle_skipped`."""
        idx, journal = self._idx, self._journal
        assert idx is not None and journal is not None
        out: list[BaseException | None] = [None] * len(keys)
        slots: dict[int, tuple[int, int]] = {}
        wait = skip_ticket = 0
        skipped: list[int] = []
        failed: list[int] = []
        with idx.lock:
            for p, k in enumerate(keys):
                have = idx.entries.get(k)
                if have is not None:  # already stored: skip the write
                    idx.touch_slot(have)
                    skipped.append(p)
                    skip_ticket = max(skip_ticket, idx.slot_ticket[have])
                    continue
                try:
                    slot, seq, ticket = self._allocate_locked(idx, k)
                except BaseException as e:
                    out[p] = e
                    failed.append(p)
                    continue
                slots[p] = (slot, seq)
                if ticket > wait:
                    wait = ticket
        for p in failed:
            self._end_store(keys[p], t0, out[p])
        return out, slots, wait, (skipped, skip_ticket)

    def _settle_skipped(
        self, keys: list[bytes], out: list[BaseException | None], skip: tuple[list[int], int], t0: float,
        error: BaseException | None,
    ) -> None:  # fmt: skip
        """Book the keys found stored: success once their records are in the journal, else ``error``."""
        skipped, _ = skip
        if not skipped:
            return
        if error is None:
            self._stats.record_successes("offload", 0, 0, time.perf_counter() - t0, skipped=len(skipped))
            return
        for p in skipped:
            out[p] = error
            self._end_store(keys[p], t0, error)

    def _abort_group(
        self,
        keys: list[bytes],
        ps: list[int],
        slots: dict[int, tuple[int, int]],
        out: list[BaseException | None],
        e: BaseException,
        t0: float,
        ticket: int = 0,
    ) -> None:
        """Positions ``ps`` were not written: free their slots (nothing published, still behind
        ``ticket``, the group's EVICT records), fail them."""
        for p in ps:
            self._abort(keys[p], slots[p][0], ticket)
            out[p] = e
            self._end_store(keys[p], t0, e)

    def _publish_group(
        self, keys: list[bytes], written: list[int], slots: dict[int, tuple[int, int]], csums: dict[int, int]
    ) -> int:
        """Publish every written chunk under one lock (records queued in index order, as
        :meth:`_publish` does); return the journal ticket to await."""
        idx, journal = self._idx, self._journal
        assert idx is not None and journal is not None
        last = 0
        with idx.lock:
            recs: list[bytes] = []
            puts: list[tuple[bytes, int]] = []
            for p in written:
                k = keys[p]
                slot, seq = slots[p]
                if self._done_writing(idx, k, seq):  # removed while being written: nothing to publish
                    idx.release(slot, 0)
                    continue
                idx.slot_csum[slot] = csums[p]
                recs.append(_pack_record(_PUBLISH, k, slot, seq, csums[p]))
                puts.append((k, slot))
            if recs:
                last = journal.append_many(recs)
                for t, (k, slot) in enumerate(puts, last - len(recs) + 1):
                    idx.slot_ticket[slot] = t
                    old = idx.put(k, slot)
                    if old is not None:  # an earlier store of the same key: free its slot
                        idx.release(old, t)
                self._checkpoint_if_due(journal)
        return last

    def _pin_group(
        self, keys: list[bytes], t0: float
    ) -> tuple[list[BaseException | None], dict[int, tuple[int, int, int]]]:
        """Under one lock, pin the slot of every key stored: (each key's failure so far,
        position -> (slot, seq, checksum)). Keys not stored are booked here."""
        idx = self._idx
        assert idx is not None
        out: list[BaseException | None] = [None] * len(keys)
        found: dict[int, tuple[int, int, int]] = {}
        with idx.lock:
            for p, k in enumerate(keys):
                slot = idx.entries.get(k)
                if slot is None:
                    out[p] = ChunkNotFoundError(f"no chunk stored under key {k.hex()[:32]}", k)
                    continue
                idx.touch_slot(slot)
                found[p] = (slot, idx.slot_seq[slot], idx.slot_csum[slot])
                idx.pins[slot] = idx.pins.get(slot, 0) + 1
        for p, missing in enumerate(out):
            if missing is not None:
                self._end_load(keys[p], t0, missing)
        return out, found

    def _check_loaded(
        self, key: bytes, slot: int, seq: int, csum: int, hb: memoryview, payload: memoryview
    ) -> IntegrityError | None:
        """Verify one loaded slot: its header is exactly what the index says was written
        (a byte comparison, no parse) and, with ``verify``, the payload checksum matches;
        anything else gets the full check and its precise error."""
        digest = self.offloading_spec.layout_digest
        if header_matches(hb, key, payload.nbytes, csum, digest, seq) and (
            not self.verify or checksum(payload) == csum
        ):
            return None
        try:
            self._check_slot(key, slot, seq, csum, hb, payload)
        except IntegrityError as e:
            return e
        return None

    def _end_load_group(
        self, keys: list[bytes], out: list[BaseException | None], found: dict[int, tuple[int, int, int]], t0: float
    ) -> list[BaseException | None]:
        """Book a group's loads (pins released already); drop the slots that failed verification."""
        ok = 0
        for p in found:
            outcome = out[p]
            if outcome is None:
                ok += 1
                continue
            if isinstance(outcome, IntegrityError):
                self._forget(keys[p], found[p][0], found[p][1])  # that copy only
            self._end_load(keys[p], t0, outcome)
        self._stats.record_successes("load", ok, self.offloading_spec.chunk_bytes, time.perf_counter() - t0)
        return out

    # -- group jobs on worker threads ------------------------------------------------------------
    def _store_group(self, keys: list[bytes], cids: list[int], t0: float) -> list[BaseException | None]:
        """Store several chunks: allocate, write each run of adjacent slots with one ``pwritev``,
        publish, one journal wait. Returns each key's failure (None: stored).

        The index lock is taken twice per group (allocate all, publish all), not per chunk,
        and stats are booked once: at 64 KiB the per-chunk Python work is what bounds the
        rate (bench/README.md, "nvme tier").
        """
        journal = self._journal
        assert journal is not None
        out, slots, wait, skip = self._alloc_group(keys, t0)
        self._write_group(keys, cids, t0, out, slots, wait)
        error: BaseException | None = None
        try:
            journal.wait(skip[1])
        except Exception as e:
            error = e
        self._settle_skipped(keys, out, skip, t0, error)
        return out

    def _write_group(
        self, keys: list[bytes], cids: list[int], t0: float, out: list[BaseException | None],
        slots: dict[int, tuple[int, int]], wait: int,
    ) -> None:  # fmt: skip
        """The writes of :meth:`_store_group`, with its slots allocated; outcomes land in ``out``."""
        geo, journal = self._geo, self._journal
        assert geo is not None and journal is not None
        if not slots:
            return
        try:
            journal.wait(wait)  # EVICT records of reused slots first
        except BaseException as e:
            self._abort_group(keys, list(slots), slots, out, e, t0, wait)
            return
        S, H = geo.slot_size, geo.hdr_area
        gbuf = self._group_buf(len(keys))
        digest = self.offloading_spec.layout_digest
        view, cb, zc_all = self._view, self.offloading_spec.chunk_bytes, self._zc_all
        csums: dict[int, int] = {}
        written: list[int] = []
        for run in self._runs([(p, s) for p, (s, _) in slots.items()]):
            iov: list[memoryview] = []
            try:
                for p, _slot, _, _ in run:
                    start = cids[p] * cb
                    data = view[start : start + cb]
                    csum = csums[p] = checksum(data)
                    head = pack_header(keys[p], cb, csum, digest, slots[p][1])
                    region = gbuf[p * S : (p + 1) * S]
                    region[: len(head)] = head
                    if zc_all or self._zero_copy_ok(data):
                        iov += [region[:H], data]
                    else:
                        region[H : H + cb] = data  # bounce copy (unaligned view)
                        self._stats.incr("bounce_copies")
                        iov.append(region)
                self._pwritev(self._fds[run[0][2]], iov, run[0][3])
            except BaseException as e:
                self._abort_group(keys, [p for p, _, _, _ in run], slots, out, e, t0, wait)
                continue
            written += [p for p, _, _, _ in run]
        last = self._publish_group(keys, written, slots, csums) if written else 0
        try:
            journal.wait(last)
        except BaseException as e:
            for p in written:
                out[p] = e
                self._end_store(keys[p], t0, e)
            written = []
        self._stats.record_successes("offload", len(written), cb, time.perf_counter() - t0)

    def _load_group(self, keys: list[bytes], cids: list[int], t0: float) -> list[BaseException | None]:
        """Load several chunks: one ``preadv`` per run of adjacent slots, then verify each."""
        geo = self._geo
        assert geo is not None
        out, found = self._pin_group(keys, t0)
        S, H = geo.slot_size, geo.hdr_area
        gbuf = self._group_buf(len(keys))
        view, cb, zc_all = self._view, self.offloading_spec.chunk_bytes, self._zc_all
        try:
            for run in self._runs([(p, s) for p, (s, _, _) in found.items()]):
                iov: list[memoryview] = []
                direct: list[bool] = []
                for p, _, _, _ in run:
                    start = cids[p] * cb
                    dst = view[start : start + cb]
                    region = gbuf[p * S : (p + 1) * S]
                    d = zc_all or self._zero_copy_ok(dst)
                    direct.append(d)
                    iov += [region[:H], dst] if d else [region]
                try:
                    got = self._preadv(self._fds[run[0][2]], iov, run[0][3])
                except BaseException as e:
                    for p, _, _, _ in run:
                        out[p] = e
                    continue
                for i, (p, slot, _, _) in enumerate(run):
                    if got < (i + 1) * S:
                        out[p] = IntegrityError(f"short read of slot {slot}", keys[p])
                        continue
                    start = cids[p] * cb
                    dst = view[start : start + cb]
                    region = gbuf[p * S : (p + 1) * S]
                    payload = dst if direct[i] else region[H : H + cb]
                    out[p] = self._check_loaded(keys[p], slot, found[p][1], found[p][2], region[:H], payload)
                    if out[p] is None and not direct[i]:
                        dst[:] = payload  # bounce copy (unaligned view)
                        self._stats.incr("bounce_copies")
        finally:
            self._unpin([s for s, _, _ in found.values()])
        return self._end_load_group(keys, out, found, t0)

    # -- the io_uring engine: jobs as coroutines on one ring served by the event loop ------------
    def _make_engine(self) -> Engine:
        why = ioring.problem() if self.io_engine != "psync" else "io_engine='psync'"
        if self.io_engine == "io_uring" and why is not None:
            raise TierConfigError(f"io_engine='io_uring' but io_uring is unavailable here: {why}")
        if self.io_engine == "auto" and why is not None:
            log.info("nvme: io_engine='auto' takes psync (%s)", why)
        self._ring_mode = why is None
        if not self._ring_mode:
            return super()._make_engine()
        # the runtime's bound, priorities and cancellation stay: its async engine runs one
        # coroutine per job in flight, each awaiting its slot I/O on the ring
        return engines.AsyncEngine(self.max_inflight or 1, name=f"asynctier-{self.tier_type}")

    async def _open_medium(self) -> None:
        await super()._open_medium()
        if not self._ring_mode:
            return
        geo = self._geo
        assert geo is not None
        jobs = self.max_inflight or 1
        per_job = max(1, self.coalesce_bytes // geo.slot_size) * geo.hdr_area
        try:
            # Kernel workers: left at the kernel's default (the pool is per thread, shared with
            # any other ring this event loop drives). Writes into written blocks complete
            # inline; only a slot's first write into a fallocated extent goes to a worker.
            self._lring = ioring.LoopRing(entries=max(64, 1 << (4 * jobs - 1).bit_length()), kernel_workers=0)
            weakref.finalize(self, self._lring.abandon)  # dropped without aclose(): no leak
        except BaseException:
            await super()._close_medium()
            raise
        # Hashing large chunks, journal waits (an fdatasync under "fsync") and rare retries run
        # here: on the loop's default executor (6 threads on 2 cores, shared with the
        # application) journal waits held the threads the hashes needed.
        self._ring_pool = ThreadPoolExecutor(max_workers=jobs + 1, thread_name_prefix="asynctier-nvme-ring")
        self._ring_hdr = aligned_buffer(jobs * per_job)
        self._ring_hdr_free = list(range(jobs - 1, -1, -1))
        # addresses by arithmetic on the hot path, not a buffer export per chunk
        self._ring_addrs = (buffer_address(self._ring_hdr), buffer_address(self._view), per_job)

    async def _close_medium(self) -> None:
        lring, self._lring = self._lring, None
        if lring is not None:
            await lring.aclose()
        pool, self._ring_pool = self._ring_pool, None
        if pool is not None:
            pool.shutdown(wait=False)  # the engine is drained: nothing is running on it
        await super()._close_medium()

    async def _on_pool(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking helper of the ring engine on the tier's own threads (to its end,
        even if cancelled: several read or write the caller's buffer)."""
        assert self._ring_pool is not None
        return await engines.finish_on_thread(fn, *args, executor=self._ring_pool)

    def _job_fn(self, op: str) -> Callable[..., Any]:
        if not self._ring_mode:
            return super()._job_fn(op)
        return self._coroutine_job_fn(op, self._ring_store_job, self._ring_load_job, self._on_pool)

    def _group_job_fn(self, op: str) -> Callable[..., Any]:
        if not self._ring_mode:
            return self._store_group if op == "offload" else self._load_group
        return self._ring_store_group if op == "offload" else self._ring_load_group

    async def _ring_store_job(self, key: bytes, cid: int, t0: float) -> None:
        e = (await self._ring_store_group([key], [cid], t0))[0]
        if e is not None:
            raise e

    async def _ring_load_job(self, key: bytes, cid: int, t0: float) -> None:
        e = (await self._ring_load_group([key], [cid], t0))[0]
        if e is not None:
            raise e

    async def _journal_flushed(self, ticket: int) -> None:
        """Wait for journal record ``ticket`` without blocking the loop (a flush may sync)."""
        journal = self._journal
        assert journal is not None
        if not journal.flushed(ticket):
            await self._on_pool(journal.wait, ticket)

    async def _ring_rw(self, write: bool, fd: int, spans: list[tuple[int, int]], offset: int) -> int:
        """One ``writev``/``readv`` SQE over ``spans`` (memory the tier keeps alive); its result."""
        lring = self._lring
        assert lring is not None
        iov = lring.ring.iovec_at(spans, None)
        (res,) = await lring.run(1, lambda ring, ud: ring.prep_rw(ud, write, fd, iov, offset), keep=iov)
        assert res is not None
        return res

    def _ring_views(self, spans: list[tuple[int, int]]) -> list[memoryview]:
        """The memoryviews behind ``spans`` (header pool or primary view), for a thread retry."""
        assert self._ring_hdr is not None
        hbase, vbase, _ = self._ring_addrs
        out = []
        for a, n in spans:
            if hbase <= a < hbase + self._ring_hdr.nbytes:
                out.append(self._ring_hdr[a - hbase : a - hbase + n])
            else:
                out.append(self._view[a - vbase : a - vbase + n])
        return out

    async def _ring_store_group(self, keys: list[bytes], cids: list[int], t0: float) -> list[BaseException | None]:
        """:meth:`_store_group` with each run of adjacent slots one ``writev`` on the ring."""
        if not self._zc_all:  # bounce copies (an unaligned primary view): the thread path has them
            return await self._on_pool(self._store_group, keys, cids, t0)
        out, slots, wait, skip = self._alloc_group(keys, t0)
        await self._ring_write_group(keys, cids, t0, out, slots, wait)
        try:
            await self._journal_flushed(skip[1])
        except BaseException as e:
            self._settle_skipped(keys, out, skip, t0, e)
            if isinstance(e, Exception):
                return out
            raise
        self._settle_skipped(keys, out, skip, t0, None)
        return out

    async def _ring_write_group(
        self, keys: list[bytes], cids: list[int], t0: float, out: list[BaseException | None],
        slots: dict[int, tuple[int, int]], wait: int,
    ) -> None:  # fmt: skip
        """The writes of :meth:`_ring_store_group`, with its slots allocated; outcomes land in ``out``."""
        geo, hdr = self._geo, self._ring_hdr
        assert geo is not None and hdr is not None
        if not slots:
            return
        H, cb = geo.hdr_area, self.offloading_spec.chunk_bytes
        hbase, vbase, per_job = self._ring_addrs
        digest = self.offloading_spec.layout_digest
        hslot = self._ring_hdr_free.pop()  # the engine's bound keeps one free per running job
        hoff = hslot * per_job
        pending = set(slots)  # neither written nor failed yet
        csums: dict[int, int] = {}
        written: list[int] = []  # written, not published
        published: list[int] = []
        try:
            await self._journal_flushed(wait)  # EVICT records of reused slots first
            for run in self._runs([(p, s) for p, (s, _) in slots.items()]):
                spans: list[tuple[int, int]] = []
                for i, (p, _slot, _, _) in enumerate(run):
                    start = cids[p] * cb
                    data = self._view[start : start + cb]
                    # a large chunk's checksum would hold the loop for 0.1 ms or more: hash it on a thread
                    csum = csums[p] = (
                        await self._on_pool(checksum, data) if cb >= engines.HASH_ON_THREAD_BYTES else checksum(data)
                    )
                    head = pack_header(keys[p], cb, csum, digest, slots[p][1])
                    h = hoff + i * H
                    hdr[h : h + len(head)] = head
                    spans += [(hbase + h, H), (vbase + start, cb)]
                fd, off, want = self._fds[run[0][2]], run[0][3], len(run) * (H + cb)
                ps = [p for p, _, _, _ in run]
                try:
                    res = await self._ring_rw(True, fd, spans, off)
                    if res < 0:
                        raise OSError(-res, f"writev of slots at offset {off}: {os.strerror(-res)}")
                    if res < want:  # short write (rare): finish it with the looping system call
                        await self._on_pool(_pwritev_all, fd, self._ring_views(spans), off)
                except Exception as e:
                    pending.difference_update(ps)
                    self._abort_group(keys, ps, slots, out, e, t0, wait)
                    continue
                pending.difference_update(ps)
                written += ps
            published, written = written, []
            last = self._publish_group(keys, published, slots, csums) if published else 0
            await self._journal_flushed(last)
        except BaseException as e:
            # cancelled (or the journal failed): what was not published frees its slot
            self._abort_group(keys, sorted(pending) + written, slots, out, e, t0, wait)
            for p in published:
                out[p] = e
                self._end_store(keys[p], t0, e)
            if isinstance(e, Exception):
                return
            raise
        finally:
            self._ring_hdr_free.append(hslot)
        self._stats.record_successes("offload", len(published), cb, time.perf_counter() - t0)

    async def _ring_load_group(self, keys: list[bytes], cids: list[int], t0: float) -> list[BaseException | None]:
        """:meth:`_load_group` with each run of adjacent slots one ``readv`` on the ring."""
        if not self._zc_all:
            return await self._on_pool(self._load_group, keys, cids, t0)
        geo, hdr = self._geo, self._ring_hdr
        assert geo is not None and hdr is not None
        out, found = self._pin_group(keys, t0)
        H, cb = geo.hdr_area, self.offloading_spec.chunk_bytes
        hbase, vbase, per_job = self._ring_addrs
        hslot = self._ring_hdr_free.pop()
        hoff = hslot * per_job
        undecided = set(found)
        try:
            for run in self._runs([(p, s) for p, (s, _, _) in found.items()]):
                spans: list[tuple[int, int]] = []
                for i, (p, _, _, _) in enumerate(run):
                    spans += [(hbase + hoff + i * H, H), (vbase + cids[p] * cb, cb)]
                fd, off, want = self._fds[run[0][2]], run[0][3], len(run) * (H + cb)
                try:
                    got = await self._ring_rw(False, fd, spans, off)
                    if got < 0:
                        raise OSError(-got, f"readv of slots at offset {off}: {os.strerror(-got)}")
                    if got < want:  # short read (rare): what the looping system call gets
                        got = await self._on_pool(_preadv_all, fd, self._ring_views(spans), off)
                except Exception as e:
                    for p, _, _, _ in run:
                        out[p] = e
                        undecided.discard(p)
                    continue
                for i, (p, slot, _, _) in enumerate(run):
                    undecided.discard(p)
                    if got < (i + 1) * (H + cb):
                        out[p] = IntegrityError(f"short read of slot {slot}", keys[p])
                        continue
                    h = hoff + i * H
                    start = cids[p] * cb
                    args = (keys[p], slot, found[p][1], found[p][2], hdr[h : h + H], self._view[start : start + cb])
                    if cb >= engines.HASH_ON_THREAD_BYTES and self.verify:
                        out[p] = await self._on_pool(self._check_loaded, *args)
                    else:
                        out[p] = self._check_loaded(*args)
        except BaseException as e:  # cancelled: the chunks not read yet fail with it
            for p in undecided:
                out[p] = e
            raise
        finally:
            self._ring_hdr_free.append(hslot)
            self._unpin([s for s, _, _ in found.values()])
            self._end_load_group(keys, out, found, t0)
        return out

    def _check_slot(self, key: bytes, slot: int, seq: int, csum: int, hb: memoryview, payload: memoryview) -> None:
        """Raise :class:`IntegrityError` unless the slot holds exactly the indexed write of ``key``."""
        hdr = ChunkHeader.unpack(hb, key=key)
        if hdr.seq != seq or hdr.checksum != csum:
            raise IntegrityError(f"slot {slot} holds another write of this key (stale or reused)", key)
        hdr.verify(
            payload,
            layout_digest=self.offloading_spec.layout_digest,
            payload_len=payload.nbytes,
            check_data=self.verify,
        )

    def _unpin(self, slots: list[int]) -> None:
        idx = self._idx
        assert idx is not None
        with idx.lock:
            for slot in slots:
                n = idx.pins[slot] - 1
                if n:
                    idx.pins[slot] = n
                else:
                    del idx.pins[slot]
                    t = idx.zombies.pop(slot, None)
                    if t is not None:
                        idx.release(slot, t)

    # -- index-backed contract methods (O(1), no I/O) ----------------------------------------------
    def _begin_store(self, key: bytes) -> list[bytes] | None:
        idx = self._idx
        assert idx is not None
        journal = self._journal
        assert journal is not None
        with idx.lock:
            slot = idx.entries.get(key)
            if slot is None:
                return []
            idx.touch_slot(slot)
            ticket = idx.slot_ticket[slot]  # the record that published it
        journal.wait(ticket)  # (worker threads only) acknowledged as stored once it is journaled
        return None  # already stored: skip the write

    async def lookup(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key is indexed (O(1) each; a load still verifies the slot)."""
        ks = self._check_keys(keys)
        self._check_open()
        idx = self._idx
        assert idx is not None
        entries = idx.entries
        return [k in entries for k in ks]

    async def touch(self, keys: Sequence[bytes]) -> None:
        """Make stored keys most recently used."""
        ks = self._check_keys(keys)
        self._check_open()
        # the index lock is held across a checkpoint snapshot and journal sync: take it on a
        # thread, never on the event loop
        await asyncio.to_thread(self._touch_sync, ks)

    def _touch_sync(self, keys: list[bytes]) -> None:
        idx = self._idx
        assert idx is not None
        with idx.lock:
            for k in keys:
                slot = idx.entries.get(k)
                if slot is not None:
                    idx.touch_slot(slot)

    def _stored_chunks(self) -> int | None:
        return len(self._idx.entries) if self._idx is not None else 0

    def _used_bytes(self) -> int | None:
        return (len(self._idx.entries) * self.stored_size()) if self._idx is not None else 0


def _checkpointer(ref: weakref.ReferenceType[NvmeTier], wake: threading.Event) -> None:
    """Body of a tier's checkpoint thread: a checkpoint each time the journal asks for one.

    A failed checkpoint (a full or failing index directory) is retried after a pause that
    doubles up to :data:`_CKPT_RETRY_MAX_S`, not on every store: each try snapshots the whole
    index under its lock. The journal keeps every record meanwhile; only replay grows.
    """
    delay: float | None = None
    while True:
        wake.wait(delay)
        wake.clear()
        tier = ref()
        if tier is None or tier._ckpt_stop:
            return
        try:
            tier.checkpoint()
        except Exception as e:
            delay = min(_CKPT_RETRY_MAX_S, 2 * delay if delay else _CKPT_RETRY_MIN_S)
            tier._ckpt_retrying = True
            tier._stats.incr("checkpoint_failures")
            log.warning("nvme: checkpoint failed (%r); the journal holds everything, next try in %.1f s", e, delay)
        else:
            delay = None
            tier._ckpt_retrying = False
        del tier


def _release(wake: threading.Event, fds: list[int], journal: _Journal) -> None:
    """Finalizer of a tier collected without ``aclose()``: end its thread, close its files."""
    wake.set()
    journal.close()
    while fds:
        os.close(fds.pop())


def _pwritev_all(fd: int, bufs: list[memoryview], offset: int) -> None:
    total = sum(b.nbytes for b in bufs)
    n = os.pwritev(fd, bufs, offset)
    if n == total:
        return
    # short write (rare): finish buffer by buffer
    done = n
    pos = 0
    for b in bufs:
        if done >= b.nbytes:
            done -= b.nbytes
            pos += b.nbytes
            continue
        rest = b[done:]
        while rest.nbytes:
            m = os.pwrite(fd, rest, offset + pos + done)
            if m <= 0:
                raise OSError(errno.EIO, f"pwrite wrote {m} bytes at offset {offset + pos + done}")
            rest = rest[m:]
            done += m
        pos += b.nbytes
        done = 0


def _preadv_all(fd: int, bufs: list[memoryview], offset: int) -> int:
    total = sum(b.nbytes for b in bufs)
    n = os.preadv(fd, bufs, offset)
    if n == total or n == 0:
        return n
    got = n
    pos = 0
    for b in bufs:
        if got >= pos + b.nbytes:
            pos += b.nbytes
            continue
        rest = b[got - pos :] if got > pos else b
        while rest.nbytes:
            m = os.preadv(fd, [rest], offset + got)
            if m == 0:
                return got
            rest = rest[m:]
            got += m
        pos += b.nbytes
    return got
