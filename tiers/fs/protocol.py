"""The fs tier's chunk protocol: what a store, a load and an eviction do, decided once.

Each operation is planned here as a small record of system-call arguments (a *job*), and
run by either engine: :mod:`.threads` makes the calls with :mod:`os` on a worker thread,
:mod:`.native` hands the same job to the C workers as one descriptor. Both report an
:class:`Outcome` of one shape (the step that failed, with its errno), and what follows an
outcome (bookkeeping, what to remove, whether a retry can mend it) is decided here too.

A store (:class:`StoreJob`) fills one file with the header block and the payload in one
``pwritev`` and publishes it atomically; the file is one of (:class:`Source`):

* a new unnamed file (``O_TMPFILE``) made in the key's shard, linked under its name;
* an unnamed file made ahead by the pool, linked the same way;
* a new file under a temporary name (``O_CREAT | O_EXCL``), renamed over its name;
* an evicted chunk's file, taken over (:class:`SpareJob`: opened, renamed away) and
  overwritten in place, then renamed over its name.

With ``durability="fsync"`` the file's data is synced before it is published and the shard
directory after. A load (:class:`LoadJob`) opens the file, reads the header block and the
payload (straight into the caller's slice) in one ``preadv``, and checks the header and the
payload's checksum (:meth:`ChunkProtocol.check_read`).
"""

from __future__ import annotations

import enum
import errno
import logging
import os
import stat
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from asynctier.engines.speedups import speedups
from asynctier.errors import ChunkNotFoundError, IntegrityError, TierClosedError
from asynctier.integrity import ChunkHeader, checksum, header_matches, key_token, pack_header
from asynctier.posix_io import O_DIRECT, O_NOATIME, buffer_address
from asynctier.spec import OffloadingSpec
from asynctier.stats import StatsRecorder

from .layout import HEADER_BLOCK, TempNames, shard_of
from .pool import O_TMPFILE, TmpfilePool

if TYPE_CHECKING:
    from .tier import FsTier

__all__ = [
    "NOSPACE",
    "ChunkProtocol",
    "LoadJob",
    "Outcome",
    "Source",
    "Spare",
    "SpareJob",
    "Step",
    "StoreJob",
    "TierHandle",
    "UnlinkJob",
]

log = logging.getLogger(__name__)

# a load's header check, per chunk on both engines: the C twin where built
_fast = speedups()
_header_matches = header_matches if _fast is None else _fast.header_matches

#: errno values of a full file system (or quota): evict and retry once.
NOSPACE = (errno.ENOSPC, errno.EDQUOT)
#: Every open of an existing chunk file: never through a symbolic link (ELOOP), never
#: blocking on a FIFO someone put at the name (harmless for regular files).
SAFE_OPEN = os.O_NOFOLLOW | os.O_NONBLOCK
#: What the C workers report for a non-regular file at a chunk's name (after fstat).
_NOT_REGULAR = (errno.EISDIR, errno.ENXIO, errno.ELOOP)


def describe(mode: int) -> str:
    """What kind of file ``mode`` (``st_mode``) stands for, for an error message."""
    for test, what in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return what
    return "not a regular file"


def regular_mode(fd: int) -> int | Outcome:
    """``fd``'s mode if it is a regular file, else the failed open's outcome (closing it)."""
    mode = os.fstat(fd).st_mode
    if stat.S_ISREG(mode):
        return mode
    os.close(fd)
    return Outcome(Step.OPEN, errno.EISDIR if stat.S_ISDIR(mode) else errno.ENXIO, what=describe(mode))


class Step(enum.IntEnum):
    """The step a job failed at (the C workers report the same numbers)."""

    NONE = 0
    OPEN = 1
    IO = 2
    DATASYNC = 3
    LINK = 4
    DIRSYNC = 5
    RENAME = 6
    UNLINK = 7
    SHARED = 8  #: recycling: another tier holds the namespace, the file was not overwritten
    WITHDRAWN = 9  #: a group's job taken back, its call cancelled: nothing done (native engine only)


class Source(enum.IntEnum):
    """Which file a store fills (and so how it is published)."""

    TMPFILE = 1  #: a new unnamed file in the shard, made by the job; linkat
    POOLED = 2  #: an unnamed file made ahead (``fd``); linkat
    TEMP = 3  #: a new file named ``temp``, made by the job; renameat
    RECYCLED = 4  #: an evicted file, open (``fd``) under the name ``temp``; renameat


