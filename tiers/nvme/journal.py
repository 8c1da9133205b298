"""The journal: an append-only log of ``PUBLISH`` / ``EVICT`` records after the checkpoint,
written with group commit; and its replay at open."""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from . import sysio
from .files import IndexDir
from .format import EVICT, JOURNAL_HEAD, JR_MAGIC, PUBLISH, RECORD, U64, VERSION, pack_journal_head, xxh
from .slots import SlotIndex

__all__ = ["Claim", "Journal", "replay"]

log = logging.getLogger(__name__)


class Claim(NamedTuple):
    """The records of one flush taken by a caller that writes them itself (:meth:`Journal.claim`)."""

    batch: list[bytes]
    target: int  #: the ticket of the last record in it
    start: int  #: where in the journal file they go
    data: bytes  #: the records, joined


class Journal:
    """Append-only record log with group commit.

    Records are queued in memory (:meth:`append`, under the index lock so the journal's order
    is the index's order) and written by whichever waiter first finds no flush running
    (:meth:`wait`); one write (and, when durable, one ``fdatasync`` of the slabs then one of
    the journal) covers every record queued meanwhile. A ticket is the record's position.
    """

    def __init__(
        self,
        where: IndexDir,
        base: str,
        slab_id: bytes,
        data_fds: list[int],
        durable: bool,
        count: Callable[[str], None] = lambda name: None,
    ) -> None:
        self.where = where  # the index directory, open
        self.base = base  # file names start with it
        self._count = count  # the tier's stats counter
        self.slab_id = slab_id
        self.data_fds = data_fds
        self.durable = durable
        self.fd = -1
        self.gen = 0
        # appends, claims and settling take the condition's lock alone (a Condition's own
        # enter and exit are Python calls, and these run on the loop thread)
        self._mu = threading.Lock()
        self._cv = threading.Condition(self._mu)
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

    def name(self, gen: int) -> str:
        """The file name of generation ``gen`` in the index directory."""
        return journal_name(self.base, gen)

    def path(self, gen: int) -> Path:
        return self.where.path / self.name(gen)

    def open_gen(self, gen: int, valid_end: int | None) -> None:
        """Append to generation ``gen``: truncate it to ``valid_end``, or create it afresh
        (never through a link: :class:`~.files.IndexDir`)."""
        name = self.name(gen)
        fd = self.where.create(name) if valid_end is None else self.where.open_existing(name, os.O_WRONLY)
        try:
            if valid_end is None:
                sysio.write_all(fd, memoryview(pack_journal_head(gen, self.slab_id)))
                os.fsync(fd)
                self.where.sync()  # the new file must exist after a crash before records in it count
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
        with self._mu:
            self._pending.append(rec)
            self._appended += 1
            self.since_checkpoint += 1
            return self._appended

    def append_many(self, recs: list[bytes]) -> int:
        """Queue several records at once; return the last one's ticket (the first's is
        ``last - len(recs) + 1``)."""
        with self._mu:
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

    def flushed_upto(self) -> int:
        """The last ticket in the journal (0 once it is broken): :meth:`flushed` for many tickets."""
        return self._done if self.broken is None else 0

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

    def claim(self) -> Claim | None:
        """Take the records queued for one flush without waiting: the caller writes
        ``data`` at ``start`` of :attr:`fd` (after ``fdatasync`` of :attr:`data_fds`, and
        syncs it, when :attr:`durable`), then calls :meth:`claimed` or :meth:`claim_failed`;
        meanwhile, :meth:`wait` waits for it as for any flush. None when a flush is running,
        nothing is queued or the journal is unusable (:meth:`wait` says which)."""
        with self._mu:
            if self._busy or not self._pending or self.broken is not None or self.fd < 0:
                return None
            self._busy = True
            batch, self._pending = self._pending, []
            return Claim(batch, self._appended, self._end, b"".join(batch))

    def claimed(self, claim: Claim) -> None:
        """``claim``'s records are in (and synced, when durable): the waiters up to it go on."""
        self._end = claim.start + len(claim.data)
        self._settle(claim.batch, claim.target, True, False, None, None)

    def claim_failed(self, claim: Claim, err: BaseException) -> None:
        """Writing ``claim``'s records failed with ``err``: cut the file back and queue them
        again, as a failed flush of :meth:`wait` (file I/O: not on an event loop's thread)."""
        mended = self._cut_back(claim.start, err)
        self._settle(claim.batch, claim.target, False, mended, err, None)

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
            if batch:  # at its offset, as a worker's commit (claim) writes: the file position is not used
                sysio.pwritev_all(self.fd, [memoryview(data)], start)
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
            mended = self._cut_back(start, err)
        self._settle(batch, target, written, mended, err, rotate_to)
        if err is not None:
            raise err

    def _cut_back(self, start: int, err: BaseException) -> bool:
        """A flush failed before its records were all in. A full or failing disk may recover:
        cut off what may be half-written (the batch is queued again by :meth:`_settle`, ahead
        of what came meanwhile, and the next wait() writes it). Its waiters hear of this
        failure now (a store so reported may still end up stored). False: it cannot be cut."""
        mended = False
        try:
            os.ftruncate(self.fd, start)
            mended = True
        except OSError:
            pass
        what = "cut back, its records are queued again" if mended else "cannot cut back: no more stores"
        log.warning("nvme journal %s: a flush failed (%r); %s", self.path(self.gen), err, what)
        return mended

    def _settle(
        self, batch: list[bytes], target: int, written: bool, mended: bool, err: BaseException | None,
        rotate_to: int | None,
    ) -> None:  # fmt: skip
        """Publish a flush's outcome to the waiters (and the next flusher)."""
        with self._mu:
            self._busy = False
            if rotate_to is not None and (err is not None or not written):
                self.since_checkpoint += len(batch)  # counted again: no checkpoint took them
            if written:
                self._done = target
                self.flushes += 1
            elif mended:
                self._pending[:0] = batch
                self.mended += 1
                self._count("journal_mended")
            else:  # records may be half-written and cannot be cut off: no more acknowledgements
                self.broken = err
            self._cv.notify_all()

    def start_rotation(self) -> tuple[list[bytes], int]:
        """Take every record queued for :meth:`rotate`, which must follow; until it ends no
        other flush runs, and the records queued meanwhile wait for the new generation.

        Called with the index lock held, so the records taken are exactly those the caller's
        snapshot reflects; :meth:`rotate`, file I/O, runs without it.
        """
        with self._cv:
            while self._busy:
                self._cv.wait()
            if self.fd < 0:
                raise OSError(errno.EBADF, f"nvme journal {self.path(self.gen)} is closed")
            self._busy = True
            batch, self._pending = self._pending, []
            # the records queued from here on are the next checkpoint's (counted while this
            # one's rotation runs: else each store then would ask for another checkpoint)
            self.since_checkpoint = 0
            return batch, self._appended

    def rotate(self, taken: tuple[list[bytes], int], new_gen: int) -> None:
        """Write the records ``taken`` by :meth:`start_rotation` into the current generation,
        sync it, then switch to ``new_gen``."""
        batch, target = taken
        self._flush(batch, target, rotate_to=new_gen)

    def close(self) -> None:
        """Close the current generation, once a flush running now has ended; a later
        :meth:`wait` then fails (nothing is written to a closed descriptor)."""
        with self._cv:
            while self._busy:
                self._cv.wait()
            if self.fd >= 0:
                os.close(self.fd)
                self.fd = -1
            if self.broken is None:
                self.broken = OSError(errno.EBADF, "the journal is closed")
            self._cv.notify_all()


