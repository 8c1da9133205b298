"""``fs``: one file per chunk on any POSIX file system (local disks, NFS, Lustre, ...).

``{"type": "fs", "root": "/mnt/nvme/kv", "capacity_bytes": 500 << 30}``

Layout::

    ROOT/v1-<layout digest>/           one namespace per (namespace, chunk size, format)
        LAYOUT                         what the digest stands for, for people
        00/ .. ff/                     256 shards, by xxh3 of the key
            <key token>                header block (4 KiB) + payload

File names are :func:`~asynctier.integrity.key_token` encodings of the key, never the raw
key. Each file starts with a :class:`~asynctier.integrity.ChunkHeader` (format version,
key, payload length, xxh3 of the payload, layout digest) padded to one 4 KiB block, so the
payload starts block-aligned and both halves move with O_DIRECT in a single ``pwritev`` /
``preadv``: one system call for the data in each direction.

Publication is atomic: a chunk is written to a uniquely named temporary file in its shard
and renamed over its name only once complete, or (thread engine, where the file system has
it) to an anonymous ``O_TMPFILE`` inode linked under its name (``linkat``; a crash leaves no
debris, the inode dies with its descriptor). No reader ever sees a partial chunk. Every
path operation goes through a shard directory descriptor held open for the tier's lifetime
(``openat``/``renameat``/``unlinkat``), and the hot path does no ``stat``.

Two engines move the bytes (``io_engine``, see :mod:`asynctier.io_engine`; the default,
``"auto"``, takes the native workers wherever their extension is built, else threads).
``"native"``: C worker threads (:mod:`asynctier.nativeio`) run each chunk's whole job without
the GIL, under the tier's bound, and tell the event loop of finished jobs through an eventfd
in batches. ``"threads"``: blocking system calls on ``max_inflight`` worker threads. Any
native job that does not simply succeed (short write, ENOSPC, O_DIRECT refused, EIO) is
handed to the thread path for one retry, which owns error classification, ENOSPC eviction
and O_DIRECT fallback.

Eviction at capacity recycles (``recycle``): the evicted chunk's file is renamed to a
temporary name, overwritten with the new chunk and renamed under its key, so a full tier
(a cache's steady state) creates, allocates and frees no file per chunk. Only while no
other tier has the namespace open: each open tier holds a shared lock on
``ROOT/v1-<digest>/.owners``, and a file is overwritten only if, after it left its name,
no one else holds that lock (then no one else can have it open, nor open it later). On a
network file system (NFS, Lustre, ...; :func:`asynctier.posix_io.network_fs`) that lock
query is a round trip to the server, so the native engine makes it on a thread.

Sharing a root between processes (two servers on one host): files are immutable once
published (while another tier has the namespace open, none is recycled), so readers never
see torn data; a concurrent store of the same key either
finds the name taken (``linkat``: ``EEXIST``, the other copy stays) or replaces it whole
(``renameat``: a reader holding the earlier file still reads it whole); an eviction by one process does not
disturb a read in progress in another (the reader holds the inode). Capacity is accounted
*per process*: each tier counts the chunks it wrote, found at ``open()``, or adopted on a
hit with ``shared=True``, and evicts only those (a chunk two processes know may be evicted
by either; the other then gets "not found" and forgets it); give each process its share of
the disk (for example ``capacity_bytes = disk / n``). Without ``shared=True`` a process
sees the other's new chunks only after its next ``open()``. A full file system
(``ENOSPC``) from whatever cause evicts least recently used chunks and retries once, so the
tier degrades, never crashes.

Restart: ``open()`` rebuilds the index from the shards (in the background for large
namespaces, answering index misses from disk meanwhile), removes temporary files of dead
writers and files of the wrong size, and orders the LRU by file mtime: a write stamps it,
and ``aclose()`` stamps each chunk loaded or touched with its time of last use. Loads
open with ``O_NOATIME`` (where the process owns the files), so a read does not dirty the
inode. See :class:`FsTier` for the parameters.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import contextlib
import errno
import fcntl
import itertools
import logging
import os
import re
import stat
import struct
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import xxhash

from asynctier import BlockingChunkTier, ChunkNotFoundError, IntegrityError, TierConfigError, engines, nativeio
from asynctier.engines import Engine
from asynctier.integrity import ChunkHeader, checksum, header_matches, key_token, pack_header
from asynctier.io_engine import IoEngine, check_io_engine
from asynctier.lru import LRUIndex
from asynctier.posix_io import O_DIRECT, O_NOATIME, aligned_buffer, buffer_address, logical_block_size, network_fs
from asynctier.spec import FORMAT_VERSION
from asynctier.stats import TierStats

__all__ = ["FsTier", "HEADER_BLOCK", "N_SHARDS"]

log = logging.getLogger(__name__)

#: Bytes reserved in front of the payload for the header; the payload starts block-aligned.
HEADER_BLOCK = 4096
#: Shard directories per namespace (part of the on-disk format).
N_SHARDS = 256

_O_TMPFILE: int = getattr(os, "O_TMPFILE", 0)
_O_DIRECTORY: int = getattr(os, "O_DIRECTORY", 0)
_TMP_PREFIX = ".tmp~"
_MAX_PENDING_TOUCHES = 1 << 16  # touched keys remembered for stamping at close (beyond: approximate)
_NOSPACE = (errno.ENOSPC, errno.EDQUOT)
_OWNERS = ".owners"  # every open tier holds a shared lock on it (see FsTier._alone)
_F_OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)
_F_OFD_GETLK: int | None = getattr(fcntl, "F_OFD_GETLK", None)
_FLOCK = "=hh4xqqi4x"  # struct flock on 64-bit Linux: type, whence, start, len, pid
_HOLD = struct.pack(_FLOCK, fcntl.F_RDLCK, os.SEEK_SET, 0, 1, 0)
_ANYONE_ELSE = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0)
_HASHED_TOKEN = re.compile(r"h[0-9a-f]{64}")
_SAFE_HOST = re.compile(r"[^A-Za-z0-9.-]")
_instance_seq = itertools.count()
_ZEROS = bytes(HEADER_BLOCK)
_POOL_TARGET = 64  # tmpfile_pool=None: unnamed files kept made ahead (one descriptor each)
_POOL_HOLD_POLL_S = 1.0  # a held pool looks again this often unless woken (wake())


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class _TmpfilePool:
    """Unnamed files (``O_TMPFILE``) made ahead of need by a background thread.

    Creating a file is a journaled metadata operation that can wait on the journal, a
    large share of a small chunk's time (docs/benchmarks.md). Made ahead, off the chunk's
    latency path, it overlaps the writes in flight, and files made during an idle spell
    take a burst of stores faster than making them in the burst. An unnamed inode can be
    linked under any name on its file system and dies with its descriptor (or at the next
    mount after a crash): a pooled file is invisible and costs no disk space until it is
    written and linked. ``hold``, where given, pauses the
    making while it returns True (the native engine's pool: while the tier is busy).
    """

    def __init__(
        self, dir_fds: list[int], flags: int, target: int, name: str, hold: Callable[[], bool] | None = None
    ) -> None:
        self.flags = flags
        self._dir_fds = list(dir_fds)
        self._target = target
        self._hold = hold  # while it returns True, make no file (looked at before each)
        self._fds: collections.deque[int] = collections.deque()
        self._cv = threading.Condition()
        self._stop = False
        self._wants_room = False  # the thread waits for a take (the pool is full)
        self._held = False  # the thread waits for wake() (hold() said so)
        self._thread = threading.Thread(target=self._fill, name=name, daemon=True)
        self._thread.start()

    def take(self) -> int | None:
        """A file opened with :attr:`flags`, or None when none is ready."""
        try:
            fd = self._fds.popleft()
        except IndexError:
            return None
        if self._wants_room:  # only then: a wake-up per take would cost the taker the GIL
            with self._cv:
                self._cv.notify()
        return fd

    def wake(self) -> None:
        """Have a held thread look at ``hold`` again now (the tier went idle)."""
        if self._held:
            with self._cv:
                self._cv.notify()

    @property
    def ready(self) -> int:
        """Files made and not yet taken."""
        return len(self._fds)

    def _fill(self) -> None:
        made = 0
        backoff = 0.0
        while True:
            with self._cv:
                # set before the check: a take that empties a slot after it sees the flag
                self._wants_room = True
                while not self._stop and len(self._fds) >= self._target:
                    self._cv.wait()
                self._wants_room = False
                if self._stop:
                    return
                # set before hold() is asked: a wake() after a busy answer finds it set
                self._held = True
                if self._hold is not None and self._hold():
                    self._cv.wait(_POOL_HOLD_POLL_S)  # ended early by wake() or close()
                    self._held = False
                    continue
                self._held = False
            try:
                dfd = self._dir_fds[made % len(self._dir_fds)]  # spread over the shards, as writers are
                fd = os.open(".", _O_TMPFILE | self.flags, 0o644, dir_fd=dfd)
            except OSError:
                # read-only, full, or no O_TMPFILE/O_DIRECT here: writers make their own files
                # (and meet the error themselves); try again later, less often while it lasts
                # (takes notify the condition: the deadline, not a wake-up, ends the wait)
                backoff = min(30.0, max(1.0, 2 * backoff))
                until = time.monotonic() + backoff
                with self._cv:
                    while not self._stop and (left := until - time.monotonic()) > 0:
                        self._cv.wait(left)
                continue
            backoff = 0.0
            made += 1
            with self._cv:
                if self._stop:
                    os.close(fd)
                    return
                self._fds.append(fd)

    def close(self) -> None:
        """Stop the thread and close the files not taken (idempotent)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()
        while self._fds:
            os.close(self._fds.popleft())


def _close_tier_fds(fds: list[int], pools: list[_TmpfilePool]) -> None:
    for pool in pools:  # first: its thread creates files in the directories below
        pool.close()
    _close_all(fds)


class _DirectRefused(Exception):
    """An O_DIRECT transfer was refused (EINVAL): retry buffered."""


def _shard_of(key: bytes) -> int:
    return xxhash.xxh3_64_intdigest(key) & (N_SHARDS - 1)


def _token_key(name: str) -> bytes | None:
    """The key a base32 file name stands for; None for hashed tokens and foreign names."""
    if not name or len(name) > 160 or _HASHED_TOKEN.fullmatch(name):
        return None
    try:
        key = base64.b32decode(name.upper() + "=" * (-len(name) % 8))
    except (binascii.Error, ValueError):
        return None
    return key if key and key_token(key) == name else None


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


class FsTier(BlockingChunkTier):
    """One checksummed file per chunk under ``root``; atomic, capacity-bounded, restart-safe.

    Args:
        root: directory to keep chunks in (created if missing). The tier uses the
            subdirectory named after the layout digest, so several models share a root.
        direct_io: ``"auto"`` (default): O_DIRECT where the file system supports it and the
            buffer address and length are block-aligned, buffered I/O otherwise;
            ``True``: as auto, but ``open()`` fails if the file system refuses O_DIRECT;
            ``False``: always buffered. Each chunk that wanted O_DIRECT but could not have it
            (unaligned view) is counted in ``stats().extra["direct_io_fallbacks"]`` and the
            first is logged.
        publish: ``"auto"`` (``O_TMPFILE`` + ``linkat`` where available), ``"tmpfile"`` or
            ``"rename"`` (temporary name + ``renameat``; needed on NFS).
        shared: another process may store into the same root: on an index miss, ``lookup`` and
            ``load`` look on disk and adopt what they find. Loads open files with
            ``O_NOATIME``; a process that does not own them (another user's files, without
            CAP_FOWNER) is refused it once, logged and counted in
            ``stats().extra["noatime_refused"]``, and reads on without it.
        background_scan: ``"auto"`` (scan in the background when the namespace looks larger
            than ``scan_sync_limit`` files), ``True`` or ``False``. While a scan runs, index
            misses are checked on disk, so no answer is wrong meanwhile; capacity counts only
            the chunks known so far, and the scan evicts down to ``capacity_bytes`` when done.
        scan_sync_limit: estimated file count above which ``"auto"`` scans in the background.
        lru_times: at ``aclose()``, stamp each file loaded or touched since ``open()`` with
            the time of its last use, so a restart (the scan sorts by mtime; a write stamps
            its own) restores LRU order. Not done per load: a ``futimens`` dirties the inode
            and can wait on the journal, on the latency path.
        stale_tmp_s: age after which another host's (or a live process's) temporary file is
            removed at ``open()``; those of dead local processes go at once.
        io_engine: how offloads and loads reach the kernel (:mod:`asynctier.io_engine`).
            ``"native"``: C worker threads (:mod:`asynctier.nativeio`) run each chunk's whole
            job, open to close with its xxh3, holding no GIL, and report to the event loop
            in batches through an eventfd; refused, with the reason, where they are not
            built. ``"threads"``: blocking system calls on ``max_inflight`` Python worker
            threads. ``"auto"`` (the default): native wherever the extension is built,
            threads otherwise. Why native: per chunk, Python threads pay a job queue, a
            thread wake-up and a GIL hand-off per system call, which the C workers do not
            (figures: docs/benchmarks.md). On either engine, removal, lookup, fsck and the
            retry of anything that did not simply succeed run on threads.
        worker_nice: how much the native workers raise their nice value (0-19; default 5).
            On a machine with fewer cores than workers (``max_inflight`` + up to one per
            CPU), a stream of writes keeps them all runnable, and at nice 0 the event-loop
            thread waits its turn behind them (docs/benchmarks.md). Raising nice needs no
            privilege; the workers are named ``asynctier-nio``.
        tmpfile_pool: how many unnamed ``O_TMPFILE`` files a background thread keeps made
            ahead of need, so that a chunk's write does not wait for its file's creation (a
            journaled metadata operation). None (default): 64; 0: none. Each costs an open
            descriptor and an empty inode until used (no data blocks); a crash leaves
            nothing behind. Chunks that find the pool empty make their own
            (``stats().extra["tmpfile_pool_empty"]``). On the native engine the pool refills
            only while no call is in progress: its thread would take the GIL from the event
            loop, so a stream beyond the files made ahead makes its own (docs/benchmarks.md).
        recycle: what eviction does with the file of the chunk it evicts to make room for a
            store. ``"auto"`` (default): recycle it when ``verify=True``; ``True``: recycle it;
            ``False``: unlink it. Recycling renames the file away from its name, then the
            store overwrites it in place and renames it under the new key: at capacity (a
            cache's steady state) no file is created, allocated, freed or trimmed per chunk.
            It happens only while no other tier, in this process or another, has the
            namespace open (each open tier holds a shared lock on its ``.owners`` file;
            where locks are not available nothing is recycled), so nobody can be reading the
            overwritten file; and not for a key stored again meanwhile. A crash during the
            overwrite may leave, after a power loss, the old name with mixed content: the
            checksum rejects it on load, hence ``"auto"`` only with ``verify=True``.
            Counted in ``stats().extra``: ``recycled``, ``recycle_refused`` (another tier had
            the namespace open), ``recycle_retries`` (an overwrite failed; the ordinary path
            wrote the chunk).
        **kwargs: the common knobs (``max_inflight``, ``capacity_bytes``, ``durability`` in
            ``"none"``/``"fsync"``, ``verify``, ...), see :class:`asynctier.ChunkTier`.
    """

    default_type = "fs"
    supported_durability = ("none", "fsync")
    uses_index = True

    def __init__(
        self,
        *,
        root: str | os.PathLike[str],
        direct_io: bool | Literal["auto"] = "auto",
        publish: Literal["auto", "tmpfile", "rename"] = "auto",
        shared: bool = False,
        background_scan: bool | Literal["auto"] = "auto",
        scan_sync_limit: int = 50_000,
        lru_times: bool = True,
        stale_tmp_s: float = 3600.0,
        io_engine: str = "auto",
        worker_nice: int = 5,
        tmpfile_pool: int | None = None,
        recycle: bool | Literal["auto"] = "auto",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if recycle not in ("auto", True, False):
            raise TierConfigError(f"recycle must be 'auto', True or False; got {recycle!r}")
        self.recycle = recycle
        if tmpfile_pool is not None and (
            isinstance(tmpfile_pool, bool) or not isinstance(tmpfile_pool, int) or tmpfile_pool < 0
        ):
            raise TierConfigError(f"tmpfile_pool must be an int >= 0 or None; got {tmpfile_pool!r}")
        self.tmpfile_pool = tmpfile_pool
        if isinstance(worker_nice, bool) or not isinstance(worker_nice, int) or not 0 <= worker_nice <= 19:
            raise TierConfigError(f"worker_nice must be an int from 0 to 19; got {worker_nice!r}")
        self.worker_nice = worker_nice
        self.io_engine: IoEngine = check_io_engine(self.tier_type, io_engine)
        if not isinstance(root, (str, os.PathLike)) or not str(root):
            raise TierConfigError(f"root must be a directory path; got {root!r}")
        if direct_io not in ("auto", True, False):
            raise TierConfigError(f"direct_io must be 'auto', True or False; got {direct_io!r}")
        if publish not in ("auto", "tmpfile", "rename"):
            raise TierConfigError(f"publish must be 'auto', 'tmpfile' or 'rename'; got {publish!r}")
        if background_scan not in ("auto", True, False):
            raise TierConfigError(f"background_scan must be 'auto', True or False; got {background_scan!r}")
        for name, flag in (("shared", shared), ("lru_times", lru_times)):
            if not isinstance(flag, bool):
                raise TierConfigError(f"{name} must be True or False; got {flag!r}")
        if isinstance(scan_sync_limit, bool) or not isinstance(scan_sync_limit, int) or scan_sync_limit < 0:
            raise TierConfigError(f"scan_sync_limit must be an int >= 0; got {scan_sync_limit!r}")
        if isinstance(stale_tmp_s, bool) or not isinstance(stale_tmp_s, (int, float)) or not stale_tmp_s >= 0:
            raise TierConfigError(f"stale_tmp_s must be a number >= 0; got {stale_tmp_s!r}")
        self.root = Path(root)
        self.dir = self.root / f"v{FORMAT_VERSION}-{self.offloading_spec.layout_id}"
        self.direct_io = direct_io
        self.publish = publish
        self.shared = shared
        self.background_scan = background_scan
        self.scan_sync_limit = scan_sync_limit
        self.lru_times = lru_times
        self.stale_tmp_s = float(stale_tmp_s)
        self.index: LRUIndex = LRUIndex(self.capacity_bytes, track_removals=True)
        # set by open_medium
        self._shard_fds: list[int] = []
        self._fd_finalizer: weakref.finalize[[list[int], list[_TmpfilePool]], FsTier] | None = None
        self._pool: _TmpfilePool | None = None
        self._use_direct = False
        self._use_tmpfile = False
        self._block = HEADER_BLOCK
        self._chunk_size = HEADER_BLOCK + self.offloading_spec.chunk_bytes
        self._tls = threading.local()
        self._fallback_logged = False
        self._host = _SAFE_HOST.sub("_", os.uname().nodename)[:64] or "host"
        self._tmp_tag = f"{_TMP_PREFIX}{self._host}~{os.getpid()}~{next(_instance_seq)}~"
        self._tmp_seq = itertools.count()
        self._scanning = False
        self._scan_thread: threading.Thread | None = None
        self._scan_stop = threading.Event()
        self._scan_lock = threading.Lock()
        self._gone_during_scan: set[bytes] = set()
        self._touched: dict[bytes, int] = {}  # key -> time of last use (ns), stamped at close
        self._native_mode = False
        self._nengine: nativeio.NativeEngine | None = None
        self._nhb: memoryview | None = None  # one header block per native job slot
        self._nhb_addr = 0
        self._view_addr = 0
        # Reads leave the access time alone: recency lives in mtime (see lru_times), and
        # relatime would otherwise dirty the inode of every chunk on its first load after a
        # store (a journal handle inside the read, inode-table writes at the next commit).
        # Refused (EPERM: another user's files), reads go on without it (_noatime_refused).
        self._read_flags = os.O_RDONLY | O_NOATIME
        self._refusal_lock = threading.Lock()  # worker threads may be refused at once: count one
        self._lock_fd = -1
        self._recycle_on = False
        self._network_fs: str | None = None  # NFS, Lustre, ...: lock queries may wait on a server

    # -- capacity ---------------------------------------------------------------------------
    def stored_size(self) -> int:
        """Header block plus payload, rounded up to the file system block."""
        return self._chunk_size

    # -- names -------------------------------------------------------------------------------
    def _name(self, key: bytes) -> tuple[int, str]:
        return self._shard_fds[_shard_of(key)], key_token(key)

    def _header_buf(self) -> memoryview:
        """This thread's block-aligned header buffer (O_DIRECT needs aligned memory)."""
        hb: memoryview | None = getattr(self._tls, "hb", None)
        if hb is None:
            hb = aligned_buffer(HEADER_BLOCK)
            self._tls.hb = hb
            self._tls.hlen = 0
        return hb

    def _direct_for(self, view: memoryview, address: int | None = None, *, count: bool = True) -> bool:
        """O_DIRECT for this transfer? Counts (and logs once) the fallbacks unless ``count`` is False."""
        if not self._use_direct:
            return False
        blk = self._block
        if view.nbytes % blk == 0 and (buffer_address(view) if address is None else address) % blk == 0:
            return True
        if not count:
            return False
        self._stats.incr("direct_io_fallbacks")
        if not self._fallback_logged:
            self._fallback_logged = True
            log.warning(
                "fs tier %s: buffer not aligned to the %d-byte block (address or length); using buffered "
                "I/O for such chunks (counted in stats().extra['direct_io_fallbacks'])",
                self.dir,
                blk,
            )
        return False

    # -- lifecycle ---------------------------------------------------------------------------
    def open_medium(self) -> None:
        """Create/open the namespace, probe O_DIRECT and O_TMPFILE, rebuild the index."""
        fds: list[int] = []
        try:
            if not self.dir.is_dir():
                self.dir.mkdir(parents=True, exist_ok=True)
            self._write_layout_note()
            dfd = os.open(self.dir, os.O_RDONLY | _O_DIRECTORY)
            try:
                for i in range(N_SHARDS):
                    name = f"{i:02x}"
                    try:
                        fds.append(os.open(name, os.O_RDONLY | _O_DIRECTORY, dir_fd=dfd))
                    except FileNotFoundError:
                        os.mkdir(name, dir_fd=dfd)
                        fds.append(os.open(name, os.O_RDONLY | _O_DIRECTORY, dir_fd=dfd))
            finally:
                os.close(dfd)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        self._shard_fds = fds
        self._lock_fd = self._hold_namespace()
        self._network_fs = network_fs(self.dir)
        self._recycle_on = self._lock_fd >= 0 and (self.recycle is True or (self.recycle == "auto" and self.verify))
        pools: list[_TmpfilePool] = []
        # a tier dropped without aclose() must not leak its descriptors or its pool's thread
        owned = fds if self._lock_fd < 0 else [*fds, self._lock_fd]
        self._fd_finalizer = weakref.finalize(self, _close_tier_fds, owned, pools)
        try:
            # the alignment O_DIRECT needs; at most the header block (a larger f_bsize, as on
            # Lustre, is a preference; a real refusal switches O_DIRECT off, see _direct_refused)
            self._block = min(max(512, logical_block_size(self.dir)), HEADER_BLOCK)
            self._probe()
            self._start_scan()
            target = self.tmpfile_pool
            if target is None:
                target = _POOL_TARGET
            if target and self._use_tmpfile:
                flags = os.O_WRONLY | (O_DIRECT if self._use_direct else 0)
                hold = None
                if self._native_mode:
                    # The native engine's pool refills only while the tier is idle: a Python
                    # thread making files during a stream takes the GIL from the event loop,
                    # which the C workers otherwise leave alone (docs/benchmarks.md). Files
                    # made while idle still take the next burst.
                    me = weakref.ref(self)  # the thread must not keep a dropped tier alive

                    def hold() -> bool:
                        tier = me()
                        return tier is not None and tier._active > 0

                self._pool = _TmpfilePool(fds, flags, target, f"asynctier-fs-tmpfiles-{self.dir.name[:8]}", hold)
                pools.append(self._pool)
        except BaseException:
            self._close_fds()
            raise

    def _hold_namespace(self) -> int:
        """Hold a shared lock on the namespace's ``.owners`` file for as long as the tier is
        open; returns its descriptor, or -1 where no such lock can be held (then this tier
        does not recycle, see :meth:`_alone`). Open file description locks: each tier's is
        its own, also within one process, and closing another descriptor does not drop it."""
        if _F_OFD_SETLK is None or struct.calcsize("P") != 8:
            return -1
        path = self.dir / _OWNERS
        fd = -1
        for flags in (os.O_RDWR | os.O_CREAT, os.O_RDONLY):  # a read-only root: if it exists
            try:
                fd = os.open(path, flags | os.O_CLOEXEC, 0o644)
                break
            except OSError:
                continue
        if fd < 0:
            return -1
        try:
            fcntl.fcntl(fd, _F_OFD_SETLK, _HOLD)
        except OSError as e:  # no locks here (some network file systems)
            log.info("fs tier %s: cannot lock %s (%r); evicted files are deleted, not recycled", self.dir, path, e)
            os.close(fd)
            return -1
        return fd

    def _alone(self) -> bool:
        """Whether no other open tier, in this process or another, holds this namespace.

        Every tier locks ``.owners`` at ``open()`` before it looks up any chunk. So if no one
        else holds it *after* an evicted file was renamed away from its name, no one else can
        have that file open, nor open it later: it may be overwritten in place.
        """
        assert _F_OFD_GETLK is not None
        try:
            got = fcntl.fcntl(self._lock_fd, _F_OFD_GETLK, _ANYONE_ELSE)
        except OSError:
            return False
        return bool(struct.unpack(_FLOCK, got)[0] == fcntl.F_UNLCK)

    def _write_layout_note(self) -> None:
        spec = self.offloading_spec
        note = self.dir / "LAYOUT"
        if note.exists():
            return
        text = (
            f"asynctier fs tier, format v{FORMAT_VERSION}\nnamespace: {spec.namespace}\n"
            f"chunk_bytes: {spec.chunk_bytes}\nheader_block: {HEADER_BLOCK}\nshards: {N_SHARDS}\n"
        )
        tmp = self.dir / f"{self._tmp_tag}layout"
        try:
            tmp.write_text(text)
            os.replace(tmp, note)
        except OSError as e:  # a read-only root still serves loads
            log.debug("fs tier: cannot write %s: %r", note, e)
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass

    def _probe(self) -> None:
        """Which of O_TMPFILE+linkat and O_DIRECT to use. Both are re-checked lazily on first
        use too (a read-only root cannot be probed by writing), see :meth:`_open_new`."""
        fd0 = self._shard_fds[0]
        tmpfile_ok = bool(_O_TMPFILE) and os.path.isdir("/proc/self/fd")  # linkat goes through /proc
        if self.publish == "tmpfile" and not tmpfile_ok:
            raise TierConfigError("publish='tmpfile' needs O_TMPFILE and /proc/self/fd")
        self._use_tmpfile = tmpfile_ok and self.publish != "rename"
        self._use_direct = bool(O_DIRECT) and self.direct_io is not False
        if self.direct_io is True and not O_DIRECT:
            raise TierConfigError("direct_io=True but this platform has no O_DIRECT")
        if not (self._use_tmpfile or self._use_direct):
            return
        try:
            fd, tmp = self._open_new(fd0, os.O_WRONLY | (O_DIRECT if self._use_direct else 0))
        except OSError as e:
            if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM, *_NOSPACE):
                return  # cannot write now; decided on first use
            raise
        os.close(fd)
        if tmp is not None:
            os.unlink(tmp, dir_fd=fd0)
        if self.direct_io is True and not self._use_direct:
            raise TierConfigError(f"direct_io=True but {self.dir} refuses O_DIRECT")
        if self.publish == "tmpfile" and not self._use_tmpfile:
            raise TierConfigError(f"publish='tmpfile' but {self.dir} does not support O_TMPFILE")

    def _open_new(self, dfd: int, flags: int) -> tuple[int, str | None]:
        """A new file to fill: (fd, None) for an unnamed O_TMPFILE inode, else (fd, temp name).

        Turns O_TMPFILE or O_DIRECT off for good when the file system refuses them.
        """
        pool = self._pool
        if pool is not None and self._use_tmpfile and flags == pool.flags:
            fd = pool.take()
            if fd is not None:
                return fd, None
            self._stats.incr("tmpfile_pool_empty")
        while True:
            try:
                if self._use_tmpfile:
                    return os.open(".", _O_TMPFILE | flags, 0o644, dir_fd=dfd), None
                tmp = f"{self._tmp_tag}{next(self._tmp_seq)}"
                return os.open(tmp, os.O_CREAT | os.O_EXCL | flags, 0o644, dir_fd=dfd), tmp
            except OSError as e:
                if self._use_tmpfile and e.errno in (errno.EOPNOTSUPP, errno.EISDIR):
                    log.info("fs tier %s: no O_TMPFILE here; publishing by rename", self.dir)
                    self._use_tmpfile = False
                elif flags & O_DIRECT and e.errno == errno.EINVAL:
                    self._direct_refused()
                    flags &= ~O_DIRECT
                else:
                    raise

    def _direct_refused(self) -> None:
        if self._use_direct:
            self._use_direct = False
            log.warning("fs tier %s: the file system refuses O_DIRECT; using buffered I/O", self.dir)

    def close_medium(self) -> None:
        """Stop a background scan, stamp touched files' times, release the shard descriptors."""
        self._scan_stop.set()
        t = self._scan_thread
        if t is not None:
            t.join()
        if self.lru_times and self._touched:
            touched, self._touched = self._touched, {}
            for key, used_ns in touched.items():
                fd, name = self._name(key)
                try:
                    os.utime(name, ns=(used_ns, used_ns), dir_fd=fd)  # the time of last use, as a write stamps its own
                except OSError:
                    pass  # best effort: gone, or a read-only root
        self._close_fds()

    def _close_fds(self) -> None:
        self._shard_fds = []
        self._lock_fd = -1
        self._recycle_on = False
        self._pool = None
        fin = self._fd_finalizer
        if fin is not None:
            fin()  # closes each descriptor once, whichever comes first: this or garbage collection

    # -- recovery ----------------------------------------------------------------------------
    def _start_scan(self) -> None:
        background = self.background_scan
        if background == "auto":
            try:
                in_first = sum(1 for _ in os.scandir(self._shard_fds[0]))
            except OSError:
                in_first = 0
            background = in_first * N_SHARDS > self.scan_sync_limit
        self._scan_stop.clear()
        if not background:
            self._scan()
            return
        self._scanning = True
        self._scan_thread = threading.Thread(target=self._scan_bg, name="asynctier-fs-scan", daemon=True)
        self._scan_thread.start()

    def _scan_bg(self) -> None:
        try:
            self._scan()
        except Exception:
            log.exception("fs tier %s: background index rebuild failed; index misses keep checking disk", self.dir)
            self.shared = True  # never answer from an incomplete index as if it were complete

    def _scan(self) -> None:
        """Rebuild the index from the shards: oldest first, stale temporaries and bad files removed."""
        found: list[tuple[int, bytes, int]] = []
        now = time.time()
        counts = dict.fromkeys(("scan_files", "scan_removed_tmp", "scan_removed_bad", "scan_foreign"), 0)
        expect = self.stored_size()
        for shard, fd in enumerate(self._shard_fds):
            if self._scan_stop.is_set():
                return
            with os.scandir(fd) as it:
                entries = list(it)
            for ent in entries:
                name = ent.name
                try:
                    st = ent.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if name.startswith(_TMP_PREFIX):
                    if self._stale_tmp(name, st.st_mtime, now):
                        self._unlink_quiet(name, fd, counts, "scan_removed_tmp")
                    continue
                key = _token_key(name)
                if key is None and _HASHED_TOKEN.fullmatch(name):
                    key = self._key_from_header(name, fd)
                if key is None or _shard_of(key) != shard or not stat.S_ISREG(st.st_mode):
                    counts["scan_foreign"] += 1
                    continue
                if st.st_size != expect:  # truncated or foreign: never serve it
                    self._unlink_quiet(name, fd, counts, "scan_removed_bad")
                    continue
                found.append((st.st_mtime_ns, key, expect))
                counts["scan_files"] += 1
        with self._scan_lock:
            self.index.merge_older(found, self._gone_during_scan)
            self._gone_during_scan.clear()
            self._scanning = False
        for name, n in counts.items():
            if n:
                self._stats.incr(name, n)
        victims = self.index.evict_over_capacity()  # a smaller capacity than last time
        try:
            for victim in victims:
                self._evict(victim)
        finally:
            self.index.removed(victims)

    def _stale_tmp(self, name: str, mtime: float, now: float) -> bool:
        parts = name[len(_TMP_PREFIX) :].split("~")
        if now - mtime > self.stale_tmp_s:
            return True
        if len(parts) >= 2 and parts[0] == self._host and parts[1].isdigit():
            pid = int(parts[1])
            if pid == os.getpid():
                return False  # another tier of this process may be writing it
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        return False

    def _key_from_header(self, name: str, fd: int) -> bytes | None:
        try:
            dfd = os.open(name, os.O_RDONLY, dir_fd=fd)
            try:
                head = os.pread(dfd, HEADER_BLOCK, 0)
            finally:
                os.close(dfd)
            key = ChunkHeader.unpack(head).key
        except (OSError, IntegrityError):
            return None
        return key if key_token(key) == name else None

    def _unlink_quiet(self, name: str, fd: int, counts: dict[str, int], what: str) -> None:
        try:
            os.unlink(name, dir_fd=fd)
            counts[what] += 1
        except OSError as e:
            log.debug("fs tier: cannot remove %s: %r", name, e)

    def _note_gone(self, key: bytes) -> None:
        if self._scanning:
            with self._scan_lock:
                if self._scanning:
                    self._gone_during_scan.add(key)

    # -- disk fallback while the index is incomplete ---------------------------------------
    def _on_disk(self, key: bytes) -> bool:
        """A whole chunk file is published under ``key`` (a truncated one does not count)."""
        fd, name = self._name(key)
        try:
            st = os.stat(name, dir_fd=fd)
        except OSError:
            return False
        return st.st_size == self._chunk_size

    def _begin_load(self, key: bytes) -> object | None:
        entry = self.index.pin_entry(key)
        if entry is not None:
            return entry
        if (self._scanning or self.shared) and self._on_disk(key):
            entry = self.index.adopt_pinned_entry(key, self._chunk_size)
            if entry is not None:
                return entry
        raise ChunkNotFoundError(f"no chunk stored under key {key.hex()[:32]}", key)

    async def lookup(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key is stored: from the index; index misses are checked on disk while
        a background scan runs or with ``shared=True``."""
        hits = await super().lookup(keys)
        if not (self._scanning or self.shared) or all(hits):
            return hits
        misses = [k for k, h in zip(keys, hits) if not h]
        on_disk = await asyncio.to_thread(lambda: [self._on_disk(k) for k in misses])
        found = iter(on_disk)
        return [h or next(found) for h in hits]

    async def touch(self, keys: Sequence[bytes]) -> None:
        """Mark keys most recently used; their file times are stamped at close (``lru_times``)."""
        await super().touch(keys)
        if self.lru_times and len(self._touched) < _MAX_PENDING_TOUCHES:
            now = time.time_ns()
            self._touched.update(dict.fromkeys(keys, now))

    async def stored_keys(self) -> list[bytes]:
        """Every key in the index (after waiting for a background scan to finish)."""
        t = self._scan_thread
        if t is not None and t.is_alive():
            await asyncio.to_thread(t.join)
        return await super().stored_keys()

    def _became_idle(self) -> None:
        pool = self._pool
        if pool is not None:
            pool.wake()  # a held pool (the native engine's) refills now, not at its next look

    def stats(self) -> TierStats:
        """The common counters; ``extra["tmpfile_pool_ready"]``: files made ahead, not yet used."""
        s = super().stats()
        pool = self._pool
        if pool is not None:
            s.extra["tmpfile_pool_ready"] = pool.ready
        return s

    # -- engines ----------------------------------------------------------------------------
    @property
    def active_io_engine(self) -> str:
        """``"native"`` or ``"threads"``: what ``io_engine`` resolved to at ``open()``."""
        return "native" if self._native_mode else "threads"

    def _make_engine(self) -> Engine:
        self._native_mode = False
        native_why = nativeio.problem()
        if self.io_engine == "native" and native_why is not None:
            raise TierConfigError(f"io_engine='native' but native I/O workers are unavailable here: {native_why}")
        if self.io_engine == "threads" or native_why is not None:
            return super()._make_engine()
        # C workers doing whole jobs hold no GIL, so the loop keeps its latency (docs/benchmarks.md)
        self._native_mode = True
        self._nengine = nativeio.NativeEngine(
            self.max_inflight or 1, name=f"asynctier-{self.tier_type}", nice=self.worker_nice
        )
        return self._nengine

    async def _open_medium(self) -> None:
        await super()._open_medium()
        if self._native_mode:
            assert self._nengine is not None and self._nengine.pool is not None
            self._nhb = aligned_buffer(HEADER_BLOCK * self._nengine.pool.slots)
            self._nhb_addr = buffer_address(self._nhb)
            self._view_addr = buffer_address(self._view)

    def _job_fn(self, op: str) -> Callable[..., Any]:
        if self._native_mode:
            assert self._nengine is not None
            return self._coroutine_job_fn(op, self._native_store_job, self._native_load_job, self._nengine.blocking)
        return super()._job_fn(op)

    # -- native engine ------------------------------------------------------------------------
    def _native_slot_hb(self, slot: int) -> memoryview:
        assert self._nhb is not None
        return self._nhb[slot * HEADER_BLOCK : (slot + 1) * HEADER_BLOCK]

    async def _native_store_job(self, key: bytes, cid: int, t0: float) -> None:
        await self._async_store(key, t0, lambda victims: self._native_write(key, cid, victims))

    async def _native_write(self, key: bytes, cid: int, victims: list[bytes]) -> None:
        """Evict ``victims``, then write ``key``'s chunk, as native jobs: where the first
        victim's file may be recycled, one job opens it and renames it away and the write
        overwrites it, renamed into place; else the write fills an unnamed file (made ahead,
        or by the worker) and links it under its name (or, publishing by rename, fills a new
        temporary file and renames it into place), and victims are unlinked first. The
        worker fills in the header's checksums. A burst of evictions and anything short of
        success take the blocking path on a slow-path thread, which owns error handling."""
        engine = self._nengine
        assert engine is not None and engine.pool is not None
        data = self._chunk(cid)
        if len(victims) > 4:
            await engine.blocking(self._evict_then_write, key, data, victims)
            return
        pool = engine.pool
        addr = self._view_addr + cid * self.offloading_spec.chunk_bytes
        dfd, name = self._name(key)
        wflags = os.O_WRONLY | (O_DIRECT if self._direct_for(data, addr) else 0)
        digest = self.offloading_spec.layout_digest
        if pool.hashes:
            packed = pack_header(key, data.nbytes, 0, digest)
            body_len = len(packed) - 8  # the worker fills in both checksums
        else:
            if data.nbytes >= engines.HASH_ON_THREAD_BYTES:
                csum = await engines.finish_on_thread(checksum, data)
            else:
                csum = checksum(data)
            packed = pack_header(key, data.nbytes, csum, digest)
            body_len = 0
        sync = self.durability == "fsync"
        slot = pool.take_slot()
        spare: tuple[int, str] | None = None  # an evicted file (descriptor, name in dfd): ours to close
        pooled: int | None = None  # an unnamed file made ahead: ours to close
        try:
            rest = victims
            if victims and self._recycle_on:
                spare, evict_first = await self._native_spare_from(slot, victims[0], wflags, dfd)
                if not evict_first:
                    rest = victims[1:]
            for v in rest:
                await self._native_evict(slot, v)
            tmp_pool = self._pool
            recycled = spare is not None
            if spare is None and not self._use_tmpfile:  # publish by rename: a new temporary file
                spare = (-1, f"{self._tmp_tag}{next(self._tmp_seq)}")
            elif spare is None and tmp_pool is not None and tmp_pool.flags == wflags:
                pooled = tmp_pool.take()
                if pooled is None:
                    self._stats.incr("tmpfile_pool_empty")
            hb = self._native_slot_hb(slot)
            hb[: len(packed)] = packed  # ~100 bytes of header, not chunk data
            hb[len(packed) :] = _ZEROS[len(packed) :]
            fd = spare[0] if spare is not None else -1 if pooled is None else pooled
            res = await pool.write(slot, engines.PRIO_STORE, dfd, name.encode(), wflags, fd, sync,
                                   self._nhb_addr + slot * HEADER_BLOCK, HEADER_BLOCK, addr, data.nbytes, body_len,
                                   rename_from=(-1, b"") if spare is None else (dfd, spare[1].encode()))  # fmt: skip
        except BaseException:
            # cancelled: the jobs have ended (a cancelled wait waits for a running job)
            await engines.finish_on_thread(self._native_drop, pooled, spare, dfd)
            raise
        finally:
            pool.put_slot(slot)
        if pooled is not None:
            os.close(pooled)  # linked (or not: then it goes with its descriptor)
        if spare is not None and spare[0] >= 0:
            os.close(spare[0])  # renamed into place (or not: removed below)
        if res.stage == 0:
            if res.info:
                self._stats.incr("publish_exists")  # another writer published this key first
            elif recycled:
                self._stats.incr("recycled")
            return
        self._stats.incr("native_retries")
        # a failed directory fsync follows the publication: a name of unknown durability goes
        # too, unless the name was another writer's (EEXIST on link): that copy is not ours
        published = res.stage == nativeio.ST_DIRSYNC and not res.info
        leftover = spare[1] if spare is not None and res.stage != nativeio.ST_DIRSYNC else None

        def retry() -> None:
            for gone in (name if published else None, leftover):
                if gone is not None:
                    try:
                        os.unlink(gone, dir_fd=dfd)
                    except FileNotFoundError:
                        pass
            self.write_chunk(key, data)

        await engine.blocking(retry)  # it reads the caller's buffer: runs to its end

    @staticmethod
    def _native_drop(pooled: int | None, spare: tuple[int, str] | None, dfd: int) -> None:
        """After a cancelled native write: close the file made ahead (never linked, it goes
        with its descriptor), close and remove the spare or temporary file (if it was not
        renamed into place)."""
        if pooled is not None:
            os.close(pooled)
        if spare is not None:
            if spare[0] >= 0:
                os.close(spare[0])
            with contextlib.suppress(FileNotFoundError):
                os.unlink(spare[1], dir_fd=dfd)

    async def _native_spare_from(
        self, slot: int, victim: bytes, flags: int, dfd: int
    ) -> tuple[tuple[int, str] | None, bool]:
        """:meth:`_spare_from` as a native job: the victim's file opened (``flags``) and
        renamed to a private name in ``dfd`` (the new key's shard), then decided. Returns
        (its descriptor and name, where it may be overwritten; else None, the file gone) and
        whether the victim is still to be evicted by unlink (it could not be opened)."""
        engine = self._nengine
        assert engine is not None and engine.pool is not None
        pool = engine.pool
        self._note_gone(victim)
        vfd, vname = self._name(victim)
        spare = f"{self._tmp_tag}{next(self._tmp_seq)}"
        try:
            res = await pool.spare(slot, engines.PRIO_STORE, vfd, vname.encode(), flags, dfd, spare.encode())
        except asyncio.CancelledError as e:
            done = getattr(e, nativeio.CANCELLED_OUTCOME, None)
            if done is not None and done.stage == 0:
                # it ran: the victim's file left its name and is open; neither may outlive this
                self._evicted(victim, None)
                await engines.finish_on_thread(self._native_drop, None, (done.result, spare), dfd)
            raise
        if res.stage == nativeio.ST_OPEN:
            if res.result == -errno.ENOENT:
                self._evicted(victim, None)
                return None, False
            return None, True  # not a file we can write: the ordinary eviction
        if res.stage != 0:
            r = -res.result
            self._evicted(victim, None if r == errno.ENOENT else OSError(r, os.strerror(r)))
            return None, False
        self._evicted(victim, None)
        fd = res.result
        try:
            # the check queries a lock: on a network file system that is a round trip to the
            # server, which must not stall the event loop
            if self._network_fs:
                recycle = await asyncio.to_thread(self._may_recycle, victim)
            else:
                recycle = self._may_recycle(victim)
        except BaseException:
            await engines.finish_on_thread(self._native_drop, None, (fd, spare), dfd)
            raise
        if recycle:
            return (fd, spare), False
        os.close(fd)
        res = await pool.unlink(slot, engines.PRIO_STORE, dfd, spare.encode())
        if res.stage != 0 and res.result != -errno.ENOENT:
            log.debug("fs tier: cannot remove %s: %s", spare, os.strerror(-res.result))
        return None, False

    async def _native_evict(self, slot: int, victim: bytes) -> None:
        """:meth:`_evict` as a native job (unlink)."""
        engine = self._nengine
        assert engine is not None and engine.pool is not None
        self._note_gone(victim)
        vfd, vname = self._name(victim)
        res = await engine.pool.unlink(slot, engines.PRIO_STORE, vfd, vname.encode())
        r = -res.result if res.stage else 0
        self._evicted(victim, None if r in (0, errno.ENOENT) else OSError(r, os.strerror(r)))

    async def _native_load_job(self, key: bytes, cid: int, t0: float) -> None:
        if self._scanning or self.shared:
            entry = await asyncio.to_thread(self._pin_for_load, key)  # may look on disk
        else:
            entry = self._pin_for_load(key)
        assert self._nengine is not None
        blocking = self._nengine.blocking
        await self._async_load(
            key, t0, lambda: self._native_read(key, cid), lambda: blocking(self.delete_chunk, key), entry
        )

    async def _native_read(self, key: bytes, cid: int) -> None:
        """One native job: open, preadv of header block + payload into the caller's slice,
        close, xxh3 of the payload; then the header is compared here."""
        engine = self._nengine
        assert engine is not None and engine.pool is not None
        pool = engine.pool
        out = self._chunk(cid)
        addr = self._view_addr + cid * self.offloading_spec.chunk_bytes
        dfd, name = self._name(key)
        # a refused O_NOATIME (EPERM) or O_DIRECT (EINVAL) fails the job; the retry mends it
        flags = self._read_flags | (O_DIRECT if self._direct_for(out, addr) else 0)
        hashed = self.verify and pool.hashes
        slot = pool.take_slot()
        try:
            res = await pool.read(slot, engines.PRIO_LOAD, dfd, name.encode(), flags,
                                  self._nhb_addr + slot * HEADER_BLOCK, HEADER_BLOCK, addr, out.nbytes,
                                  hashed=hashed)  # fmt: skip
            if res.stage == nativeio.ST_OPEN and res.result == -errno.ENOENT:
                raise ChunkNotFoundError(f"no chunk stored under key {key.hex()[:32]}", key)
            if res.stage == 0:
                # the header is still in this slot's block: the slot is held until checked
                hb = self._native_slot_hb(slot)
                if hashed or not self.verify or out.nbytes < engines.HASH_ON_THREAD_BYTES:
                    self._check_read(key, hb, out, res.result, res.csum if hashed else None)
                else:
                    await engines.finish_on_thread(self._check_read, key, hb, out, res.result)
                return
        finally:
            pool.put_slot(slot)
        self._stats.incr("native_retries")
        # errors and O_DIRECT refusal live there; it fills the caller's buffer: runs to its end
        await engine.blocking(self.read_chunk, key, out)

    # -- recycling evicted files -------------------------------------------------------------
    def _store_job(self, key: bytes, cid: int, t0: float) -> None:
        """Evict, then write: into the first victim's file where it may be recycled."""
        if not self._recycle_on:
            super()._store_job(key, cid, t0)
            return
        victims = self._reserve_store_blocking(key, t0)
        if victims is None:
            return
        try:
            self._evict_then_write(key, self._chunk(cid), victims)
        except BaseException as e:
            self._end_store(key, t0, e)
            raise
        self._end_store(key, t0, None)

    def _evict_then_write(self, key: bytes, data: memoryview, victims: list[bytes]) -> None:
        """Evict ``victims`` (reserved for ``key``), then write ``data``: into the first
        victim's file where it may be recycled."""
        spare = None
        try:
            rest = victims
            if victims and self._recycle_on:
                direct = self._direct_for(data, count=False)  # counted by the write
                spare = self._spare_from(victims[0], os.O_WRONLY | (O_DIRECT if direct else 0))
                rest = victims[1:]
            for v in rest:
                self._evict(v)
        finally:
            self.index.removed(victims)  # their names are gone: re-stores of them may go on
        if spare is None:
            self.write_chunk(key, data)
        else:
            self._write_recycled(key, data, *spare)

    def _spare_from(self, victim: bytes, flags: int) -> tuple[int, int, str] | None:
        """Evict ``victim``: open its file (``flags``), rename it to a private temporary name;
        return (descriptor, shard descriptor, name) if it may be overwritten in place. Else
        None, and the victim is gone: deleted, as an eviction by unlink would."""
        vfd, vname = self._name(victim)
        try:
            fd = os.open(vname, flags, dir_fd=vfd)
        except OSError:
            self._evict(victim)  # not a file we can write (or gone): the ordinary eviction
            return None
        self._note_gone(victim)
        spare = f"{self._tmp_tag}{next(self._tmp_seq)}"
        try:
            os.rename(vname, spare, src_dir_fd=vfd, dst_dir_fd=vfd)
        except OSError as e:
            os.close(fd)
            self._evicted(victim, e)
            return None
        self._evicted(victim, None)
        if self._may_recycle(victim):
            return fd, vfd, spare
        os.close(fd)
        try:
            os.unlink(spare, dir_fd=vfd)
        except OSError as e:
            log.debug("fs tier: cannot remove %s: %r", spare, e)
        return None

    def _may_recycle(self, victim: bytes) -> bool:
        """After the victim's file left its name: may it be overwritten in place?

        Not if a new copy of the same key was stored meanwhile (its writer may have found this
        file under the name and published it: a reader of the new copy may hold it), nor if
        another tier has the namespace open (it may be reading it).
        """
        if self.index.has_entry(victim) or not self._alone():
            self._stats.incr("recycle_refused")
            return False
        return True

    def _write_recycled(self, key: bytes, data: memoryview, fd: int, vfd: int, spare: str) -> None:
        """Overwrite the evicted file ``spare`` (open as ``fd``) with ``key``'s chunk, then
        rename it into place.

        Its blocks are written already: no inode to make, nothing to allocate, nothing to free
        (and, with ``discard``, nothing to trim): on ext4, offloads into a full tier ran at
        0.86x of fio with it and 0.25x with a new file plus an unlink per chunk (256 KiB,
        depth 16; bench/README.md, "fs tier").
        Any failure drops the spare and takes the ordinary path, which owns the error handling.
        """
        dfd, name = self._name(key)
        self._direct_for(data)  # counts a fallback (the spare was opened for this transfer)
        try:
            try:
                hb = self._fill_header(key, data)
                _all_io(os.pwritev, fd, [hb, data], 0)  # the file has this size already
                if self.durability == "fsync":
                    os.fdatasync(fd)
            finally:
                os.close(fd)
            os.rename(spare, name, src_dir_fd=vfd, dst_dir_fd=dfd)
        except BaseException as e:
            try:
                os.unlink(spare, dir_fd=vfd)
            except OSError:
                pass
            if not isinstance(e, OSError):
                raise
            self._stats.incr("recycle_retries")
            self.write_chunk(key, data)
            return
        if self.durability == "fsync":
            os.fsync(dfd)
        self._stats.incr("recycled")

    def _verify_job(self, key: bytes, remove_bad: int, t0: float) -> None:
        if self._recycle_on:
            # pinned like a load: an evicted file may be overwritten in place. Unindexed, it
            # is either being recycled right now or not ours (no other tier is open here)
            try:
                self._begin_load(key)
            except ChunkNotFoundError as e:
                self._end_verify(key, e, bool(remove_bad))
                raise
        elif not self.index.pin(key):
            super()._verify_job(key, remove_bad, t0)  # another process's file is verified too
            return
        try:
            super()._verify_job(key, remove_bad, t0)
        finally:
            self.index.unpin(key, touch=False)

    # -- the primitives ----------------------------------------------------------------------
    def write_chunk(self, key: bytes, data: memoryview) -> None:
        """Header + payload to an unnamed file in one pwritev, then link it in (atomic)."""
        try:
            try:
                self._write_once(key, data)
            except _DirectRefused:
                # the medium wants more alignment than its block size said: buffered from now on
                self._direct_refused()
                self._write_once(key, data)
        except OSError as e:
            if e.errno not in _NOSPACE:
                raise
            # the file system is full (ours or others' data): make room from the LRU end, retry once
            victims = self.index.pop_lru(8 * self._chunk_size)
            if not victims:
                raise
            self._stats.incr("enospc_evictions", len(victims))
            try:
                for v in victims:
                    self._evict(v)
            finally:
                self.index.removed(victims)
            self._write_once(key, data)

    def _fill_header(self, key: bytes, data: memoryview) -> memoryview:
        """This thread's header block, holding the header of ``data`` stored under ``key``."""
        hb = self._header_buf()
        packed = pack_header(key, data.nbytes, checksum(data), self.offloading_spec.layout_digest)
        n = len(packed)
        hb[:n] = packed  # ~100 bytes of header, not chunk data
        prev: int = self._tls.hlen
        if prev > n:
            hb[n:prev] = bytes(prev - n)
        self._tls.hlen = n
        return hb

    def _write_once(self, key: bytes, data: memoryview) -> None:
        dfd, name = self._name(key)
        hb = self._fill_header(key, data)
        flags = os.O_WRONLY | (O_DIRECT if self._direct_for(data) else 0)
        sync = self.durability == "fsync"
        fd, tmp = self._open_new(dfd, flags)
        try:
            try:
                try:
                    _all_io(os.pwritev, fd, [hb, data], 0)
                except OSError as e:
                    if flags & O_DIRECT and e.errno == errno.EINVAL:
                        raise _DirectRefused from e
                    raise
                if sync:
                    os.fdatasync(fd)
                if tmp is None:
                    try:
                        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dfd, follow_symlinks=True)
                    except FileExistsError:
                        self._stats.incr("publish_exists")  # another writer published this key first
            finally:
                os.close(fd)
            if tmp is not None:
                os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            if tmp is not None:  # an O_TMPFILE inode vanishes with its descriptor; a named one must go
                try:
                    os.unlink(tmp, dir_fd=dfd)
                except OSError:
                    pass
            raise
        if sync:
            os.fsync(dfd)  # the new name is durable too

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        """Header + payload in one preadv, the payload straight into ``out``; then verify."""
        dfd, name = self._name(key)
        hb = self._header_buf()
        flags = self._read_flags | (O_DIRECT if self._direct_for(out) else 0)
        fd = self._open_for_read(key, dfd, name, flags)
        try:
            try:
                got = _all_io(os.preadv, fd, [hb, out], 0)
            except OSError as e:
                if not (flags & O_DIRECT and e.errno == errno.EINVAL):
                    raise
                # the medium wants more alignment than its block size said: buffered from now on
                self._direct_refused()
                os.close(fd)
                fd = -1  # closed: a failed reopen must not close the number again (a thread may own it)
                fd = self._open_for_read(key, dfd, name, flags & ~O_DIRECT)
                got = _all_io(os.preadv, fd, [hb, out], 0)
        finally:
            if fd >= 0:
                os.close(fd)
        self._check_read(key, hb, out, got)

    def _open_for_read(self, key: bytes, dfd: int, name: str, flags: int) -> int:
        """Open a chunk file with ``flags``, dropping O_DIRECT or O_NOATIME when refused."""
        while True:
            try:
                return os.open(name, flags, dir_fd=dfd)
            except FileNotFoundError:
                raise ChunkNotFoundError(f"no chunk stored under key {key.hex()[:32]}", key) from None
            except OSError as e:
                if flags & O_NOATIME and e.errno == errno.EPERM:  # not EACCES: mode bits say no
                    self._noatime_refused()
                    flags &= ~O_NOATIME
                elif flags & O_DIRECT and e.errno == errno.EINVAL:
                    self._direct_refused()
                    flags &= ~O_DIRECT
                else:
                    raise

    def _noatime_refused(self) -> None:
        """O_NOATIME needs the file's owner: a root shared with another user refuses it."""
        with self._refusal_lock:
            if not self._read_flags & O_NOATIME:
                return
            self._read_flags &= ~O_NOATIME
        self._stats.incr("noatime_refused")
        log.info("fs tier %s: O_NOATIME refused (files owned by another user); reads update atimes", self.dir)

    def _check_read(self, key: bytes, hb: memoryview, out: memoryview, got: int, csum: int | None = None) -> None:
        """Verify what a read of ``got`` bytes left in ``hb`` (header block) and ``out``
        (``csum``: the payload's checksum where the reader computed it)."""
        digest = self.offloading_spec.layout_digest
        if not (
            self.verify
            and got == HEADER_BLOCK + out.nbytes
            and header_matches(hb, key, out.nbytes, checksum(out) if csum is None else csum, digest)
        ):
            self._check_read_slow(key, hb, out, got)
        if self.lru_times and len(self._touched) < _MAX_PENDING_TOUCHES:
            # stamped at close, not here: a futimens per load dirties the inode and can wait
            # on the journal, on the latency path
            self._touched[key] = time.time_ns()

    def _check_read_slow(self, key: bytes, hb: memoryview, out: memoryview, got: int) -> None:
        """Parse and check field by field: for ``verify=False``, and the precise error."""
        header = ChunkHeader.unpack(hb[: min(got, HEADER_BLOCK)], key=key)
        if got < HEADER_BLOCK + out.nbytes:
            raise IntegrityError(f"truncated chunk file: {got} bytes, expected {HEADER_BLOCK + out.nbytes}", key)
        header.verify(
            out, layout_digest=self.offloading_spec.layout_digest, payload_len=out.nbytes, check_data=self.verify
        )

    def chunk_exists(self, key: bytes) -> bool:
        """Whether the chunk's file exists."""
        return self._on_disk(key)

    def delete_chunk(self, key: bytes) -> bool:
        """Unlink the chunk's file (a reader holding it open still reads it whole)."""
        self._note_gone(key)
        fd, name = self._name(key)
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            return False
        return True

    def list_chunks(self) -> list[bytes]:
        """Every key stored in the namespace on disk (for fsck)."""
        keys: list[bytes] = []
        for shard, fd in enumerate(self._shard_fds):
            for ent in os.scandir(fd):
                key = _token_key(ent.name)
                if key is None and _HASHED_TOKEN.fullmatch(ent.name):
                    key = self._key_from_header(ent.name, fd)
                if key is not None and _shard_of(key) == shard:
                    keys.append(key)
        return keys