@dataclass(slots=True)
class Outcome:
    """How a job ended: ``step`` is the one that failed (``NONE``: it did not), ``err`` its errno."""

    step: Step = Step.NONE
    err: int = 0
    #: bytes moved; a spare job: the descriptor of the file it took
    result: int = 0
    #: a store published by link found the name taken (another writer's copy stays)
    name_taken: bool = False
    #: the payload's xxh3 where the job computed it
    csum: int | None = None
    #: what was found at the name where a regular file was wanted ("a FIFO", ...)
    what: str = ""

    @property
    def ok(self) -> bool:
        return self.step == Step.NONE

    @property
    def not_regular(self) -> bool:
        """The open found something else than a regular file at the name (or a link)."""
        return bool(self.what) or (self.step == Step.OPEN and self.err == errno.ELOOP)

    def error(self, name: str = "") -> OSError:
        """The failure as the :class:`OSError` subclass Python raises for its errno."""
        text = os.strerror(self.err)
        what = self.what or ("a symbolic link" if self.step == Step.OPEN and self.err == errno.ELOOP else "")
        if what:
            text = f"{text} ({what} at the chunk's name)"
        return OSError(self.err, text, name) if name else OSError(self.err, text)


@dataclass(slots=True)
class Spare:
    """An evicted chunk's file, open for writing and renamed away to ``temp`` in ``dfd``."""

    fd: int
    dfd: int
    temp: str


@dataclass(slots=True)
class StoreJob:
    """Fill one file with ``header`` (padded to the header block) and the payload; publish it
    as ``name`` in the shard ``dfd``; ``sync``: fdatasync the file, fsync the shard."""

    key: bytes
    dfd: int
    name: str
    flags: int  #: open flags of a file the job makes (``O_WRONLY`` [| ``O_DIRECT``])
    source: Source
    fd: int  #: POOLED, RECYCLED: the file (the protocol's to close, see :meth:`ChunkProtocol.release`)
    temp: str  #: TEMP, RECYCLED: its name in ``dfd``; else ""
    sync: bool
    header: bytes  #: packed header; with ``fill``, packed with a zero checksum
    fill: bool  #: the executor fills in the payload's checksum and the header's own

    @property
    def link(self) -> bool:
        """Published by ``linkat`` of an unnamed file (else by ``renameat`` of ``temp``)."""
        return self.source in (Source.TMPFILE, Source.POOLED)


@dataclass(slots=True)
class LoadJob:
    """Open ``name`` in ``dfd`` with ``flags``; read the header block and the payload."""

    key: bytes
    dfd: int
    name: str
    flags: int


@dataclass(slots=True)
class SpareJob:
    """Take over ``victim``'s file: open it (``flags``), give it the permission bits ``mode``
    (it keeps its inode, so the mode it was made with: a root reopened with another
    ``file_mode``), rename it to ``temp`` in ``new_dfd``."""

    victim: bytes
    dfd: int
    name: str
    flags: int
    new_dfd: int
    temp: str
    mode: int


@dataclass(slots=True)
class UnlinkJob:
    """Evict ``victim`` by unlinking its file."""

    victim: bytes
    dfd: int
    name: str


def not_found(key: bytes) -> ChunkNotFoundError:
    return ChunkNotFoundError(f"no chunk stored under key {key.hex()[:32]}", key)