def journal_name(base: str, gen: int) -> str:
    """The file name of generation ``gen`` of the slab set whose index files start with ``base``."""
    return f"{base}.journal.{gen:08d}"


class Replayed(NamedTuple):
    """What :func:`replay` made of a generation: the end of its last valid record (the
    caller cuts the file there), and the damaged stretches it skipped between valid records
    (how many, and their bytes)."""

    end: int
    damaged: int
    damaged_bytes: int = 0


def damage_of(data: bytes | None, done: Replayed | None) -> str | None:
    """What :func:`replay` of ``data`` (giving ``done``) found damaged on the medium, said for a
    log line or an error; None if nothing. A header that fails with records after it is
    damage (every record of the generation is lost); an empty or headerless file is what a
    kill leaves while a generation is made."""
    if done is None:
        if data is not None and len(data) > JOURNAL_HEAD.size + 8:
            return f"its header is damaged: the {len(data)} bytes of records after it are lost"
        return None
    if done.damaged:
        return (
            f"{done.damaged} damaged stretch(es) ({done.damaged_bytes} bytes) between valid records: the chunks "
            "recorded there are lost"
        )
    return None


def _next_record(data: bytes, off: int, nslots: int) -> int | None:
    """The offset of the first valid record at ``off`` or after it (None: none). The cheap
    fields are checked before the checksum: a stretch of zeros is passed over quickly."""
    mv, n, rs = memoryview(data), len(data), RECORD.size
    for at in range(off, n - rs - 8 + 1):
        typ, _, klen, slot, _, _ = RECORD.unpack_from(data, at)
        end = at + rs + klen
        if (
            typ in (PUBLISH, EVICT)
            and slot < nslots
            and end + 8 <= n
            and xxh(mv[at:end]) == U64.unpack_from(data, end)[0]
        ):
            return at
    return None


