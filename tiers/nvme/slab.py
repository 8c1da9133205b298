"""The slabs: files or block devices opened (O_DIRECT where allowed), sized, stamped with a
superblock, and cut into fixed slots of a header block and a payload area."""

from __future__ import annotations

import errno
import fcntl
import gc
import logging
import os
import stat
import threading
import time
import uuid as uuidlib
from collections.abc import Callable, Mapping
from pathlib import Path

from asynctier import IntegrityError, TierConfigError, TierStateError
from asynctier.buffers import HUGE_PAGE, allocate_buffer
from asynctier.core import MAX_KEY_BYTES
from asynctier.core.backend import lock_held_by
from asynctier.engines.speedups import speedups
from asynctier.errors import MediumDamagedError, MediumMismatchError
from asynctier.integrity import ChunkHeader, checksum, header_matches
from asynctier.posix_io import O_DIRECT, aligned_buffer, buffer_address, logical_block_size, memory_fs

from . import sysio
from .files import check_opened_slab, create_slab, slab_kind
from .format import SB_MAGIC, VERSION, Superblock, round_up

__all__ = ["Geometry", "Run", "SlabSet", "slot_error", "slot_runs"]

log = logging.getLogger(__name__)


#: a run of adjacent slots of one stripe: (position in the job, slot, stripe, offset) of each
Run = list[tuple[int, int, int, int]]

#: Slots of one run at most: two buffers a slot stay within the kernel's IOV_MAX (1024).
RUN_MAX = 512

#: Bytes of one run, about, where a worker's I/O is a copy on the CPU (a slab without
#: ``O_DIRECT``, or in memory): a group job's worker offers its CPU between two runs, and
#: longer uninterrupted copies kept the event loop's thread waiting for a core (256 KiB loads
#: on tmpfs: p99 lag 5.8-6.1 ms with runs of 8 slots, 1.5-1.7 with runs of 2;
#: docs/benchmarks-issue-28.md, seventeenth pass).
BUFFERED_RUN_BYTES = 512 << 10