def remove_quietly(dfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except FileNotFoundError:
        pass
    except OSError as e:
        log.debug("fs tier: cannot remove %s: %r", name, e)


class ChunkProtocol:
    """The plans of one open namespace, and what the file system it lives on allows.

    Holds the shard descriptors, the temporary names, the pool of files made ahead and the
    facts learned about the file system (``O_TMPFILE``, ``O_DIRECT``, ``O_NOATIME``), which
    a refusal turns off for good (logged once).
    """

    def __init__(
        self,
        directory: Path,
        spec: OffloadingSpec,
        shard_fds: list[int],
        names: TempNames,
        stats: StatsRecorder,
        *,
        sync: bool,
        verify: bool,
    ) -> None:
        self.directory = directory
        self.shard_fds = shard_fds
        self.names = names
        self.sync = sync
        self.verify = verify
        self.pool: TmpfilePool | None = None
        #: the mode of the chunk files made, and whether the umask strips bits of it (set at open)
        self.file_mode = 0o600
        self.fix_mode = False
        self.use_tmpfile = False
        self.use_direct = False
        self.block = HEADER_BLOCK  #: the alignment O_DIRECT needs
        # Reads leave the access time alone: recency lives in mtime, and relatime would
        # otherwise dirty the inode of every chunk on its first load after a store.
        self.read_flags = os.O_RDONLY | O_NOATIME | SAFE_OPEN
        self._digest = spec.layout_digest
        self._stats = stats
        self._fallback_logged = False
        self._refusal_lock = threading.Lock()  # worker threads may be refused at once: count one

    # -- names and flags -------------------------------------------------------------------
    def name(self, key: bytes) -> tuple[int, str]:
        """(shard directory descriptor, file name) of ``key``'s chunk."""
        return self.shard_fds[shard_of(key)], key_token(key)

    def direct_for(self, view: memoryview, address: int | None = None, *, count: bool = True) -> bool:
        """O_DIRECT for this transfer? Counts (and logs once) the fallbacks unless ``count`` is False."""
        if not self.use_direct:
            return False
        blk = self.block
        if view.nbytes % blk == 0 and (buffer_address(view) if address is None else address) % blk == 0:
            return True
        if count:
            self._stats.incr("direct_io_fallbacks")
            if not self._fallback_logged:
                self._fallback_logged = True
                log.warning(
                    "fs tier %s: buffer not aligned to the %d-byte block (address or length); using buffered "
                    "I/O for such chunks (counted in stats().extra['direct_io_fallbacks'])",
                    self.directory,
                    blk,
                )
        return False

    def write_flags(self, data: memoryview, address: int | None = None, *, count: bool = True) -> int:
        return os.O_WRONLY | (O_DIRECT if self.direct_for(data, address, count=count) else 0)

    # -- plans -----------------------------------------------------------------------------
    def store(
        self, key: bytes, data: memoryview, csum: int | None, spare: Spare | None = None, flags: int | None = None,
        *, pooled: bool = True,
    ) -> StoreJob:  # fmt: skip
        """The plan of a store of ``data`` under ``key``: into ``spare`` where given, else a
        file made ahead (not with ``pooled=False``), a new unnamed file, or a new temporary
        file (publishing by rename). ``csum`` None: the executor fills in the checksums (the
        header is packed with zero)."""
        dfd, name = self.name(key)
        if flags is None:
            flags = self.write_flags(data)
        header = pack_header(key, data.nbytes, csum or 0, self._digest)
        if spare is not None:
            source, fd, temp = Source.RECYCLED, spare.fd, spare.temp
        elif not self.use_tmpfile:
            source, fd, temp = Source.TEMP, -1, self.names.next()
        else:
            source, fd, temp = Source.TMPFILE, -1, ""
            pool = self.pool
            if pool is not None and pooled and flags == pool.flags:
                taken = pool.take()
                if taken is None:
                    self._stats.incr("tmpfile_pool_empty")
                else:
                    source, fd = Source.POOLED, taken
        return StoreJob(key, dfd, name, flags, source, fd, temp, self.sync, header, csum is None)

    def load(self, key: bytes, out: memoryview, address: int | None = None) -> LoadJob:
        dfd, name = self.name(key)
        return LoadJob(key, dfd, name, self.read_flags | (O_DIRECT if self.direct_for(out, address) else 0))

    def spare(self, victim: bytes, flags: int, new_dfd: int, temp: str | None = None) -> SpareJob:
        """Take over ``victim``'s file for a store into the shard ``new_dfd`` (as ``temp``
        there: a new temporary name unless given)."""
        vfd, vname = self.name(victim)
        temp = self.names.next() if temp is None else temp
        return SpareJob(victim, vfd, vname, flags | SAFE_OPEN, new_dfd, temp, self.file_mode)

    def recycle(
        self, key: bytes, victim: bytes, data: memoryview, flags: int, temp: str | None = None
    ) -> tuple[StoreJob, SpareJob]:
        """The plan of a store of ``data`` under ``key`` into ``victim``'s file, run as one job
        (take the file over, check no one else holds the namespace, fill it, rename it into
        place; the executor fills in the checksums). ``temp``: the file's name while it is
        filled (a new one unless given: the native fast path plans without these objects
        and makes them with its name only for a job that did not simply succeed)."""
        dfd, name = self.name(key)
        sj = self.spare(victim, flags, dfd, temp)
        header = pack_header(key, data.nbytes, 0, self._digest)
        return StoreJob(key, dfd, name, flags, Source.RECYCLED, -1, sj.temp, self.sync, header, True), sj

    def unlink(self, victim: bytes) -> UnlinkJob:
        vfd, vname = self.name(victim)
        return UnlinkJob(victim, vfd, vname)

    # -- after a job -----------------------------------------------------------------------
    def spare_taken(self, job: SpareJob, out: Outcome) -> tuple[Spare | None, BaseException | None, bool]:
        """What a spare job left: (the file taken, or None; the victim's eviction error, None
        if it went or was gone; whether it is still to be evicted by unlink: its file could
        not be opened for writing, say it is not a regular file)."""
        if out.step == Step.OPEN:
            if out.not_regular or out.err in _NOT_REGULAR:
                self._stats.incr("not_regular_files")
            return None, None, out.err != errno.ENOENT
        if not out.ok:
            return None, None if out.err == errno.ENOENT else out.error(job.name), False
        return Spare(out.result, job.new_dfd, job.temp), None, False

    @staticmethod
    def release(job: StoreJob | None) -> None:
        """Close the file a store was given (made ahead, or taken over), once its job ended:
        linked or renamed, it stays; else an unnamed file goes with its descriptor."""
        if job is not None and job.fd >= 0:
            os.close(job.fd)
            job.fd = -1

    @staticmethod
    def leftovers(job: StoreJob, out: Outcome) -> list[str]:
        """Names in ``job.dfd`` that a failed store leaves and that must go: its temporary
        file, or, if only the directory's sync failed, the name published with unknown
        durability (unless the name was another writer's)."""
        if out.step == Step.DIRSYNC:
            return [] if out.name_taken else [job.name]
        return [job.temp] if job.temp else []

    def remove_leftovers(self, job: StoreJob, out: Outcome) -> None:
        for name in self.leftovers(job, out):
            remove_quietly(job.dfd, name)

    def abandon(self, job: StoreJob | None, spare: Spare | None) -> None:
        """After a store cancelled mid-way (its jobs have ended): close the files it was given
        and remove its temporary name, if it is still there (blocking: run it on a thread)."""
        if job is not None:
            self.release(job)
            if job.temp:
                remove_quietly(job.dfd, job.temp)
        if spare is not None and (job is None or job.source != Source.RECYCLED):
            os.close(spare.fd)
            remove_quietly(spare.dfd, spare.temp)

    def taken_by(self, job: StoreJob, size: int) -> str | None:
        """After a link found ``job.name`` taken: "" if what is there is a chunk of this key
        (another writer published it first), None if nothing is there any more (another
        process evicted or removed it since: publish again), else what it is. Anything else
        at the name (a directory, a link, a foreign file) must not pass for this key's chunk."""
        try:
            fd = os.open(job.name, os.O_RDONLY | SAFE_OPEN | os.O_CLOEXEC, dir_fd=job.dfd)
        except OSError as e:
            if e.errno == errno.ENOENT:
                return None
            return "a symbolic link" if e.errno == errno.ELOOP else f"an unreadable file ({os.strerror(e.errno or 0)})"
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return describe(st.st_mode)
            head = os.pread(fd, HEADER_BLOCK, 0) if st.st_size == HEADER_BLOCK + size else b""
        finally:
            os.close(fd)
        try:
            header = ChunkHeader.unpack(head, key=job.key)
        except IntegrityError:
            return "a file that is not this key's chunk"
        if header.layout_digest != self._digest or header.payload_len != size:
            return "a file that is not this key's chunk"
        return ""

    def stored(self, job: StoreJob, out: Outcome) -> None:
        if out.name_taken:
            self._stats.incr("publish_exists")  # another writer published this key first
        elif job.source == Source.RECYCLED:
            self._stats.incr("recycled")

    def mend(self, job: StoreJob | LoadJob, out: Outcome) -> bool:
        """Turn off what the file system refused (``O_TMPFILE``, ``O_DIRECT``, ``O_NOATIME``)
        when ``out`` says so; True if the job is then worth planning again."""
        tmpfile = isinstance(job, StoreJob) and job.source == Source.TMPFILE
        if tmpfile and out.step == Step.OPEN and out.err in (errno.EOPNOTSUPP, errno.EISDIR) and self.use_tmpfile:
            log.info("fs tier %s: no O_TMPFILE here; publishing by rename", self.directory)
            self.use_tmpfile = False
            return True
        if job.flags & O_DIRECT and out.err == errno.EINVAL and out.step in (Step.OPEN, Step.IO):
            # the medium wants more alignment than its block size said: buffered from now on
            self.direct_refused()
            return True
        if isinstance(job, LoadJob) and job.flags & O_NOATIME and out.step == Step.OPEN and out.err == errno.EPERM:
            self.noatime_refused()  # not EACCES: mode bits say no
            return True
        return False

    def direct_refused(self) -> None:
        if self.use_direct:
            self.use_direct = False
            log.warning("fs tier %s: the file system refuses O_DIRECT; using buffered I/O", self.directory)

    def noatime_refused(self) -> None:
        """O_NOATIME needs the file's owner: a root shared with another user refuses it."""
        with self._refusal_lock:
            if not self.read_flags & O_NOATIME:
                return
            self.read_flags &= ~O_NOATIME
        self._stats.incr("noatime_refused")
        log.info("fs tier %s: O_NOATIME refused (files owned by another user); reads update atimes", self.directory)

    # -- the header check of a load --------------------------------------------------------
    def check_read(self, key: bytes, hb: memoryview, out: memoryview, got: int, csum: int | None = None) -> None:
        """Verify what a read of ``got`` bytes left in ``hb`` (header block) and ``out``
        (``csum``: the payload's checksum where the reader computed it): one compare with
        the header the chunk was stored with; the field-by-field parse only when it differs."""
        if not (
            self.verify
            and got == HEADER_BLOCK + out.nbytes
            and _header_matches(hb, key, out.nbytes, checksum(out) if csum is None else csum, self._digest, 0)
        ):
            self.check_slow(key, hb, out, got)

    def check_slow(self, key: bytes, hb: memoryview, out: memoryview, got: int) -> None:
        """Parse and check field by field: for ``verify=False``, and the precise error."""
        header = ChunkHeader.unpack(hb[: min(got, HEADER_BLOCK)], key=key)
        if got < HEADER_BLOCK + out.nbytes:
            raise IntegrityError(f"truncated chunk file: {got} bytes, expected {HEADER_BLOCK + out.nbytes}", key)
        header.verify(out, layout_digest=self._digest, payload_len=out.nbytes, check_data=self.verify)

    # -- what the file system allows -------------------------------------------------------
    def probe(self, publish: str, direct_io: bool | str) -> None:
        """Decide O_TMPFILE+linkat and O_DIRECT by making one file. A root that cannot be
        written now is decided on first use (each store re-checks: :meth:`mend`)."""
        from asynctier.errors import TierConfigError

        tmpfile_ok = bool(O_TMPFILE) and os.path.isdir("/proc/self/fd")  # linkat goes through /proc
        if publish == "tmpfile" and not tmpfile_ok:
            raise TierConfigError("publish='tmpfile' needs O_TMPFILE and /proc/self/fd")
        self.use_tmpfile = tmpfile_ok and publish != "rename"
        self.use_direct = bool(O_DIRECT) and direct_io is not False
        if direct_io is True and not O_DIRECT:
            raise TierConfigError("direct_io=True but this platform has no O_DIRECT")
        if self.use_tmpfile or self.use_direct:
            self._probe_file()
        if direct_io is True and not self.use_direct:
            raise TierConfigError(f"direct_io=True but {self.directory} refuses O_DIRECT")
        if publish == "tmpfile" and not self.use_tmpfile:
            raise TierConfigError(f"publish='tmpfile' but {self.directory} does not support O_TMPFILE")

    def _probe_file(self) -> None:
        dfd = self.shard_fds[0]
        while True:
            flags = os.O_WRONLY | (O_DIRECT if self.use_direct else 0)
            temp = "" if self.use_tmpfile else self.names.next()
            try:
                if temp:
                    fd = os.open(temp, os.O_CREAT | os.O_EXCL | flags, self.file_mode, dir_fd=dfd)
                else:
                    fd = os.open(".", O_TMPFILE | flags, self.file_mode, dir_fd=dfd)
            except OSError as e:
                out = Outcome(Step.OPEN, e.errno or errno.EIO)
                source = Source.TEMP if temp else Source.TMPFILE
                job = StoreJob(b"", dfd, "", flags, source, -1, temp, False, b"", False)
                if self.mend(job, out):
                    continue
                if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM, *NOSPACE):
                    return  # cannot write now; decided on first use
                raise
            os.close(fd)
            if temp:
                os.unlink(temp, dir_fd=dfd)
            return


class TierHandle:
    """What an engine's I/O (:mod:`.threads`, :mod:`.native`) keeps of its tier: the tier
    weakly, since the tier holds the I/O and a dropped tier must go at once with the caller's
    buffer, not wait for the cycle collector to find the pair; its protocol and stats, the
    tier's for life."""

    def __init__(self, tier: FsTier) -> None:
        self._tier_ref = weakref.ref(tier)
        self.protocol = tier.protocol
        self._stats = tier._stats

    def live_tier(self) -> FsTier:
        tier = self._tier_ref()
        if tier is None:  # a call in progress holds its tier: only a bug gets here
            raise TierClosedError("the fs tier was dropped")
        return tier
