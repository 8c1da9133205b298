"""The threads engine: the chunk protocol's jobs run with Python system calls.

This is the reference path and the fallback of the native engine: it owns recovery
(a refused ``O_TMPFILE``, ``O_DIRECT`` or ``O_NOATIME`` turned off and the job planned
again; a full file system relieved by evicting least recently used chunks, once) and the
errors a failed chunk reports. ``preadv``/``pwritev`` release the GIL, so worker threads
move bytes in parallel.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from asynctier.integrity import checksum
from asynctier.posix_io import aligned_buffer

from .layout import HEADER_BLOCK
from .pool import O_TMPFILE
from .protocol import (
    NOSPACE,
    LoadJob,
    Outcome,
    Source,
    Spare,
    SpareJob,
    Step,
    StoreJob,
    TierHandle,
    UnlinkJob,
    not_found,
    regular_mode,
)

if TYPE_CHECKING:
    from .tier import FsTier

__all__ = ["ThreadsIO", "run_load", "run_spare", "run_store", "run_unlink"]

_ENOSPC_EVICT_CHUNKS = 8  # a full file system: evict this many chunks' worth, then retry once


def _all_io(fn: Callable[[int, list[memoryview], int], int], fd: int, bufs: list[memoryview], offset: int) -> int:
    """``preadv``/``pwritev`` all of ``bufs`` at ``offset``, looping on short transfers.

    Returns the bytes moved; fewer than asked only for reads at end of file.
    """
    total = sum(b.nbytes for b in bufs)
    done = fn(fd, bufs, offset)
    while done < total:  # rare: rebuild the vector past what was transferred (slices, no copies)
        rest: list[memoryview] = []
        skip = done
        for b in bufs:
            if skip >= b.nbytes:
                skip -= b.nbytes
                continue
            rest.append(b[skip:])
            skip = 0
        n = fn(fd, rest, offset + done)
        if n <= 0:
            if fn is os.pwritev:
                raise OSError(errno.EIO, f"pwritev wrote {n} bytes at offset {offset + done}")
            break
        done += n
    return done


def run_store(job: StoreJob, hb: memoryview, data: memoryview, mode: tuple[int, bool] = (0o600, False)) -> Outcome:
    """Run a store job: [make the file], write header block and payload, [fdatasync],
    link or rename it under its name, [fsync the shard]. A file the job made is closed;
    one it was given is not."""
    fd, made, taken = job.fd, False, False
    step = Step.OPEN
    try:
        if fd < 0:
            if job.source == Source.TMPFILE:
                fd = os.open(".", O_TMPFILE | job.flags, mode[0], dir_fd=job.dfd)
            else:
                fd = os.open(job.temp, os.O_CREAT | os.O_EXCL | job.flags, mode[0], dir_fd=job.dfd)
            made = True
            if mode[1]:  # the umask stripped bits of the mode
                os.fchmod(fd, mode[0])
        step = Step.IO
        moved = _all_io(os.pwritev, fd, [hb, data], 0)
        if job.sync:
            step = Step.DATASYNC
            os.fdatasync(fd)
        if job.link:
            step = Step.LINK
            try:
                os.link(f"/proc/self/fd/{fd}", job.name, dst_dir_fd=job.dfd, follow_symlinks=True)
            except FileExistsError:
                taken = True  # another writer published this key first: its copy stays
        else:
            step = Step.RENAME
            os.rename(job.temp, job.name, src_dir_fd=job.dfd, dst_dir_fd=job.dfd)
        if job.sync:
            step = Step.DIRSYNC
            os.fsync(job.dfd)  # the new name is durable too
    except OSError as e:
        return Outcome(step, e.errno or errno.EIO, name_taken=taken)
    except BaseException:
        if made and job.temp:  # an unnamed file vanishes with its descriptor; a named one must go
            try:
                os.unlink(job.temp, dir_fd=job.dfd)
            except OSError:
                pass
        raise
    finally:
        if made:
            os.close(fd)
    return Outcome(result=moved, name_taken=taken)


def _open_regular(name: str, flags: int, dfd: int) -> tuple[int, int] | Outcome:
    """An open descriptor of the regular file ``name`` and its mode, or the failed open's outcome."""
    try:
        fd = os.open(name, flags, dir_fd=dfd)
    except OSError as e:
        return Outcome(Step.OPEN, e.errno or errno.EIO)
    mode = regular_mode(fd)
    return mode if isinstance(mode, Outcome) else (fd, mode)


