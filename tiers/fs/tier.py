"""The ``fs`` tier: configuration and wiring of layout, ownership, recovery, pool and engines."""

from __future__ import annotations

import math
import os
import stat
import time
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from asynctier import BlockingChunkTier, ChunkNotFoundError, TierConfigError
from asynctier.core import Op
from asynctier.core.backend import in_this_process, run_on_thread_to_end
from asynctier.core.jobs import SKIPPED, Skipped, evened
from asynctier.core.validation import check_bool, check_path, check_private_dir, integer, make_dirs, permission_bits
from asynctier.engines import Engine
from asynctier.engines.split import SplitEngine
from asynctier.io_engine import IoEngine, check_io_engine, runs_native
from asynctier.lru import LRUIndex
from asynctier.posix_io import O_DIRECT, logical_block_size, network_fs
from asynctier.stats import TierStats

from . import owners
from .layout import HEADER_BLOCK, N_SHARDS, TempNames, current_umask, namespace_dir, open_subdir, write_layout_note
from .loads import fast_paths
from .native import GROUP_CHUNKS, NativeIO
from .pool import POOL_TARGET, TmpfilePool, close_tier_fds
from .protocol import ChunkProtocol, not_found
from .scan import Recovery, count_in_first_shard, list_keys
from .threads import ThreadsIO

__all__ = ["FsTier"]

_O_DIRECTORY: int = getattr(os, "O_DIRECTORY", 0)
#: the native engine's tmpfile pool refills only after the tier has had no call for this long
POOL_QUIET_S = 1.0
#: pooled files at most (``tmpfile_pool``): each holds a descriptor
TMPFILE_POOL_MAX = 4096
_MAX_PENDING_TOUCHES = 1 << 16  # touched keys remembered for stamping at close (beyond: approximate)


def _check_config(
    root: object, direct_io: object, publish: object, shared: object, background_scan: object,
    scan_sync_limit: object, lru_times: object, stale_tmp_s: object, worker_nice: object,
    tmpfile_pool: object, recycle: object,
) -> None:  # fmt: skip
    """Raise :class:`TierConfigError` naming what is accepted, for the first bad value."""
    # flags are exactly True, False or "auto": 0, 1.0 or Decimal(1) compare equal to a bool
    for name, flag in (("recycle", recycle), ("direct_io", direct_io), ("background_scan", background_scan)):
        check_bool(name, flag, also=("auto",))
    for name, flag in (("shared", shared), ("lru_times", lru_times)):
        check_bool(name, flag)
    if tmpfile_pool is not None and (
        isinstance(tmpfile_pool, bool) or not isinstance(tmpfile_pool, int) or not 0 <= tmpfile_pool <= TMPFILE_POOL_MAX
    ):
        # each pooled file holds a descriptor: a million took every one the process had
        raise TierConfigError(f"tmpfile_pool must be an int from 0 to {TMPFILE_POOL_MAX} or None; got {tmpfile_pool!r}")
    integer("worker_nice", worker_nice, 0, 19)
    check_path("root", root)
    if publish not in ("auto", "tmpfile", "rename"):
        raise TierConfigError(f"publish must be 'auto', 'tmpfile' or 'rename'; got {publish!r}")
    if isinstance(scan_sync_limit, bool) or not isinstance(scan_sync_limit, int) or scan_sync_limit < 0:
        raise TierConfigError(f"scan_sync_limit must be an int >= 0; got {scan_sync_limit!r}")
    if isinstance(stale_tmp_s, bool) or not isinstance(stale_tmp_s, (int, float)) or not stale_tmp_s >= 0:
        raise TierConfigError(f"stale_tmp_s must be a number >= 0; got {stale_tmp_s!r}")


