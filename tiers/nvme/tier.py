"""The ``nvme`` tier: configuration, open and close, and the per-chunk primitives, wired
from the slab set (:mod:`.slab`), the catalog (:mod:`.catalog`) and the coalesced jobs
(:mod:`.groups`)."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from asynctier import IntegrityError, TierConfigError
from asynctier.core.ops import Op, priority_of
from asynctier.core.validation import check_bool, check_keys, check_path, integer, permission_bits
from asynctier.engines import Engine
from asynctier.engines.split import SplitEngine
from asynctier.integrity import checksum, pack_header
from asynctier.io_engine import check_io_engine, runs_native
from asynctier.stats import TierStats

from .catalog import Catalog, clear_index_for_format, index_files
from .fast import LoadPath
from .files import IndexDir
from .groups import CoalescedJobs
from .slab import SlabSet
from .stores import StorePath

__all__ = ["NvmeTier"]


class NvmeTier(CoalescedJobs):
    """Chunks in fixed slots of preallocated slab files or block devices, with O_DIRECT.

    Args (besides the common knobs of :class:`~asynctier.core.ChunkTier`):
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
            a job of many chunks evicts what it lacks if that is more; at most an eighth
            of the slots; a batch goes on to the end of its last victim's run of adjacent
            slots, up to as many more within that eighth (docs/tiers/nvme.md, "Runs in a
            full slab"). Once a full slab's stores lacked room, the native engine keeps
            ``4 * evict_batch`` slots free ahead of them (at most 1/32 of the slots), so that
            a store need not wait for a journal commit before it writes ("Evicting ahead").
        coalesce_bytes: a call of many small chunks runs as jobs of about this many slot
            bytes (default 1 MiB; 0: one job per chunk); adjacent slots in a job move with
            one ``pwritev``/``preadv``. On the native engine, whose pool spreads a job's runs
            over its workers, a call is one job of up to ``max_inflight`` times this, in runs
            of about this, 16 at most. On threads, a call is cut into at most
            ``max_inflight`` jobs; while other calls are in progress, into its share of that
            depth (``max_inflight`` over the calls), each job up to as many times
            ``coalesce_bytes``, never into jobs smaller than ``coalesce_bytes`` where it has
            that much. Either way smaller on a small slab:
            the jobs running at once hold at most half its slots, so a call larger than the
            slab evicts as one chunk per job would.
        reformat: format over what the paths hold when it is not a slab set of this layout
            (a slab of another namespace, chunk size or capacity, or a file or device that is
            not a slab); default False: refuse with an error saying what is there. A slab set
            of this layout is reused either way.
        create: default True: create a slab that is not there, format an empty or damaged
            set afresh, grow a file shorter than its share. False (what ``asynctier fsck``
            opens with): open only a whole slab set of this layout that is there, and write
            nothing if it is not: a missing or empty slab is a :class:`TierConfigError`, a
            damaged or truncated one (or a lost index) a :class:`~asynctier.MediumDamagedError` that
            says what is lost.
        io_engine: ``"auto"`` (default), ``"native"`` or ``"threads"``. ``"threads"``:
            ``preadv``/``pwritev`` on ``max_inflight`` Python worker threads (``"psync"``, the
            former name, still works with a DeprecationWarning). ``"native"``: loads and
            stores run on C worker threads (the fs tier's), one job per chunk or per run of
            adjacent slots, read or written and hashed without the GIL; removals and the rest
            stay on threads.
            ``"auto"``: native where the native workers are available
            (:func:`asynctier.engines.native.problem`), else threads.
        worker_nice: how much the native workers raise their nice value (0-19; default 5), as
            the fs tier's: where there are fewer cores than workers, the event loop's thread
            then wins the CPU when it wakes (5, not the fs tier's 10: these workers mostly
            wait for the device, and 10 changed neither the loop's lag nor its CPU here).
            Where a slot's I/O is a copy on the CPU (no ``O_DIRECT``, or a slab on tmpfs), the
            loop may wait for a core behind the workers' copies: their runs are then cut to
            about 512 KiB, which took 256 KiB loads' p99 lag on tmpfs from 5.8-6.1 to 1.5-1.7
            ms (docs/benchmarks-issue-28.md, seventeenth pass); before that cut, 19 took it from
            4.4-5.3 to 1.9-2.2 ms at the same GB/s.
        file_mode: permission bits of every file the tier creates (slab files, checkpoint,
            journal; an int, default ``0o600``), set exactly whatever the umask.
        dir_mode: permission bits of every directory it creates (default ``0o700``). A slab's
            directory or the index directory that others may write into is refused at
            ``open()``; no file is opened through a link (docs/security.md).
    """

    default_type = "nvme"
    supported_durability = ("none", "fsync")
    handles_capacity = True  # the slab's size: its slots are the bound
    capacity_sizes_medium = True
    applies_timeout = False  # (local I/O: nothing cuts a system call off)
    frames_own_bytes = True  # the slot header is placed here, beside the payload (zero-copy)

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
        reformat: bool = False,
        create: bool = True,
        io_engine: str = "auto",
        worker_nice: int = 5,
        file_mode: int = 0o600,
        dir_mode: int = 0o700,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.paths = _slab_paths(path, paths)
        self.index_dir = check_path("index_dir", index_dir) if index_dir is not None else None
        for name, v in (
            ("preallocate", preallocate),
            ("direct_io", direct_io),
            ("reformat", reformat),
            ("create", create),
        ):
            check_bool(name, v)
        self.file_mode = permission_bits("file_mode", file_mode, 0o600)
        self.dir_mode = permission_bits("dir_mode", dir_mode, 0o700)
        if self.capacity_bytes is not None and self.capacity_bytes >= 1 << 63:  # (the superblock's field)
            raise TierConfigError(f"capacity_bytes must be below 2**63; got {self.capacity_bytes}")
        for name, iv in (("checkpoint_every", checkpoint_every), ("evict_batch", evict_batch)):
            if isinstance(iv, bool) or not isinstance(iv, int) or iv <= 0:
                raise TierConfigError(f"{name} must be a positive int; got {iv!r}")
        self.preallocate = preallocate
        self.direct_io = direct_io
        self.reformat = reformat
        self.create = create
        self.checkpoint_every = checkpoint_every
        self.evict_batch = evict_batch
        if isinstance(coalesce_bytes, bool) or not isinstance(coalesce_bytes, int) or coalesce_bytes < 0:
            raise TierConfigError(f"coalesce_bytes must be an int >= 0; got {coalesce_bytes!r}")
        self.coalesce_bytes = coalesce_bytes
        self.io_engine = check_io_engine("nvme", io_engine)
        self.worker_nice = integer("worker_nice", worker_nice, 0, 19)
        self._slabs = SlabSet(self.paths, direct_io=direct_io, preallocate=preallocate, count=self._stats.incr,
                              file_mode=file_mode, dir_mode=dir_mode)  # fmt: skip
        self._catalog = None
        self._zc_all = False
        self._run_limit = 1  # slots of one run on the native workers (set at open)
        self._split: SplitEngine | None = None

    # -- geometry ------------------------------------------------------------------------------
    def stored_size(self) -> int:
        """Bytes one chunk occupies: its whole slot (header block + rounded payload)."""
        geo = self._slabs.geo
        return geo.slot_size if geo is not None else self.offloading_spec.chunk_bytes

    def _places(self) -> tuple[str, ...]:
        """The slabs, resolved when asked (a chain refuses two tiers on one; no I/O at construction)."""
        return tuple(os.path.realpath(p) for p in self.paths)

    @property
    def nslots(self) -> int:
        """Slots in the slab set (0 before ``open()``)."""
        geo = self._slabs.geo
        return geo.nslots if geo is not None else 0

    def _spreads_jobs(self) -> bool:
        return self._split is not None and self._zc_all

    @property
    def active_io_engine(self) -> str:
        """``"native"`` or ``"threads"``: what ``io_engine`` resolved to at ``open()``."""
        return "native" if self._split is not None else "threads"

    def stats(self) -> TierStats:
        """The common counters; ``extra["loop_wakeups"]`` (native engine): times its workers
        woke the event loop (each for a batch of ends), as the fs tier reports it;
        ``extra["withdrawn"]`` (native engine): chunks of cancelled calls never read or written
        (taken back from the workers, or runs of a job not begun)."""
        s = super().stats()
        if self._split is not None:
            s.extra["loop_wakeups"] = self._split.native.wakeups
            s.extra["withdrawn"] = self._split.native.withdrawn
        return s

    # -- engines -------------------------------------------------------------------------------
    def make_engine(self) -> Engine:
        self._split = None
        if not runs_native(self.io_engine):
            return super().make_engine()
        # loads and stores on the C workers; the rest (they wait for the journal) on threads
        engine = self._split = SplitEngine(self.max_inflight or 1, f"asynctier-{self.tier_type}", self.worker_nice)
        engine.fast[Op.LOAD] = LoadPath(self, engine.native)
        engine.fast[Op.STORE] = StorePath(self, engine.native)
        return engine

    def job_body(self, op: Op) -> Callable[..., Any]:
        body = super().job_body(op)
        return body if self._split is None else self._split.held(body, op.priority)

    def group_body(self, op: str) -> Callable[..., Any]:
        body = super().group_body(op)
        return body if self._split is None else self._split.held(body, priority_of(op))

    # -- open / close --------------------------------------------------------------------------
    def open_medium(self) -> None:
        """Open the index directory and the slabs, check or format their superblocks, recover the index."""
        if any(stat.S_ISBLK(p.stat().st_mode) for p in self.paths if p.exists()) and self.index_dir is None:
            raise TierConfigError("an nvme tier on a block device needs 'index_dir' for its checkpoint and journal")
        first = self.paths[0]
        where = IndexDir(
            self.index_dir or first.parent, self.file_mode, self.dir_mode,
            "index_dir" if self.index_dir else "the slab's directory",
        )  # fmt: skip
        if not self.create and not where.path.is_dir():
            raise TierConfigError(
                f"nvme: {where.name} {str(where.path)!r} is not there (create=False: nothing is made)"
            )
        where.open()  # first: a directory refused leaves the slabs untouched
        try:
            self._open_slabs(where, first.name + ".atidx")
        except BaseException:
            where.undo()
            raise

    def _open_slabs(self, where: IndexDir, base: str) -> None:
        spec, slabs = self.offloading_spec, self._slabs
        fresh = slabs.open(
            self.capacity_bytes, spec.chunk_bytes, spec.layout_digest, reformat=self.reformat, create=self.create,
            before_write=None if self.create else partial(Catalog.check_index, where, base),
            before_format=partial(clear_index_for_format, where, base),
        )  # fmt: skip
        assert slabs.geo is not None
        cat = Catalog(
            where,
            base,
            slabs.slab_id,
            slabs.epoch,
            slabs.geo.nslots,
            slabs.fds,
            durable=self.durability == "fsync",
            evict_batch=self.evict_batch,
            checkpoint_every=self.checkpoint_every,
            count=self._stats.incr,
        )
        try:
            cat.recover(fresh)
            self._zc_all = slabs.all_zero_copy(self._view, spec.chunk_bytes)
            self._run_limit = self._native_run_slots()
        except BaseException:
            if fresh and slabs.new_set:  # abandoned with its slabs: the index files this open began
                for n in index_files(where, base):
                    where.unlink(n)
            cat.release_files()
            slabs.abandon()  # a slab this open created or formatted from empty does not stay
            raise
        self._catalog = cat
        cat.start_checkpointer(slabs.fds)

    def close_medium(self) -> None:
        """Stop the checkpointer, write a final checkpoint (a clean reopen replays nothing), close."""
        try:
            if self._catalog is not None:
                self._catalog.close()
        finally:
            self._slabs.close()

    def checkpoint(self) -> None:
        """Write the whole index to a new checkpoint and start a new journal generation (blocking)."""
        assert self._catalog is not None
        self._catalog.checkpoint()

    # -- the primitives ------------------------------------------------------------------------
    def write_chunk(self, key: bytes, data: memoryview) -> None:
        """Write ``data`` into a free slot, then publish it (docs/tiers/nvme.md has the order)."""
        slabs, cat = self._slabs, self._catalog
        assert cat is not None
        slot, seq, ticket = cat.allocate(key)
        try:
            cat.journal.wait(ticket)  # the slot's EVICT record first: never overwrite a live mapping
            csum = checksum(data)
            head = pack_header(key, data.nbytes, csum, self.offloading_spec.layout_digest, seq)
            fd, off = slabs.locate(slot)
            slabs.pwritev(fd, slabs.write_iov(slabs.buffer(1), head, data, slabs.zero_copy_ok(data)), off)
        except BaseException:
            cat.abort(key, slot, ticket)
            raise
        cat.journal.wait(cat.publish(key, slot, seq, csum))

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        """Read the slot of ``key`` into ``out`` and verify header (and payload, with ``verify``)."""
        slabs, cat = self._slabs, self._catalog
        assert cat is not None
        slot, seq, csum = cat.pin(key)
        try:
            fd, off = slabs.locate(slot)
            region = slabs.buffer(1)
            direct = slabs.zero_copy_ok(out)
            got = slabs.preadv(fd, slabs.read_iov(region, out, direct), off)
            payload = slabs.payload(region, out, direct)
            H = slabs.hdr_area
            bad = (
                IntegrityError(f"short read of slot {slot}: {got} bytes", key)
                if got < H + out.nbytes
                else self._check_loaded(key, slot, seq, csum, region[:H], payload)
            )
            if bad is not None:
                bad.copy = (slot, seq)  # the copy to drop: not one stored since (delete_bad_copy)
                raise bad
            if not direct:
                out[:] = payload  # bounce copy (unaligned view)
                self._stats.incr("bounce_copies")
        finally:
            # a bad copy is dropped by the caller: a load deletes it, fsck only when asked to
            cat.unpin([slot])

    def chunk_exists(self, key: bytes) -> bool:
        """Whether ``key`` is indexed."""
        assert self._catalog is not None
        return key in self._catalog.index.entries

    def delete_bad_copy(self, key: bytes, exc: BaseException) -> None:
        """Drop the slot that failed verification, if ``key`` still maps to it with the same
        sequence number: a remove and a new store of ``key`` may have come in between, and a
        store in flight is not cancelled."""
        where = exc.copy if isinstance(exc, IntegrityError) else None
        if isinstance(where, tuple):
            cat = self._catalog
            assert cat is not None
            cat.journal.wait(cat.forget(key, *where))

    def delete_chunk(self, key: bytes) -> bool:
        """Drop ``key`` (an ``EVICT`` record; its slot is rewritten only after that record)."""
        cat = self._catalog
        assert cat is not None
        ticket = cat.forget(key)
        cat.journal.wait(ticket)
        return ticket > 0

    def list_chunks(self) -> list[bytes]:
        """Every indexed key, least recently used first."""
        assert self._catalog is not None
        idx = self._catalog.index
        with idx.lock:
            return idx.keys_lru()

    # -- index-backed contract methods (O(1), no I/O) ------------------------------------------
    def _begin_store(self, key: bytes) -> list[bytes] | None:
        cat = self._catalog
        assert cat is not None
        ticket = cat.stored_ticket(key)
        if ticket is None:
            return []
        cat.journal.wait(ticket)  # (worker threads only) acknowledged as stored once it is journaled
        return None  # already stored: skip the write

    async def lookup(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key is indexed (O(1) each; a load still verifies the slot)."""
        ks = check_keys(keys)
        self._check_open()
        assert self._catalog is not None
        entries = self._catalog.index.entries
        return [k in entries for k in ks]

    async def touch(self, keys: Sequence[bytes]) -> None:
        """Make stored keys most recently used."""
        ks = check_keys(keys)
        self._check_open()
        assert self._catalog is not None
        # the index lock is held across a checkpoint snapshot and journal sync: take it on a
        # thread, never on the event loop
        await anyio.to_thread.run_sync(self._catalog.touch, ks)

    def stored_chunk_count(self) -> int | None:
        return len(self._catalog.index.entries) if self._catalog is not None else 0

    def used_byte_count(self) -> int | None:
        return len(self._catalog.index.entries) * self.stored_size() if self._catalog is not None else 0


def _slab_paths(path: str | os.PathLike[str] | None, paths: Sequence[str | os.PathLike[str]] | None) -> list[Path]:
    """The slabs named by exactly one of ``path`` or ``paths``, checked."""
    if (path is None) == (paths is None):
        raise TierConfigError("the nvme tier needs exactly one of 'path' or 'paths'")
    if paths is not None:
        if not isinstance(paths, (list, tuple)) or not paths:
            raise TierConfigError(f"paths must be a non-empty list of paths; got {paths!r:.80}")
        out = [check_path("paths[]", p) for p in paths]
    else:
        out = [check_path("path", path)]
    if len(set(out)) != len(out):
        raise TierConfigError("paths must be distinct")
    return out