def run_load(job: LoadJob, hb: memoryview, out: memoryview) -> Outcome:
    """Run a load job: open (a regular file only), read header block and payload (looped;
    end of file ends it short), close."""
    opened = _open_regular(job.name, job.flags, job.dfd)
    if isinstance(opened, Outcome):
        return opened
    fd = opened[0]
    try:
        got = _all_io(os.preadv, fd, [hb, out], 0)
    except OSError as e:
        return Outcome(Step.IO, e.errno or errno.EIO)
    finally:
        os.close(fd)
    return Outcome(result=got)


def run_spare(job: SpareJob) -> Outcome:
    """Run a spare job: open the victim's file (a regular file only), set its permission bits,
    rename it away; the result is its descriptor. A file whose mode cannot be set (another
    user's) fails the open step: it is not taken over."""
    opened = _open_regular(job.name, job.flags, job.dfd)
    if isinstance(opened, Outcome):
        return opened
    fd, mode = opened
    try:
        if stat.S_IMODE(mode) != job.mode:  # (the mode read when the file was checked)
            os.fchmod(fd, job.mode)
    except OSError as e:
        os.close(fd)
        return Outcome(Step.OPEN, e.errno or errno.EIO)
    try:
        os.rename(job.name, job.temp, src_dir_fd=job.dfd, dst_dir_fd=job.new_dfd)
    except OSError as e:
        os.close(fd)
        return Outcome(Step.RENAME, e.errno or errno.EIO)
    return Outcome(result=fd)


def run_unlink(job: UnlinkJob) -> Outcome:
    try:
        os.unlink(job.name, dir_fd=job.dfd)
    except OSError as e:
        return Outcome(Step.UNLINK, e.errno or errno.EIO)
    return Outcome()


