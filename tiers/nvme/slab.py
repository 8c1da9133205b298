"""The slabs: files or block devices opened (O_DIRECT where allowed), sized, stamped with a
superblock, and cut into fixed slots of a header block and a payload area."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import threading
import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path

from asynctier import IntegrityError, TierConfigError
from asynctier.chunked import MAX_KEY_BYTES
from asynctier.integrity import ChunkHeader, checksum, header_matches
from asynctier.posix_io import O_DIRECT, aligned_buffer, buffer_address, logical_block_size

from . import sysio
from .format import VERSION, Superblock, round_up

__all__ = ["Geometry", "SlabSet", "slot_error"]

log = logging.getLogger(__name__)


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

    def __init__(self, paths: list[Path], *, direct_io: bool, preallocate: bool, count: Callable[..., None]) -> None:
        self.paths = paths
        self.direct_io = direct_io
        self.preallocate = preallocate
        self._count = count
        #: one descriptor per stripe (emptied in place on close: the journal shares this list)
        self.fds: list[int] = []
        self.direct = False
        self.geo: Geometry | None = None
        self._hdr = 0  # the geometry's header area, read on every slot I/O
        self.slab_id = b""
        self.epoch = 0
        self._bufs = _Buffers()

    # -- open / close --------------------------------------------------------------------------
    def open(self, capacity_bytes: int | None, chunk_bytes: int, layout_digest: bytes) -> bool:
        """Open every slab, check or write the superblocks and bump the epoch (so sequence
        numbers are never reused); True if the set was formatted afresh (no index to recover)."""
        self.direct = bool(self.direct_io and O_DIRECT)
        self.fds = []  # a new list: a finalizer of an earlier open may still hold the old one
        n = len(self.paths)
        per = capacity_bytes // n if capacity_bytes is not None else None
        try:
            sizes: list[int] = []
            for p in self.paths:
                p.parent.mkdir(parents=True, exist_ok=True)
                fd, size = self._open_one(p, per)
                self.fds.append(fd)
                sizes.append(size)
            if not self.direct:  # one path refused O_DIRECT: one mode for all (chunks go unbounced)
                for fd in self.fds:
                    fl = fcntl.fcntl(fd, fcntl.F_GETFL)
                    if fl & O_DIRECT:
                        fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~O_DIRECT)
            block = max(logical_block_size(p) for p in self.paths)
            geo = Geometry(block, chunk_bytes, min(sizes), n)
            if geo.per_stripe <= 0:
                raise TierConfigError(
                    f"capacity_bytes={capacity_bytes} leaves no room for one slot of {geo.slot_size} bytes"
                )
            self.geo = geo
            self._hdr = geo.hdr_area
            fresh = not self._read_superblocks(chunk_bytes, layout_digest)
            if fresh:
                self.slab_id = uuidlib.uuid4().bytes
                self.epoch = 0
                log.info("nvme: formatting %s (%d slots of %d bytes)", self.paths, geo.nslots, geo.slot_size)
            self.epoch += 1
            self._write_superblocks(chunk_bytes, layout_digest)
        except BaseException:
            self.close()
            raise
        return fresh

    def _open_one(self, p: Path, size: int | None) -> tuple[int, int]:
        """Open (creating and sizing if needed) one slab; return (fd, its size in bytes)."""
        flags = os.O_RDWR | getattr(os, "O_CLOEXEC", 0)
        is_blk = p.exists() and stat.S_ISBLK(p.stat().st_mode)
        if not is_blk:
            flags |= os.O_CREAT
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

    def _read_superblocks(self, chunk_bytes: int, layout_digest: bytes) -> bool:
        """True if every stripe carries a superblock of this geometry and layout (same slab set)."""
        geo = self.geo
        assert geo is not None
        buf = aligned_buffer(geo.data_off)
        ids: set[bytes] = set()
        epochs: list[int] = []
        for i, fd in enumerate(self.fds):
            if os.preadv(fd, [buf], 0) < Superblock.SIZE:
                return False
            sb = Superblock.unpack(buf)
            if sb is None:
                return False
            have = (sb.version, sb.block, sb.chunk_bytes, sb.slot_size, sb.per_stripe, sb.stripe, sb.stripes)
            want = (VERSION, geo.block, chunk_bytes, geo.slot_size, geo.per_stripe, i, len(self.fds))
            if have != want or (sb.layout_digest, sb.data_off) != (layout_digest, geo.data_off):
                log.warning("nvme: %s holds another layout or geometry; reformatting", self.paths[i])
                return False
            ids.add(sb.slab_id)
            epochs.append(sb.epoch)
        if len(ids) != 1:
            return False
        self.slab_id = ids.pop()
        self.epoch = max(epochs)
        return True

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
            b = self._bufs.mem = aligned_buffer(need)
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

    def runs(self, items: list[tuple[int, int]]) -> list[list[tuple[int, int, int, int]]]:
        """Group ``(position, slot)`` pairs into runs adjacent on one stripe, each one I/O:
        ``(position, slot, stripe, offset)``."""
        geo = self.geo
        assert geo is not None
        located = sorted((*geo.locate(s), p, s) for p, s in items)
        runs: list[list[tuple[int, int, int, int]]] = []
        for stripe, off, p, s in located:
            last = runs[-1][-1] if runs else None
            # two buffers a slot: 512 slots stay within the kernel's IOV_MAX (1024)
            if last is not None and last[2] == stripe and last[3] + geo.slot_size == off and len(runs[-1]) < 512:
                runs[-1].append((p, s, stripe, off))
            else:
                runs.append([(p, s, stripe, off)])
        return runs


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