class Geometry:
    """Where slot ``g`` lives: stripe ``g % n``, position ``g // n`` in that stripe."""

    def __init__(self, block: int, chunk_bytes: int, stripe_bytes: int, nstripes: int) -> None:
        self.block = block
        self.hdr_area = round_up(ChunkHeader.packed_size(MAX_KEY_BYTES), block)
        self.payload_area = round_up(chunk_bytes, block)
        self.slot_size = self.hdr_area + self.payload_area
        self.data_off = round_up(max(Superblock.SIZE, 4096), block)
        self.per_stripe = max(0, (stripe_bytes - self.data_off) // self.slot_size)
        self.nstripes = nstripes
        self.nslots = self.per_stripe * nstripes

    def locate(self, slot: int) -> tuple[int, int]:
        """(stripe, byte offset in that stripe) of ``slot``."""
        stripe, pos = divmod(slot, self.nstripes)[::-1]
        return stripe, self.data_off + pos * self.slot_size


class _Buffers(threading.local):
    """Per-thread aligned memory for slot headers and bounce copies (``slots`` slots' worth)."""

    mem: memoryview | None = None


class SlabSet:
    """The slab files or block devices of one tier, and the I/O of whole slots in them.

    ``count`` is the tier's stats counter (``direct_io_fallbacks``, ``bounce_copies``).
    """

    def __init__(
        self, paths: list[Path], *, direct_io: bool, preallocate: bool, count: Callable[..., None],
        file_mode: int = 0o600, dir_mode: int = 0o700,
    ) -> None:  # fmt: skip
        self.paths = paths
        self.file_mode = file_mode  # of a slab file this tier creates, and of its directory
        self.dir_mode = dir_mode
        self.direct_io = direct_io
        self.preallocate = preallocate
        self._count = count
        #: one descriptor per stripe (emptied in place on close: the journal shares this list)
        self.fds: list[int] = []
        self.direct = False
        self.copies = True  # (set at open: see run_slots)
        #: Slots of one run at most for the native workers (set at open, read per job):
        #: :data:`RUN_MAX` where the device does the work (``O_DIRECT``: one long run is one
        #: request), else, where each slot's I/O is a copy on the CPU (no ``O_DIRECT``, or a
        #: slab in memory: tmpfs accepts ``O_DIRECT`` since Linux 6.6 and still copies), as
        #: many as make :data:`BUFFERED_RUN_BYTES`, rounded up (two slots of 256 KiB chunks,
        #: eight of 64 KiB, one of 2 MiB).
        self.run_slots = RUN_MAX
        self.geo: Geometry | None = None
        self._hdr = 0  # the geometry's header area, read on every slot I/O
        self.slab_id = b""
        self.epoch = 0
        #: the last open found nothing of a slab set in its files (new or empty): any index
        #: files under its name belong to another set, or to a slab deleted since
        self.new_set = False
        self._bufs = _Buffers()
        #: files the last open created (True) or found empty (False): undone if it fails
        self._made: list[tuple[Path, bool]] = []

    # -- open / close --------------------------------------------------------------------------
    def open(
        self, capacity_bytes: int | None, chunk_bytes: int, layout_digest: bytes, *, reformat: bool,
        create: bool = True, before_write: Callable[[bytes, int], None] | None = None,
        before_format: Callable[[bool], None] | None = None,
    ) -> bool:  # fmt: skip
        """Open every slab, check or write the superblocks and bump the epoch (so sequence
        numbers are never reused); True if the set was formatted afresh (no index to recover).

        Slabs of another layout, and files or devices that are not slabs, are refused with
        :class:`TierConfigError` (nothing written) unless ``reformat``. On any failure the
        files this open created are removed (see :meth:`abandon`). Without ``create``, a set
        that would be created, formatted afresh or grown is refused instead, nothing written.
        ``before_write(slab_id, nslots)`` is called on a set reused, ``before_format(new_set)``
        on a set about to be formatted (``new_set``: its files held none), each before anything
        is written.
        """
        self.direct = bool(self.direct_io and O_DIRECT)
        self.copies = True
        self.fds = []  # a new list: a finalizer of an earlier open may still hold the old one
        self._made = []
        n = len(self.paths)
        per = capacity_bytes // n if capacity_bytes is not None else None
        try:
            found: list[int] = []  # each slab's size as found
            for p in self.paths:
                fd, cur = self._open_one(p, create)
                self.fds.append(fd)
                found.append(cur)
            if not self.direct:  # one path refused O_DIRECT: one mode for all (chunks go unbounced)
                for fd in self.fds:
                    fl = fcntl.fcntl(fd, fcntl.F_GETFL)
                    if fl & O_DIRECT:
                        fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~O_DIRECT)
            # whether a slot's I/O is a copy on the CPU rather than the device's work (run_slots)
            self.copies = not self.direct or any(
                not stat.S_ISBLK(os.fstat(fd).st_mode) and memory_fs(p) is not None
                for p, fd in zip(self.paths, self.fds)
            )
            sizes = [self._stripe_size(p, cur, per) for p, cur in zip(self.paths, found)]
            block = max(logical_block_size(p) for p in self.paths)
            geo = Geometry(block, chunk_bytes, min(sizes), n)
            if geo.per_stripe <= 0:
                least = n * (geo.data_off + geo.slot_size)
                raise TierConfigError(
                    f"capacity_bytes={capacity_bytes} leaves no room for one slot of {geo.slot_size} bytes: each "
                    f"of the {n} slab(s) also holds a {geo.data_off}-byte superblock; give at least {least}"
                )
            self.geo = geo
            self._hdr = geo.hdr_area
            self.run_slots = min(RUN_MAX, -(-BUFFERED_RUN_BYTES // geo.slot_size)) if self.copies else RUN_MAX
            fresh = self._adopt([self._look(fd, cur) for fd, cur in zip(self.fds, found)], chunk_bytes,
                                layout_digest, reformat, create)  # fmt: skip
            short = [(p, cur, size) for p, cur, size in zip(self.paths, found, sizes) if cur < size]
            if short and not create:
                p, cur, size = short[0]
                raise MediumDamagedError(
                    f"nvme: {str(p)!r} is {cur} bytes, shorter than its share of the slab set ({size}): truncated, "
                    "the slots past its end are lost. Nothing was written (create=False); an open that may "
                    "create grows it back"
                )
            if fresh and before_format is not None:
                before_format(self.new_set)
            if fresh:
                self.slab_id = uuidlib.uuid4().bytes
                self.epoch = 0
                log.info("nvme: formatting %s (%d slots of %d bytes)", self.paths, geo.nslots, geo.slot_size)
            if not fresh and before_write is not None:
                before_write(self.slab_id, geo.nslots)
            self.epoch += 1
            # superblocks before sizing: a process killed in between leaves a slab of ours (or an
            # empty file), never a file of zeros that the next open would take for foreign data
            self._write_superblocks(chunk_bytes, layout_digest)
            self._size_files(found, sizes)
        except BaseException:
            self.abandon()
            raise
        return fresh

    def _open_one(self, p: Path, create: bool) -> tuple[int, int]:
        """Open one slab, creating a file that is not there (with ``create``); (fd, its size
        as found). Never through a link (except one to a block device), never a FIFO or
        directory (:func:`.files.slab_kind`)."""
        kind = slab_kind(p, self.dir_mode, create=create)
        if kind == "new" and not create:
            raise TierConfigError(f"nvme: no slab at {str(p)!r} (create=False: nothing is made)")
        if kind == "new":
            create_slab(p, self.file_mode)
            self._made.append((p, True))
        flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0) | (0 if kind == "device" else os.O_NOFOLLOW)
        fd = -1
        if self.direct_io and O_DIRECT:
            try:
                fd = sysio.open_noatime(p, flags | O_DIRECT)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self._count("direct_io_fallbacks")
                log.warning("nvme: %s refuses O_DIRECT; using buffered I/O", p)
        if fd < 0:
            fd = sysio.open_noatime(p, flags)
            self.direct = False
        try:
            check_opened_slab(fd, p, kind)
            _hold_alone(fd, p, self.fds)
            cur = os.lseek(fd, 0, os.SEEK_END)
        except BaseException:
            os.close(fd)
            raise
        if kind == "file" and cur == 0:
            if not create:
                os.close(fd)
                raise TierConfigError(f"nvme: {str(p)!r} is empty: no slab set there (create=False: nothing is made)")
            self._made.append((p, False))  # an empty file given: emptied again if the open fails
        return fd, cur

    @staticmethod
    def _stripe_size(p: Path, cur: int, per: int | None) -> int:
        """The bytes slab ``p`` (``cur`` bytes now) gives the slab set."""
        if stat.S_ISBLK(p.stat().st_mode):
            return min(cur, per) if per else cur
        if per is None:
            if cur == 0:
                raise TierConfigError(f"capacity_bytes is required to create the nvme slab {str(p)!r}")
            return cur
        return per

    def _size_files(self, found: list[int], sizes: list[int]) -> None:
        """Extend the slab files shorter than their share (decided to be ours by now)."""
        for fd, cur, size in zip(self.fds, found, sizes):
            if cur < size and not stat.S_ISBLK(os.fstat(fd).st_mode):
                if self.preallocate:
                    os.posix_fallocate(fd, 0, size)
                else:
                    os.ftruncate(fd, size)
                os.fdatasync(fd)  # the size, as the superblock's own sync made it durable before

    def _look(self, fd: int, size: int) -> Superblock | str:
        """What slab ``fd`` starts with: its superblock, or ``"empty"``, ``"damaged"`` (the
        slab magic, a bad checksum: a torn superblock of ours) or ``"foreign"``."""
        assert self.geo is not None
        if size == 0:
            return "empty"
        buf = aligned_buffer(self.geo.data_off)
        got = os.preadv(fd, [buf], 0)
        if got < len(SB_MAGIC) or bytes(buf[: len(SB_MAGIC)]) != SB_MAGIC:
            return "foreign"
        sb = Superblock.unpack(buf[:got])
        return sb if sb is not None else "damaged"

    def _adopt(
        self, found: list[Superblock | str], chunk_bytes: int, layout_digest: bytes, reformat: bool, create: bool
    ) -> bool:
        """Reuse the slab set found (False), format it afresh (True: empty or damaged slabs,
        or ``reformat``), or refuse with an error that says what is there."""
        self.new_set = all(w == "empty" for w in found)
        problems: list[str] = []
        ours: list[Superblock] = []
        for i, (p, what) in enumerate(zip(self.paths, found)):
            if what == "foreign":
                kind = "device" if stat.S_ISBLK(p.stat().st_mode) else "file"
                problems.append(f"{p} is not an nvme slab (a {kind} that does not start with a slab superblock)")
            elif isinstance(what, Superblock):
                diff = self._differences(what, i, chunk_bytes, layout_digest)
                if diff:
                    problems.append(f"{p} holds an nvme slab of another layout ({'; '.join(diff)})")
                else:
                    ours.append(what)
        if not problems and len({sb.slab_id for sb in ours}) > 1:
            problems.append(f"{', '.join(map(str, self.paths))} are slabs of different slab sets")
        if problems and not reformat:
            said = "; ".join(problems)
            raise MediumMismatchError(
                f"nvme: {said}. Nothing was written: pass reformat=True to format over it (what it holds is "
                "lost), or use another path.",
                said,
            )
        if problems:
            log.warning("nvme: reformat=True: formatting over what is there: %s", "; ".join(problems))
            return True
        if len(ours) == len(self.paths):
            self.slab_id = ours[0].slab_id
            self.epoch = max(sb.epoch for sb in ours)
            return False
        if not create:
            said = ", ".join(f"{p}: {w if isinstance(w, str) else 'ours'}" for p, w in zip(self.paths, found))
            raise MediumDamagedError(
                f"nvme: an incomplete or damaged slab set ({said}): a superblock fails its checksum or a slab "
                "of the set is missing, so none of its chunks can be served, and an open that may create formats "
                "it afresh. Nothing was written (create=False)"
            )
        if ours or "damaged" in found:
            log.warning("nvme: %s: an incomplete or damaged slab set; formatting it afresh", self.paths)
        return True

    def _differences(self, sb: Superblock, stripe: int, chunk_bytes: int, layout_digest: bytes) -> list[str]:
        """How superblock ``sb`` (of stripe ``stripe``) differs from this configuration."""
        geo = self.geo
        assert geo is not None
        fields = [
            ("format version", sb.version, VERSION),
            ("chunk_bytes", sb.chunk_bytes, chunk_bytes),
            ("block", sb.block, geo.block),
            ("slot_size", sb.slot_size, geo.slot_size),
            ("slots", sb.per_stripe, geo.per_stripe),
            ("stripe", sb.stripe, stripe),
            ("stripes", sb.stripes, len(self.paths)),
            ("data_off", sb.data_off, geo.data_off),
        ]
        out = [f"{name} {have} there, {want} here" for name, have, want in fields if have != want]
        if sb.layout_digest != layout_digest:
            out.append("layout digest differs: another namespace or chunk size")
        return out

    def _write_superblocks(self, chunk_bytes: int, layout_digest: bytes) -> None:
        geo = self.geo
        assert geo is not None
        buf = aligned_buffer(geo.data_off)
        for i, fd in enumerate(self.fds):
            sb = Superblock(
                geo.block,
                chunk_bytes,
                geo.slot_size,
                geo.per_stripe,
                self.epoch,
                i,
                len(self.fds),
                self.slab_id,
                layout_digest,
                geo.data_off,
            )
            buf[: Superblock.SIZE] = sb.pack()
            if os.pwritev(fd, [buf], 0) != buf.nbytes:
                raise OSError(errno.EIO, "short superblock write")
            os.fdatasync(fd)

    def close(self) -> None:
        fds = self.fds  # emptied in place: the journal and the finalizer share this list
        while fds:
            os.close(fds.pop())

    def abandon(self) -> None:
        """Close after a failed open, leaving nothing the open made: files it created are
        removed, an empty file it was given is emptied again."""
        self.close()
        made, self._made = self._made, []
        for p, created in made:
            try:
                if created:
                    p.unlink()
                else:
                    os.truncate(p, 0)
            except OSError as e:  # the open's own error is the one to report
                log.warning("nvme: cannot undo %s after a failed open: %r", p, e)

    # -- slot I/O ------------------------------------------------------------------------------
    @property
    def slot_size(self) -> int:
        assert self.geo is not None
        return self.geo.slot_size

    @property
    def hdr_area(self) -> int:
        return self._hdr

    def locate(self, slot: int) -> tuple[int, int]:
        """(descriptor, byte offset) of ``slot``."""
        assert self.geo is not None
        stripe, off = self.geo.locate(slot)
        return self.fds[stripe], off

    def buffer(self, slots: int) -> memoryview:
        """This thread's aligned scratch memory, ``slots`` whole slots long (or more)."""
        assert self.geo is not None
        need = slots * self.geo.slot_size
        b = self._bufs.mem
        if b is None or b.nbytes < need:
            # on huge pages where it spans one and the system has them: a bounce copy goes to
            # the device in as few segments as from a primary buffer on huge pages
            # (asynctier.buffers); a smaller one would hold a whole huge page per thread
            b = self._bufs.mem = allocate_buffer(need, huge_pages=need >= HUGE_PAGE, populate=False)
        return b

    def zero_copy_ok(self, view: memoryview) -> bool:
        """Whether ``view`` can go straight to the medium (no bounce copy)."""
        assert self.geo is not None
        if view.nbytes != self.geo.payload_area:
            return False
        if not self.direct:
            return True
        return buffer_address(view) % self.geo.block == 0

    def all_zero_copy(self, view: memoryview, chunk_bytes: int) -> bool:
        """Whether every chunk of the primary ``view`` can go straight to the medium: then the
        group paths skip the per-chunk address check (a ctypes call each)."""
        geo = self.geo
        assert geo is not None
        if chunk_bytes != geo.payload_area:
            return False
        if not self.direct:
            return True
        return chunk_bytes % geo.block == 0 and buffer_address(view) % geo.block == 0

    def write_iov(self, region: memoryview, head: bytes, data: memoryview, direct: bool) -> list[memoryview]:
        """The buffers of one slot's write: ``head`` in ``region``'s header block, then the
        payload straight from ``data`` when ``direct``, else copied into ``region``."""
        region[: len(head)] = head
        h = self._hdr
        if direct:
            return [region[:h], data]
        region[h : h + data.nbytes] = data  # bounce copy (unaligned view)
        self._count("bounce_copies")
        return [region]

    def read_iov(self, region: memoryview, out: memoryview, direct: bool) -> list[memoryview]:
        """The buffers of one slot's read: the header into ``region``, the payload straight
        into ``out`` when ``direct``, else into ``region`` (see :meth:`payload`)."""
        return [region[: self._hdr], out] if direct else [region]

    def payload(self, region: memoryview, out: memoryview, direct: bool) -> memoryview:
        """Where :meth:`read_iov`'s buffers put the payload."""
        h = self._hdr
        return out if direct else region[h : h + out.nbytes]

    def pwritev(self, fd: int, bufs: list[memoryview], offset: int) -> None:
        sysio.pwritev_all(fd, bufs, offset)

    def preadv(self, fd: int, bufs: list[memoryview], offset: int) -> int:
        return sysio.preadv_all(fd, bufs, offset)

    def runs(self, slots: Mapping[int, tuple[int, ...]], limit: int = RUN_MAX) -> list[Run]:
        """A job's slots (position -> (slot, ...)) in runs adjacent on one stripe, each one I/O
        of at most ``limit`` slots, in disk order: ``(position, slot, stripe, offset)``."""
        geo = self.geo
        assert geo is not None
        return _slot_runs(slots, geo.nstripes, geo.data_off, geo.slot_size, limit)


def slot_runs(
    slots: Mapping[int, tuple[int, ...]], nstripes: int, data_off: int, slot_size: int, limit: int
) -> list[Run]:
    """The reference of ``asynctier._speedups.slot_runs`` (:meth:`SlabSet.runs`): where each
    slot lives (stripe ``slot % nstripes``, ``data_off + slot // nstripes * slot_size`` in it),
    in disk order, cut into runs of adjacent slots of one stripe, ``limit`` at most."""
    placed = sorted((s % nstripes, data_off + s // nstripes * slot_size, p, s) for p, (s, *_) in slots.items())
    runs: list[Run] = []
    run: Run = []
    last_stripe = last_off = -1
    for stripe, off, p, s in placed:
        if stripe == last_stripe and off == last_off + slot_size and len(run) < limit:
            run.append((p, s, stripe, off))
        else:
            run = [(p, s, stripe, off)]
            runs.append(run)
        last_stripe, last_off = stripe, off
    return runs


# a job's runs, per job on the loop's thread: the C twin where built
_fast = speedups()
_slot_runs = slot_runs if _fast is None else _fast.slot_runs


def slot_error(
    hb: memoryview, payload: memoryview, key: bytes, slot: int, seq: int, csum: int, layout_digest: bytes,
    verify: bool,
) -> IntegrityError | None:  # fmt: skip
    """Verify one loaded slot: its header is exactly what the index says was written (a byte
    comparison, no parse) and, with ``verify``, the payload checksum matches; anything else
    gets the full check and its precise error."""
    if header_matches(hb, key, payload.nbytes, csum, layout_digest, seq) and (not verify or checksum(payload) == csum):
        return None
    try:
        hdr = ChunkHeader.unpack(hb, key=key)
        if hdr.seq != seq or hdr.checksum != csum:
            raise IntegrityError(f"slot {slot} holds another write of this key (stale or reused)", key)
        hdr.verify(payload, layout_digest=layout_digest, payload_len=payload.nbytes, check_data=verify)
    except IntegrityError as e:
        return e
    return None


#: How long an open waits for a dropped tier of this process to let its slab go.
_DROPPED_TIER_S = 1.0


def _after_dropped_tiers(fd: int) -> None:
    """``flock`` again once the tiers of this process dropped without ``aclose()`` are
    collected: an error a load kept in a reference cycle keeps such a tier alive until the
    cycle collector runs, and its finalizer (maybe on its checkpoint thread) then closes the
    slab. Raises BlockingIOError if the slab is still held after :data:`_DROPPED_TIER_S`."""
    gc.collect()
    end = time.monotonic() + _DROPPED_TIER_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > end:
                raise
            time.sleep(0.02)


def _hold_alone(fd: int, p: Path, opened: list[int]) -> None:
    """Take the slab ``p`` (just opened as ``fd``) for this tier alone: an exclusive lock on
    its open file description (``flock``), held until ``fd`` is closed. A second tier on the
    same slab, in this process or another, would write the same slots and journal as the
    first, and both lose what they stored; so would two of this tier's paths naming one file
    (``opened``: the descriptors of the paths before it). Where the file system has no locks,
    nothing is held (as the fs tier does without its owners lock)."""
    st = os.fstat(fd)
    for other in opened:
        o = os.fstat(other)
        if (o.st_dev, o.st_ino) == (st.st_dev, st.st_ino):
            raise TierConfigError(f"nvme: slab {str(p)!r} is the same file as an earlier one of paths")
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _after_dropped_tiers(fd)
        lock_held_by(fd)
    except BlockingIOError:
        raise TierStateError(
            f"nvme: slab {str(p)!r} is open by another tier (in this process or another); "
            "one tier at a time may use a slab"
        ) from None
    except OSError as e:  # no locks on this file system
        log.info("nvme: cannot lock %s (%r); nothing keeps a second tier off it", p, e)