class FsTier(BlockingChunkTier):
    """One checksummed file per chunk under ``root``; atomic, capacity-bounded, restart-safe.

    The on-disk format, publication, recycling and recovery: docs/tiers/fs.md.

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
            ``load`` look on disk and adopt what they find; a store of a key the index holds
            looks on disk before it is skipped (another process may have removed it:
            ``stats().extra["stale_hits"]``). A ``lookup`` hit is the index's: a load of a key
            another process removed fails ``not_found`` and takes it out. Loads open files with
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
            ``"native"``: C worker threads (:mod:`asynctier.engines.native`) run each chunk's whole
            job, open to close with its xxh3, holding no GIL, and report to the event loop
            in batches through an eventfd; refused, with the reason, where they are not
            built. ``"threads"``: blocking system calls on ``max_inflight`` Python worker
            threads. ``"auto"`` (the default): native wherever the extension is built,
            threads otherwise. Why native: per chunk, Python threads pay a job queue, a
            thread wake-up and a GIL hand-off per system call, which the C workers do not
            (figures: docs/benchmarks.md). On either engine, removal, lookup, fsck and the
            retry of anything that did not simply succeed run on threads.
        worker_nice: how much the native workers raise their nice value (0-19; default 10).
            On a machine with fewer cores than workers (``max_inflight`` + up to one per
            CPU), a stream of writes keeps them all runnable, and their nice value sets the
            event-loop thread's share of the CPU against them, and so its lag; the price is
            more loop-thread CPU per chunk where the workers' kernel time shares its cores
            (docs/benchmarks.md). With spare cores it changes nothing. Raising nice needs no
            privilege; the workers are named ``asynctier-nio``.
        tmpfile_pool: how many unnamed ``O_TMPFILE`` files a background thread keeps made
            ahead of need, so that a chunk's write does not wait for its file's creation (a
            journaled metadata operation). None (default): 64; 0: none. Each costs an open
            descriptor and an empty inode until used (no data blocks); a crash leaves
            nothing behind. Chunks that find the pool empty make their own
            (``stats().extra["tmpfile_pool_empty"]``). On the native engine the pool refills
            only once no call has been in progress for ``POOL_QUIET_S`` (1 s): its thread
            would take the GIL from the event loop and the application's threads, so a stream
            beyond the files made ahead, or calls a few milliseconds apart, make their own
            (docs/benchmarks.md, docs/benchmarks-vllm-reads.md).
        recycle: what eviction does with the file of the chunk it evicts to make room for a
            store. ``"auto"`` (default): recycle it when ``verify=True``; ``True``: recycle it;
            ``False``: unlink it. Recycling renames the file away from its name, then the
            store overwrites it in place and renames it under the new key: at capacity (a
            cache's steady state) no file is created, allocated, freed or trimmed per chunk.
            It happens only while no other tier, in this process or another, has the
            namespace open (:mod:`.owners`; where locks are not available nothing is
            recycled), and not for a key stored again meanwhile. A crash during the
            overwrite may leave, after a power loss, the old name with mixed content: the
            checksum rejects it on load, hence ``"auto"`` only with ``verify=True``.
            Counted in ``stats().extra``: ``recycled``, ``recycle_refused`` (another tier had
            the namespace open), ``recycle_retries`` (an overwrite failed; the ordinary path
            wrote the chunk).
        file_mode: permission bits of every file the tier makes (an int, default ``0o600``);
            set exactly, whatever the umask.
        dir_mode: permission bits of every directory the tier makes (default ``0o700``). A
            root, namespace or shard directory others may write into is refused at ``open()``
            (docs/security.md).
        **kwargs: the common knobs (``max_inflight``, ``capacity_bytes``, ``durability`` in
            ``"none"``/``"fsync"``, ``verify``, ...), see :class:`asynctier.ChunkTier`.
    """

    default_type = "fs"
    supported_durability = ("none", "fsync")
    uses_index = True
    recovers_index = True  # its scan at open
    applies_timeout = False  # (local I/O: nothing cuts a system call off)
    frames_own_bytes = True  # the header block sits in front of the payload in each file (zero-copy)

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
        worker_nice: int = 10,
        tmpfile_pool: int | None = None,
        recycle: bool | Literal["auto"] = "auto",
        file_mode: int = 0o600,
        dir_mode: int = 0o700,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.file_mode = permission_bits("file_mode", file_mode, 0o600)
        self.dir_mode = permission_bits("dir_mode", dir_mode, 0o700)
        _check_config(root, direct_io, publish, shared, background_scan, scan_sync_limit, lru_times,
                      stale_tmp_s, worker_nice, tmpfile_pool, recycle)  # fmt: skip
        self.io_engine: IoEngine = check_io_engine(self.tier_type, io_engine)
        self.root = Path(root)
        self.dir = namespace_dir(self.root, self.offloading_spec)
        self.direct_io = direct_io
        self.publish = publish
        self.shared = shared
        self.background_scan = background_scan
        self.scan_sync_limit = scan_sync_limit
        self.lru_times = lru_times
        self.stale_tmp_s = float(stale_tmp_s)
        self.worker_nice = worker_nice
        self.tmpfile_pool = tmpfile_pool
        self.recycle = recycle
        self.index: LRUIndex = LRUIndex(self.capacity_bytes, track_removals=True)
        self.names = TempNames()
        self.protocol = ChunkProtocol(self.dir, self.offloading_spec, [], self.names, self._stats,
                                      sync=self.durability == "fsync", verify=self.verify)  # fmt: skip
        label = f"fs tier {self.dir}"
        self.threads = ThreadsIO(self)
        self.recovery = Recovery(self.index, self._stats, self.names, self.stale_tmp_s, self.threads.evict, label)
        self._native: NativeIO | None = None
        self._split: SplitEngine | None = None  # the engine, when it runs native
        #: whether evicted files are overwritten in place (decided at open)
        self.recycle_on = False
        #: NFS, Lustre, ...: lock queries may wait on a server
        self.network_fs: str | None = None
        self._chunk_size = HEADER_BLOCK + self.offloading_spec.chunk_bytes
        if self.capacity_bytes is not None and self.capacity_bytes < self._chunk_size:  # (every store failed)
            raise TierConfigError(
                f"capacity_bytes={self.capacity_bytes} is less than one stored chunk ({self._chunk_size} bytes: "
                "its header block and payload)"
            )
        self._lock_fd = -1
        self._fd_finalizer: weakref.finalize[[list[int], list[TmpfilePool]], FsTier] | None = None
        self._touched: dict[bytes, int] = {}  # key -> time of last use (ns), stamped at close
        self._idle_since = -math.inf  # time.monotonic() when the last call ended

    def stored_size(self) -> int:
        """Header block plus payload, rounded up to the file system block."""
        return self._chunk_size

    def _places(self) -> tuple[str, ...]:
        """The root, resolved when asked (a chain refuses two tiers on one; no I/O at construction)."""
        return (os.path.realpath(self.root),)

    # -- bookkeeping the engines share -----------------------------------------------------
    def _note_gone(self, key: bytes) -> None:
        self.recovery.note_gone(key)

    def _alone(self) -> bool:
        """Whether no other open tier holds this namespace (:func:`.owners.alone`)."""
        return owners.alone(self._lock_fd)

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

    def check_read(self, key: bytes, hb: memoryview, out: memoryview, got: int, csum: int | None = None) -> None:
        """The protocol's header check, and the key's time of use for ``lru_times``."""
        self.protocol.check_read(key, hb, out, got, csum)
        if self.lru_times and len(self._touched) < _MAX_PENDING_TOUCHES:
            # stamped at close, not here: a futimens per load dirties the inode and can wait
            # on the journal, on the latency path
            self._touched[key] = time.time_ns()

    def note_loaded(self, keys: list[bytes]) -> None:
        """The time of use of ``keys`` for ``lru_times``, as :meth:`check_read` notes one key's."""
        if self.lru_times and len(self._touched) < _MAX_PENDING_TOUCHES:
            self._touched.update(dict.fromkeys(keys, time.time_ns()))

    # -- lifecycle ---------------------------------------------------------------------------
    def open_medium(self) -> None:
        """Create/open the namespace, probe O_DIRECT and O_TMPFILE, rebuild the index."""
        fds = self._open_shards()
        self.protocol.shard_fds = fds
        self.network_fs = network_fs(self.dir)
        self.recycle_on = self._lock_fd >= 0 and (self.recycle is True or (self.recycle == "auto" and self.verify))
        pools: list[TmpfilePool] = []
        # a tier dropped without aclose() must not leak its descriptors or its pool's thread
        owned = fds if self._lock_fd < 0 else [*fds, self._lock_fd]
        self._fd_finalizer = weakref.finalize(self, in_this_process(close_tier_fds), owned, pools)
        try:
            # the alignment O_DIRECT needs; at most the header block (a larger f_bsize, as on
            # Lustre, is a preference; a real refusal switches O_DIRECT off)
            self.protocol.block = min(max(512, logical_block_size(self.dir)), HEADER_BLOCK)
            self.protocol.probe(self.publish, self.direct_io)
            background = self.background_scan
            if background == "auto":
                background = count_in_first_shard(fds) > self.scan_sync_limit
            self.recovery.start(fds, self._chunk_size, bool(background))
            self._start_pool(fds, pools)
            if self._native is not None:  # its engine started before open_medium
                self._native.start()
        except BaseException:
            self._close_fds()
            raise

    def _open_shards(self) -> list[int]:
        """The shard directories' descriptors; the namespace and the shards are opened relative
        to their parent and never through a symbolic link (the root itself is the user's path)."""
        fds: list[int] = []
        umask = current_umask()
        proto = self.protocol
        proto.file_mode, proto.fix_mode = self.file_mode, bool(self.file_mode & umask)
        fix_dirs = bool(self.dir_mode & umask)
        try:
            make_dirs(self.root, self.dir_mode, "fs tier", "root")  # the root may be a link: the user's path
            root_fd = os.open(self.root, os.O_RDONLY | _O_DIRECTORY | os.O_CLOEXEC)
            try:
                check_private_dir(root_fd, self.root, "fs tier")
                dfd = open_subdir(root_fd, self.dir.name, self.dir_mode, fix_dirs)
            finally:
                os.close(root_fd)
            try:
                check_private_dir(dfd, self.dir, "fs tier")
                write_layout_note(dfd, self.offloading_spec, self.file_mode, proto.fix_mode)
                for i in range(N_SHARDS):
                    fds.append(open_subdir(dfd, f"{i:02x}", self.dir_mode, fix_dirs, apart=True))
                    check_private_dir(fds[-1], self.dir / f"{i:02x}", "fs tier")
                self._lock_fd = owners.hold_namespace(dfd, self.dir, self.file_mode, proto.fix_mode)
            finally:
                os.close(dfd)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return fds

    def _start_pool(self, fds: list[int], pools: list[TmpfilePool]) -> None:
        target = POOL_TARGET if self.tmpfile_pool is None else self.tmpfile_pool
        if not (target and self.protocol.use_tmpfile):
            return
        flags = os.O_WRONLY | (O_DIRECT if self.protocol.use_direct else 0)
        hold: Callable[[], bool] | None = None
        if self._native is not None:
            # The native engine's pool refills only once the tier has been idle a while: a
            # Python thread making files takes the GIL from the event loop, which the C
            # workers otherwise leave alone, and from the application's threads; refilling
            # in each gap between calls (vLLM's are milliseconds apart) slowed vLLM's
            # scheduler and lookups (docs/benchmarks-vllm-reads.md). Files made while idle
            # still take the next burst.
            me = weakref.ref(self)  # the thread must not keep a dropped tier alive

            def hold() -> bool:
                tier = me()
                return tier is not None and (tier._active > 0 or time.monotonic() - tier._idle_since < POOL_QUIET_S)

        pool = TmpfilePool(fds, flags, target, f"asynctier-fs-tmpfiles-{self.dir.name[:8]}", hold,
                           (self.protocol.file_mode, self.protocol.fix_mode))  # fmt: skip
        self.protocol.pool = pool
        pools.append(pool)

    def close_medium(self) -> None:
        """Stop a background scan, stamp touched files' times, release the shard descriptors."""
        self.recovery.stop()
        if self.lru_times and self._touched:
            touched, self._touched = self._touched, {}
            for key, used_ns in touched.items():
                fd, name = self.protocol.name(key)
                try:
                    # the time of last use, as a write stamps its own; a link is not followed
                    os.utime(name, ns=(used_ns, used_ns), dir_fd=fd, follow_symlinks=False)
                except OSError:
                    pass  # best effort: gone, or a read-only root
        self._close_fds()

    def _close_fds(self) -> None:
        self.protocol.shard_fds = []
        self.protocol.pool = None
        self._lock_fd = -1
        self.recycle_on = False
        fin = self._fd_finalizer
        if fin is not None:
            fin()  # closes each descriptor once, whichever comes first: this or garbage collection

    # -- an incomplete index: misses are checked on disk -----------------------------------
    @property
    def index_incomplete(self) -> bool:
        """While a background scan runs, after one failed, or with ``shared=True``."""
        return self.recovery.scanning or self.recovery.failed or self.shared

    def _begin_store(self, key: bytes) -> list[bytes] | None:
        """With ``shared=True`` a key the index holds is looked for on disk before its store is
        skipped: another process may have removed or evicted it (the store then wrote nothing
        and reported it stored). On a worker thread: see :meth:`_async_store`."""
        victims = super()._begin_store(key)
        if victims is None and self.shared and not self._on_disk(key):
            self._stats.incr("stale_hits")
            self.index.discard(key)
            victims = super()._begin_store(key)
        return victims

    async def _async_store(self, key: bytes, t0: float, write: Callable[[list[bytes]], Any]) -> Skipped | None:
        if not self.shared:
            return await super()._async_store(key, t0, write)
        # the index's answer is looked up on disk (a network file system's round trip): off the loop
        victims = await run_on_thread_to_end(self._reserve_store_blocking, key, t0)
        if victims is None:
            return SKIPPED
        return await self._async_store_reserved(key, t0, victims, write)

    def _on_disk(self, key: bytes) -> bool:
        """A whole chunk file is published under ``key`` (a truncated one does not count)."""
        fd, name = self.protocol.name(key)
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == self._chunk_size

    def begin_load(self, key: bytes) -> object | None:
        entry = self.index.pin_entry(key)
        if entry is not None:
            return entry
        if self.index_incomplete and self._on_disk(key):
            entry = self.index.adopt_pinned_entry(key, self._chunk_size)
            if entry is not None:
                return entry
        raise not_found(key)

    async def lookup(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key is stored: from the index; index misses are checked on disk while
        a background scan runs or with ``shared=True``."""
        hits = await super().lookup(keys)
        if not self.index_incomplete or all(hits):
            return hits
        misses = [k for k, h in zip(keys, hits) if not h]
        on_disk = await run_on_thread_to_end(lambda: [self._on_disk(k) for k in misses])
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
        t = self.recovery.thread
        if t is not None and t.is_alive():
            await run_on_thread_to_end(t.join)
        return await super().stored_keys()

    def on_idle(self) -> None:
        # a held pool (the native engine's) looks again within POOL_HOLD_POLL_S and refills
        # once the tier has stayed idle for POOL_QUIET_S
        self._idle_since = time.monotonic()

    def stats(self) -> TierStats:
        """The common counters; ``extra["tmpfile_pool_ready"]``: files made ahead, not yet used;
        ``extra["loop_wakeups"]`` (native engine): times its workers woke the event loop;
        ``extra["withdrawn"]`` (native engine): chunks of cancelled calls taken back from the
        workers before any started them."""
        s = super().stats()
        pool = self.protocol.pool
        if pool is not None:
            s.extra["tmpfile_pool_ready"] = pool.ready
        if self._native is not None:  # times the workers woke the event loop (each for a batch of chunks)
            s.extra["loop_wakeups"] = self._native.engine.wakeups
            s.extra["withdrawn"] = self._native.engine.withdrawn
        return s

    # -- engines ---------------------------------------------------------------------------
    @property
    def active_io_engine(self) -> str:
        """``"native"`` or ``"threads"``: what ``io_engine`` resolved to at ``open()``."""
        return "native" if self._native is not None else "threads"

    def make_engine(self) -> Engine:
        self._native = None
        self._split = None
        if not runs_native(self.io_engine):
            return super().make_engine()
        name = f"asynctier-{self.tier_type}"
        # a turn of the loop plans at most 16 chunks (each 10-40 us of Python here), or one group
        # job (up to GROUP_CHUNKS, planned in bulk): a load of many group jobs would otherwise be
        # planned whole in one callback (p99 lag of
        # grouped loads 0.87-1.33 ms against 1.10-1.50 unbounded; docs/benchmarks-issue-28.md, eighth pass).
        # Stores and loads on the C workers; removals, lookups and verification on threads, as
        # the nvme tier's: on the native engine each was a coroutine and two thread hand-offs
        # per chunk (29-44 us of the loop's CPU a chunk; docs/benchmarks-issue-28.md, twenty-second pass)
        split = SplitEngine(self.max_inflight or 1, name, self.worker_nice, plan_chunks=16)
        self._native = NativeIO(self, split.native)
        # the plain store and load run without a coroutine per chunk (.fast, .loads)
        split.fast[Op.STORE], split.fast[Op.LOAD] = fast_paths(self._native)
        self._split = split
        return split

    def group_size(self, op: Op, n: int) -> int:
        """Chunks per job for a call of ``n`` chunks: on the native engine, up to
        ``GROUP_CHUNKS`` in each job, each its own file, so that the loop thread plans, submits
        and books one job for them; the pool spreads a job's files over its workers, each
        holding a token of its own, so the depth takes no more jobs than that
        (docs/benchmarks-issue-28.md, nineteenth pass). Loads, while the index is complete (a
        miss is looked up on a thread, and a group's continuations run one after another);
        stores on a local file system (:meth:`_groups_stores`)."""
        if self._native is None or n < 2 or self.index_incomplete:
            return 1
        if op is not Op.LOAD and not (op is Op.STORE and self._groups_stores(n)):
            return 1
        return evened(n, GROUP_CHUNKS)

    def _groups_stores(self, n: int) -> bool:
        """Whether a store of ``n`` chunks goes as group jobs: on a local file system, where
        each chunk then makes a new file in room the tier has, or recycles its one victim's
        file. (A chunk whose victims must be deleted first goes on after its group, one such
        after another: not grouped when ``recycle`` is off and the call does not fit.) On a
        network file system every file made is a round trip: one job each. Groups of new
        files raised the loop's lag on the disk before a group's worker yielded between its
        jobs (eighth and ninth passes); since then they lower it, and take the loop's CPU for
        a fill on the disk from 68-92 to 27 µs a chunk (docs/benchmarks-issue-28.md, thirteenth pass)."""
        if self.network_fs:
            return False
        cap = self.capacity_bytes
        return cap is None or self.recycle_on or self.index.used_bytes + n * self._chunk_size <= cap

    def group_body(self, op: Op) -> Callable[[list[bytes], list[int], float], Any]:
        body = self.job_body(op)  # the native engine's coroutine per chunk

        async def each(keys: list[bytes], cids: list[int], t0: float) -> list[BaseException | None]:
            out: list[BaseException | None] = []
            for key, cid in zip(keys, cids):
                try:
                    await body(key, cid, t0)
                except Exception as e:  # that chunk's failure
                    out.append(e)
                else:
                    out.append(None)
            return out

        return each

    def job_body(self, op: Op) -> Callable[..., Any]:
        native = self._native
        if native is not None and op is Op.STORE:
            return native.store_job
        if native is not None and op is Op.LOAD:
            return native.load_job
        if op is Op.STORE:
            body: Callable[..., Any] = self._store_evicting
        elif op is Op.VERIFY:
            body = self._verify_pinned
        else:
            body = super().job_body(op)
        return body if self._split is None else self._split.held(body, op.priority)

    def _store_evicting(self, key: bytes, cid: int, t0: float) -> Skipped | None:
        """Evict, then write: into the first victim's file where it may be recycled."""
        victims = self._reserve_store_blocking(key, t0)
        if victims is None:
            return SKIPPED
        try:
            self.threads.evict_then_store(key, self._chunk(cid), victims)
        except BaseException as e:
            self._end_store(key, t0, e)
            raise
        self._end_store(key, t0, None)
        return None

    def _verify_pinned(self, key: bytes, remove_bad: int, t0: float) -> None:
        verify = super().job_body(Op.VERIFY)
        if self.recycle_on:
            # pinned like a load: an evicted file may be overwritten in place. Unindexed, it
            # is either being recycled right now or not ours (no other tier is open here)
            try:
                self.begin_load(key)
            except ChunkNotFoundError as e:
                self._end_verify(key, e, bool(remove_bad))
                raise
        elif not self.index.pin(key):
            verify(key, remove_bad, t0)  # another process's file is verified too
            return
        try:
            verify(key, remove_bad, t0)
        finally:
            self.index.unpin(key, touch=False)

    # -- the primitives ----------------------------------------------------------------------
    def write_chunk(self, key: bytes, data: memoryview) -> None:
        """Header + payload in one pwritev to a new file, published atomically."""
        self.threads.store(key, data)

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        """Header + payload in one preadv, the payload straight into ``out``; then verify."""
        self.threads.load(key, out)

    def chunk_exists(self, key: bytes) -> bool:
        """Whether the chunk's file exists."""
        return self._on_disk(key)

    def delete_chunk(self, key: bytes) -> bool:
        """Unlink the chunk's file (a reader holding it open still reads it whole)."""
        self._note_gone(key)
        fd, name = self.protocol.name(key)
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            return False
        return True

    def list_chunks(self) -> list[bytes]:
        """Every key stored in the namespace on disk (for fsck)."""
        return list_keys(self.protocol.shard_fds)