class ThreadsIO(TierHandle):
    """The chunk protocol of ``tier`` on the calling (worker) thread."""

    def __init__(self, tier: FsTier) -> None:
        super().__init__(tier)
        self._tls = threading.local()

    def _header_block(self, header: bytes = b"") -> memoryview:
        """This thread's block-aligned header buffer (O_DIRECT needs aligned memory), holding
        ``header`` padded with zeros."""
        hb: memoryview | None = getattr(self._tls, "hb", None)
        if hb is None:
            hb = aligned_buffer(HEADER_BLOCK)
            self._tls.hb = hb
            self._tls.hlen = 0
        n = len(header)
        hb[:n] = header  # ~100 bytes of header, not chunk data
        prev: int = self._tls.hlen
        if prev > n:
            hb[n:prev] = bytes(prev - n)
        self._tls.hlen = n
        return hb

    # -- stores ----------------------------------------------------------------------------
    def store(self, key: bytes, data: memoryview, spare: Spare | None = None) -> None:
        """Store ``data`` under ``key`` (into ``spare`` where given); raises what the chunk
        failed with after the recovery the protocol allows."""
        tier = self.live_tier()
        proto = tier.protocol
        csum = checksum(data)
        nospace_retry = True
        gone_retries = 3  # the name was taken, then freed by another process: publish again
        while True:
            job = proto.store(key, data, csum, spare)
            try:
                out = run_store(job, self._header_block(job.header), data, (proto.file_mode, proto.fix_mode))
            except BaseException:
                proto.abandon(job, None)
                raise
            proto.release(job)
            if out.ok and out.name_taken:
                what = proto.taken_by(job, data.nbytes)
                if what is None and gone_retries:
                    gone_retries -= 1
                    tier._stats.incr("publish_retries")
                    proto.remove_leftovers(job, out)
                    spare = None
                    continue
                if what or what is None:  # not another writer's copy
                    out = Outcome(Step.LINK, errno.EEXIST, what=what or "a file gone and back at each try")
            if out.ok:
                proto.stored(job, out)
                return
            proto.remove_leftovers(job, out)
            if spare is not None:  # the overwrite in place failed: the ordinary path writes it
                spare = None
                tier._stats.incr("recycle_retries")
                continue
            if proto.mend(job, out):
                continue
            if out.err in NOSPACE and nospace_retry and self._relieve_nospace():
                nospace_retry = False
                continue
            raise out.error(job.name)

    def _relieve_nospace(self) -> bool:
        """The file system is full (ours or others' data): evict from the LRU end; False if
        there was nothing to evict."""
        tier = self.live_tier()
        victims = tier.index.pop_lru(_ENOSPC_EVICT_CHUNKS * tier.stored_size())
        if not victims:
            return False
        tier._stats.incr("enospc_evictions", len(victims))
        try:
            for v in victims:
                self.evict(v)
        finally:
            tier.index.removed(victims)
        return True

    def evict_then_store(self, key: bytes, data: memoryview, victims: list[bytes]) -> None:
        """Evict ``victims`` (reserved for ``key``), then store ``data``: into the first
        victim's file where it may be recycled."""
        tier = self.live_tier()
        spare = None
        try:
            rest = victims
            if victims and tier.recycle_on:
                dfd = tier.protocol.name(key)[0]
                flags = tier.protocol.write_flags(data, count=False)  # counted by the store
                spare, unlink_first = self.take_spare(victims[0], flags, dfd)
                if not unlink_first:
                    rest = victims[1:]
            for v in rest:
                self.evict(v)
        finally:
            tier.index.removed(victims)  # their names are gone: re-stores of them may go on
        self.store(key, data, spare)

    def take_spare(self, victim: bytes, flags: int, dfd: int) -> tuple[Spare | None, bool]:
        """Take over ``victim``'s file for a store into the shard ``dfd``: (the file, where it
        may be overwritten in place; whether the victim is still to be evicted by unlink)."""
        tier = self.live_tier()
        proto = tier.protocol
        tier._note_gone(victim)
        job = proto.spare(victim, flags, dfd)
        spare, exc, unlink_it = proto.spare_taken(job, run_spare(job))
        if unlink_it:
            return None, True
        tier._evicted(victim, exc)
        if spare is not None and not tier._may_recycle(victim):
            os.close(spare.fd)
            run_unlink(UnlinkJob(victim, spare.dfd, spare.temp))
            spare = None
        return spare, False

    def evict(self, victim: bytes) -> None:
        """Evict ``victim`` by unlinking its file."""
        tier = self.live_tier()
        tier._note_gone(victim)
        out = run_unlink(tier.protocol.unlink(victim))
        tier._evicted(victim, None if out.ok or out.err == errno.ENOENT else out.error())

    # -- loads -----------------------------------------------------------------------------
    def load(self, key: bytes, out: memoryview) -> None:
        """Fill ``out`` with ``key``'s payload and verify it; raises ChunkNotFoundError,
        IntegrityError or the OSError of the read."""
        proto = self.protocol
        hb = self._header_block()
        self._tls.hlen = HEADER_BLOCK  # the read fills the whole block: a store must zero it all
        job = proto.load(key, out)
        while True:
            res = run_load(job, hb, out)
            if res.ok:
                break
            if res.step == Step.OPEN and res.err == errno.ENOENT:
                raise not_found(key)
            if res.not_regular:
                self._stats.incr("not_regular_files")
            if not proto.mend(job, res):
                raise res.error(job.name)
            job = proto.load(key, out)
        self.live_tier().check_read(key, hb, out, res.result)
