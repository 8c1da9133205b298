"""Recovery at ``open()``: rebuild the index from the shards, remove what cannot be trusted.

Trusted: a regular file whose name is the token of a key that belongs in its shard (a
hashed token: the key read from its header) and whose size is exactly one header block
plus one payload. Removed: temporary files of dead writers (or older than ``stale_tmp_s``)
and chunk files of the wrong size. Left alone: anything else (foreign names). The LRU
order comes from file times (oldest first); checksums are checked on load, not here.
"""

from __future__ import annotations

import heapq
import logging
import os
import stat
import threading
import time
from collections.abc import Callable

from asynctier.errors import IntegrityError
from asynctier.integrity import ChunkHeader, key_token
from asynctier.lru import LRUIndex
from asynctier.stats import StatsRecorder

from .layout import HEADER_BLOCK, N_SHARDS, TMP_PREFIX, TempNames, is_hashed_token, shard_of, token_key
from .protocol import SAFE_OPEN

__all__ = ["Recovery", "key_from_header", "list_keys"]

log = logging.getLogger(__name__)

_COUNTS = ("scan_files", "scan_removed_tmp", "scan_removed_bad", "scan_foreign")


def key_from_header(name: str, dfd: int) -> bytes | None:
    """The key in the header of the file ``name`` (a hashed token), if it names that file
    (a regular one: a FIFO, a link or a directory at the name is not opened or not read)."""
    try:
        fd = os.open(name, os.O_RDONLY | SAFE_OPEN | os.O_CLOEXEC, dir_fd=dfd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            head = os.pread(fd, HEADER_BLOCK, 0)
        finally:
            os.close(fd)
        key = ChunkHeader.unpack(head).key
    except (OSError, IntegrityError):
        return None
    return key if key_token(key) == name else None


def _key_of(name: str, shard: int, dfd: int) -> bytes | None:
    key = token_key(name)
    if key is None and is_hashed_token(name):
        key = key_from_header(name, dfd)
    return key if key is not None and shard_of(key) == shard else None


def list_keys(shard_fds: list[int]) -> list[bytes]:
    """Every key stored in the namespace on disk (for fsck)."""
    keys: list[bytes] = []
    for shard, fd in enumerate(shard_fds):
        for ent in os.scandir(fd):
            if not ent.is_file(follow_symlinks=False):
                continue
            key = _key_of(ent.name, shard, fd)
            if key is not None:
                keys.append(key)
    return keys


class Recovery:
    """The index rebuild of one open tier, in the foreground or on a background thread.

    While it runs in the background the index is incomplete: :attr:`scanning` tells the
    tier to check index misses on disk, and keys deleted meanwhile are remembered
    (:meth:`note_gone`) so that the scan does not bring them back.
    """

    def __init__(
        self,
        index: LRUIndex,
        stats: StatsRecorder,
        names: TempNames,
        stale_tmp_s: float,
        evict: Callable[[bytes], None],
        label: str,
    ) -> None:
        self._index = index
        self._stats = stats
        self._names = names
        self._stale_tmp_s = stale_tmp_s
        self._evict = evict  # over capacity after the scan: delete these
        self._label = label
        self.scanning = False
        #: set when a background scan failed: index misses must keep checking disk
        self.failed = False
        self.thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._gone: set[bytes] = set()

    def start(self, shard_fds: list[int], expect: int, background: bool) -> None:
        """Scan now, or start a thread that does (``background``)."""
        self._stop.clear()
        if not background:
            self._scan(shard_fds, expect)
            return
        self.scanning = True
        self.thread = threading.Thread(
            target=self._scan_bg, args=(shard_fds, expect), name="asynctier-fs-scan", daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        """Stop a background scan and wait for its thread."""
        self._stop.set()
        t = self.thread
        if t is not None:
            t.join()

    def note_gone(self, key: bytes) -> None:
        """``key``'s file is about to go: a scan in progress must not index it."""
        if self.scanning:
            with self._lock:
                if self.scanning:
                    self._gone.add(key)

    def _scan_bg(self, shard_fds: list[int], expect: int) -> None:
        try:
            self._scan(shard_fds, expect)
        except Exception:
            log.exception("%s: background index rebuild failed; index misses keep checking disk", self._label)
            self.failed = True  # never answer from an incomplete index as if it were complete

    def _scan(self, shard_fds: list[int], expect: int) -> None:
        """Rebuild the index from the shards: oldest first, stale temporaries and bad files removed."""
        # each shard's finds sorted newest first, merged lazily: one sort of them all would be
        # one call holding the GIL for as long as it takes (43-51 ms at 100,000 files)
        by_shard: list[list[tuple[int, bytes, int]]] = []
        counts = dict.fromkeys(_COUNTS, 0)
        now = time.time()
        for shard, fd in enumerate(shard_fds):
            if self._stop.is_set():
                return
            with os.scandir(fd) as it:
                entries = list(it)
            found: list[tuple[int, bytes, int]] = []
            by_shard.append(found)
            for ent in entries:
                try:
                    st = ent.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                what = self._judge(ent.name, shard, fd, st, expect, now)
                if isinstance(what, bytes):
                    found.append((st.st_mtime_ns, what, expect))
                    what = "scan_files"
                if what is not None:
                    counts[what] += 1
            found.sort(reverse=True)
        # in steps (the loop's calls wait for the index's lock): keys deleted meanwhile stay
        # out, since note_gone records them until the last step is in
        self._index.merge_older_newest_first(heapq.merge(*by_shard, reverse=True), self._gone)
        with self._lock:
            self._gone.clear()
            self.scanning = False
        for name, n in counts.items():
            if n:
                self._stats.incr(name, n)
        victims = self._index.evict_over_capacity()  # a smaller capacity than last time
        try:
            for victim in victims:
                self._evict(victim)
        finally:
            self._index.removed(victims)

    def _judge(self, name: str, shard: int, fd: int, st: os.stat_result, expect: int, now: float) -> bytes | str | None:
        """A chunk's key (trusted), the counter of what was done with the file, or None."""
        if name.startswith(TMP_PREFIX):
            if self._names.is_stale(name, st.st_mtime, self._stale_tmp_s, now):
                return self._unlink(name, fd, "scan_removed_tmp")
            return None
        if not stat.S_ISREG(st.st_mode):  # not opened: a FIFO would block, a link leads out
            return "scan_foreign"
        key = _key_of(name, shard, fd)
        if key is None:
            return "scan_foreign"
        if st.st_size != expect:  # truncated or foreign: never serve it
            return self._unlink(name, fd, "scan_removed_bad")
        return key

    @staticmethod
    def _unlink(name: str, fd: int, what: str) -> str | None:
        try:
            os.unlink(name, dir_fd=fd)
        except OSError as e:
            log.debug("fs tier: cannot remove %s: %r", name, e)
            return None
        return what


def count_in_first_shard(shard_fds: list[int]) -> int:
    """Files in shard ``00``: times :data:`N_SHARDS`, an estimate of the namespace's size."""
    try:
        return sum(1 for _ in os.scandir(shard_fds[0])) * N_SHARDS
    except OSError:
        return 0