def replay(data: bytes | None, slab_id: bytes, nslots: int, index: SlotIndex) -> Replayed | None:
    """Apply one journal generation's bytes to ``index`` (None if unusable or absent).

    A record that fails its checksum or names a slot out of range ends the generation when no
    valid record follows it: the torn tail of a crash, cut off by the caller before new records
    are appended. One followed by valid records is damage in the middle (a flipped bit): it is
    skipped and counted, and the records after it are applied. Cutting there would lose them,
    and the chunks they name; what the skipped record said is lost (a key published there is
    not served; one evicted there maps to a slot a later record may give another key, which
    takes it, and a load checks the slot's header).
    """
    if data is None:
        return None
    hs = JOURNAL_HEAD.size + 8
    if len(data) < hs:
        return None
    magic, version, _pad, _gen, sid = JOURNAL_HEAD.unpack_from(data)
    if magic != JR_MAGIC or version != VERSION or sid != slab_id:
        return None
    if xxh(memoryview(data)[: JOURNAL_HEAD.size]) != U64.unpack_from(data, JOURNAL_HEAD.size)[0]:
        return None
    mv = memoryview(data)
    off = hs
    n = len(data)
    rs = RECORD.size
    entries = index.entries
    seqs = index.slot_seq
    csums = index.slot_csum
    put = index.put
    damaged = damaged_bytes = 0
    valid_end = off
    while off + rs + 8 <= n:
        typ, _, klen, slot, seq, csum = RECORD.unpack_from(data, off)
        end = off + rs + klen
        whole = end + 8 <= n and xxh(mv[off:end]) == U64.unpack_from(data, end)[0]
        if not whole or slot >= nslots or typ not in (PUBLISH, EVICT):
            after = _next_record(data, off + 1, nslots)
            if after is None:
                break  # torn tail
            damaged += 1
            damaged_bytes += after - off
            off = after
            continue
        key = data[off + rs : end]
        if typ == PUBLISH:
            put(key, slot)
            seqs[slot] = seq
            csums[slot] = csum
        elif entries.get(key) == slot and seqs[slot] == seq:
            index.drop(key)
        off = valid_end = end + 8
    return Replayed(valid_end, damaged, damaged_bytes)
