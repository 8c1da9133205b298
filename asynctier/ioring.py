"""A minimal io_uring ring driven from the event-loop thread (system calls through ctypes).

Why not worker threads: a blocking tier at depth 16 keeps 16 Python threads trading the GIL
several times per chunk; on a 2-core host the event-loop thread then waits behind them
(p99 loop lag of 10-25 ms measured during an fs offload, while the same load from fio in
another process costs the loop < 1 ms). A ring moves the waiting into the kernel: the loop
thread writes submission entries, ``io_uring_enter`` hands them over (open, write,
publish, close as one linked chain per chunk; a loop iteration's chains in one call, or each
chain as soon as it is ready), and completions come back through an eventfd the loop
watches. No worker thread, no GIL hand-off per system call.

Why not the ``liburing`` binding: its 2026 builds die with SIGILL on CPUs without the
instruction set they were compiled for (seen with liburing 2026.3.x on an AVX2-only VM), and
a signal cannot be caught. The part of io_uring used here is small and stable (kernel 5.19+ ABI: the ring
layout, a few opcodes, sparse registered files), so it is written out against the kernel
headers, x86-64 only (its ordering of plain stores is what the ring protocol needs without
explicit barriers). :func:`problem` says why a ring cannot be used here, or None.

Lifetimes: path strings are copied by the kernel when the entry is submitted; iovec arrays
and the buffers they point at must stay alive until their completion arrives. :class:`Ring`
keeps whatever :meth:`Ring.keep` is given until the completion with that ``user_data``
is reaped.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import functools
import mmap
import os
import platform
import struct
import sys
from collections.abc import Sequence
from typing import Any

from .posix_io import buffer_address

__all__ = ["IovecTable", "Ring", "RingUnavailable", "problem"]

# system call numbers (the same on every architecture since 5.1; only x86-64 is used)
_NR_SETUP, _NR_ENTER, _NR_REGISTER = 425, 426, 427

# opcodes (include/uapi/linux/io_uring.h)
OP_NOP, OP_READV, OP_WRITEV, OP_FSYNC = 0, 1, 2, 3
OP_OPENAT, OP_CLOSE = 18, 19
OP_RENAMEAT, OP_UNLINKAT, OP_LINKAT = 35, 36, 39
OP_FTRUNCATE = 55  # Linux 6.9+

# sqe flags
IOSQE_FIXED_FILE = 1 << 0
IOSQE_IO_LINK = 1 << 2
IOSQE_IO_HARDLINK = 1 << 3
IOSQE_ASYNC = 1 << 4
IOSQE_CQE_SKIP_SUCCESS = 1 << 6  # no completion entry when it succeeds (Linux 5.17+)
# Operations whose own failure neither breaks their link nor cancels the skip flag (Linux
# 6.18, tests/test_ioring.py): flagged skip-on-success, they fail without a word and the
# chain goes on, so :meth:`Ring._push` refuses the flag on them.
_SKIP_UNSAFE = frozenset({OP_UNLINKAT, OP_RENAMEAT, OP_LINKAT, OP_FTRUNCATE})

IORING_FSYNC_DATASYNC = 1
_IORING_FEAT_SINGLE_MMAP = 1 << 0
_IORING_FEAT_NODROP = 1 << 1
_IORING_FEAT_CQE_SKIP = 1 << 11
_IORING_ENTER_GETEVENTS = 1
_IORING_SQ_CQ_OVERFLOW = 1 << 1  # sq_flags: completions wait on the kernel's overflow list
_IORING_OFF_SQ_RING, _IORING_OFF_CQ_RING, _IORING_OFF_SQES = 0, 0x8000000, 0x10000000
_IORING_REGISTER_EVENTFD = 4
_IORING_REGISTER_PROBE = 8
_IO_URING_OP_SUPPORTED = 1
_IORING_REGISTER_FILES2 = 13
_IORING_REGISTER_IOWQ_MAX_WORKERS = 19
_IORING_RSRC_REGISTER_SPARSE = 1

_SQE = struct.Struct("=BBHiQQIIQHHIQQ")  # 64 bytes
_CQE = struct.Struct("=QiI")  # 16 bytes
_U32 = struct.Struct("=I")
assert _SQE.size == 64 and _CQE.size == 16


class RingUnavailable(RuntimeError):
    """io_uring cannot be used here (architecture, kernel, seccomp, io_uring_disabled)."""


class _Params(ctypes.Structure):
    _fields_ = [
        ("sq_entries", ctypes.c_uint32),
        ("cq_entries", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("sq_thread_cpu", ctypes.c_uint32),
        ("sq_thread_idle", ctypes.c_uint32),
        ("features", ctypes.c_uint32),
        ("wq_fd", ctypes.c_uint32),
        ("resv", ctypes.c_uint32 * 3),
        # io_sqring_offsets
        ("sq_head", ctypes.c_uint32),
        ("sq_tail", ctypes.c_uint32),
        ("sq_ring_mask", ctypes.c_uint32),
        ("sq_ring_entries", ctypes.c_uint32),
        ("sq_flags", ctypes.c_uint32),
        ("sq_dropped", ctypes.c_uint32),
        ("sq_array", ctypes.c_uint32),
        ("sq_resv1", ctypes.c_uint32),
        ("sq_user_addr", ctypes.c_uint64),
        # io_cqring_offsets
        ("cq_head", ctypes.c_uint32),
        ("cq_tail", ctypes.c_uint32),
        ("cq_ring_mask", ctypes.c_uint32),
        ("cq_ring_entries", ctypes.c_uint32),
        ("cq_overflow", ctypes.c_uint32),
        ("cq_cqes", ctypes.c_uint32),
        ("cq_flags", ctypes.c_uint32),
        ("cq_resv1", ctypes.c_uint32),
        ("cq_user_addr", ctypes.c_uint64),
    ]


class _RsrcRegister(ctypes.Structure):
    _fields_ = [
        ("nr", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("resv2", ctypes.c_uint64),
        ("data", ctypes.c_uint64),
        ("tags", ctypes.c_uint64),
    ]


class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_IOV2 = struct.Struct("=QQQQ")  # two struct iovec: base, length


class IovecTable:
    """Two-entry iovec arrays (header block + payload), made once and rewritten per chain.

    Building a ctypes array per chain cost ~4.5 us of the loop thread; rewriting a row is
    one ``pack_into``. A row must not be rewritten while a chain that uses it is in flight
    (the kernel reads a readv/writev's iovecs when it issues the entry, which for a linked
    entry is after the entries before it complete): index rows by something the chain
    holds, such as its registered file slot.
    """

    def __init__(self, rows: int) -> None:
        self._mem = mmap.mmap(-1, max(1, rows * _IOV2.size))
        self._mv = memoryview(self._mem)
        self._base = buffer_address(self._mv)

    def pair(self, row: int, addr0: int, len0: int, addr1: int, len1: int) -> tuple[int, int, Any]:
        """Row ``row`` set to two spans; returns what :meth:`Ring.prep_rw` takes."""
        off = row * _IOV2.size
        _IOV2.pack_into(self._mv, off, addr0, len0, addr1, len1)
        return self._base + off, 2, self._mem

    def close(self) -> None:
        """Release the memory (no chain may use a row any more)."""
        self._mv.release()
        self._mem.close()


@functools.cache
def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _sys(nr: int, *args: Any) -> int:
    res = int(_libc().syscall(nr, *args))
    if res < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return res


@functools.cache
def problem() -> str | None:
    """Why a :class:`Ring` cannot be set up in this process (None: it can). Cached."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"the built-in io_uring ring supports Linux on x86-64 only (this is {sys.platform}/{platform.machine()})"
    try:
        Ring(entries=4, files=1).close()
    except RingUnavailable as e:
        return str(e)
    return None


class Ring:
    """One io_uring instance, used from one thread (the event loop's).

    ``entries`` submission slots; ``files`` registered (sparse) direct-descriptor slots, for
    chains that open a file and use it before its descriptor number is known. Prepare
    entries with the ``prep_*`` methods (each returns nothing; the entry is queued), hand
    them to the kernel with :meth:`submit`, collect completions with :meth:`reap`.
    """

    def __init__(self, entries: int = 256, files: int = 0) -> None:
        p = _Params()
        try:
            self.fd = _sys(_NR_SETUP, ctypes.c_uint(entries), ctypes.byref(p))
        except OSError as e:  # ENOSYS (old kernel), EPERM (seccomp, io_uring_disabled), ENOMEM
            raise RingUnavailable(f"io_uring_setup failed: {e}") from e
        self._maps: list[mmap.mmap] = []
        # what close() reads, set before anything below can fail and call it
        self.eventfd: int | None = None
        self._kept: dict[int, Any] = {}
        try:
            if not p.features & _IORING_FEAT_SINGLE_MMAP or not p.features & _IORING_FEAT_NODROP:
                raise RingUnavailable("this kernel's io_uring lacks SINGLE_MMAP/NODROP (needs Linux 5.5+)")
            sq_size = p.sq_array + p.sq_entries * 4
            cq_size = p.cq_cqes + p.cq_entries * _CQE.size
            ring = mmap.mmap(self.fd, max(sq_size, cq_size), offset=_IORING_OFF_SQ_RING)
            self._maps.append(ring)
            sqes = mmap.mmap(self.fd, p.sq_entries * _SQE.size, offset=_IORING_OFF_SQES)
            self._maps.append(sqes)
        except OSError as e:  # ENOMEM (a memory limit): no ring here, threads will do
            self.close()
            raise RingUnavailable(f"io_uring rings could not be mapped: {e}") from e
        except BaseException:
            self.close()
            raise
        #: whether IOSQE_CQE_SKIP_SUCCESS is honoured (else every entry posts a completion)
        self.cqe_skip = bool(p.features & _IORING_FEAT_CQE_SKIP)
        self._ring = memoryview(ring)
        self._sqes = memoryview(sqes)
        self.sq_entries = p.sq_entries
        self.cq_entries = p.cq_entries
        self._sq_flags_off = p.sq_flags
        #: times completions had to be fetched from the kernel's overflow list
        self.overflow_flushes = 0
        self._sq_mask: int = _U32.unpack_from(ring, p.sq_ring_mask)[0]
        self._sq_head_off, self._sq_tail_off, self._sq_array_off = p.sq_head, p.sq_tail, p.sq_array
        self._cq_mask: int = _U32.unpack_from(ring, p.cq_ring_mask)[0]
        self._cq_head_off, self._cq_tail_off, self._cqes_off = p.cq_head, p.cq_tail, p.cq_cqes
        self._sq_tail: int = _U32.unpack_from(ring, p.sq_tail)[0]
        self._sq_head: int = self._sq_tail  # last seen; re-read only when the queue looks full
        self._to_submit = 0
        self._supported: frozenset[int] | None = None
        self.files = files
        if files:
            try:
                reg = _RsrcRegister(nr=files, flags=_IORING_RSRC_REGISTER_SPARSE)
                _sys(_NR_REGISTER, self.fd, _IORING_REGISTER_FILES2, ctypes.byref(reg), ctypes.sizeof(reg))
            except OSError as e:
                self.close()
                raise RingUnavailable(f"registering {files} sparse files failed: {e} (needs Linux 5.19+)") from e

    # -- submission ------------------------------------------------------------------------
    @property
    def space(self) -> int:
        """Free submission slots (entries prepared but not yet submitted count as used)."""
        head: int = _U32.unpack_from(self._ring, self._sq_head_off)[0]
        return int(self.sq_entries) - ((self._sq_tail - head) & 0xFFFFFFFF)

    def _push(
        self,
        opcode: int,
        flags: int,
        fd: int,
        off: int,
        addr: int,
        length: int,
        op_flags: int,
        user_data: int,
        file_index: int = 0,
        addr3: int = 0,
    ) -> None:
        if (self._sq_tail - self._sq_head) & 0xFFFFFFFF >= self.sq_entries:
            self._sq_head = _U32.unpack_from(self._ring, self._sq_head_off)[0]  # the kernel moved on?
            if (self._sq_tail - self._sq_head) & 0xFFFFFFFF >= self.sq_entries:
                raise OSError(errno.EBUSY, "io_uring submission queue is full")
        if flags & IOSQE_CQE_SKIP_SUCCESS and opcode in _SKIP_UNSAFE:
            raise ValueError(f"io_uring opcode {opcode} may fail unseen with IOSQE_CQE_SKIP_SUCCESS; leave it off")
        if flags & IOSQE_CQE_SKIP_SUCCESS and not self.cqe_skip:
            flags &= ~IOSQE_CQE_SKIP_SUCCESS
        idx = self._sq_tail & self._sq_mask
        _SQE.pack_into(
            self._sqes,
            idx * 64,
            opcode,
            flags,
            0,
            fd,
            off,
            addr,
            length,
            op_flags,
            user_data,
            0,
            0,
            file_index,
            addr3,
            0,
        )
        _U32.pack_into(self._ring, self._sq_array_off + 4 * idx, idx)
        self._sq_tail = (self._sq_tail + 1) & 0xFFFFFFFF
        _U32.pack_into(self._ring, self._sq_tail_off, self._sq_tail)  # x86-64: stores stay in order
        self._to_submit += 1

    def supports(self, opcode: int) -> bool:
        """Whether this kernel's io_uring knows ``opcode`` (IORING_REGISTER_PROBE, Linux 5.6+)."""
        if self._supported is None:
            # struct io_uring_probe: last_op, ops_len, resv, resv2[3], then 256 x (op, resv, flags, resv2)
            buf = ctypes.create_string_buffer(16 + 256 * 8)
            try:
                _sys(_NR_REGISTER, self.fd, _IORING_REGISTER_PROBE, buf, 256)
            except OSError:
                self._supported = frozenset()
            else:
                raw = buf.raw
                ops = [struct.unpack_from("=BxH", raw, 16 + 8 * i) for i in range(raw[1])]  # (op, flags)
                self._supported = frozenset(op for op, flags in ops if flags & _IO_URING_OP_SUPPORTED)
        return opcode in self._supported

    def keep(self, user_data: int, obj: Any) -> None:
        """Hold ``obj`` (buffers, iovec arrays) until the completion for ``user_data`` is reaped."""
        self._kept[user_data] = obj

    def iovec(self, bufs: Sequence[memoryview]) -> tuple[int, int, Any]:
        """(address, count, keep-alive object) of an iovec array over ``bufs``."""
        return self.iovec_at([(buffer_address(b), b.nbytes) for b in bufs], bufs)

    @staticmethod
    def iovec_at(spans: Sequence[tuple[int, int]], owner: Any) -> tuple[int, int, Any]:
        """An iovec array over (address, length) ``spans`` of memory that ``owner`` keeps alive."""
        arr = (_Iovec * len(spans))(*(_Iovec(a, n) for a, n in spans))
        return ctypes.addressof(arr), len(spans), (arr, owner)

    def prep_openat(
        self,
        user_data: int,
        dfd: int,
        path: bytes,
        flags: int,
        mode: int = 0o644,
        *,
        slot: int | None = None,
        sqe_flags: int = 0,
    ) -> Any:
        """``openat``; into registered slot ``slot`` when given (then the result is 0, not an fd).

        Returns the path buffer: keep it referenced until :meth:`submit` returns.
        """
        buf = ctypes.create_string_buffer(path)
        self._push(
            OP_OPENAT,
            sqe_flags,
            dfd,
            0,
            ctypes.addressof(buf),
            mode,
            flags if slot is not None else flags | os.O_CLOEXEC,  # direct slots refuse O_CLOEXEC
            user_data,
            file_index=0 if slot is None else slot + 1,
        )
        return buf

    def prep_rw(
        self, user_data: int, write: bool, fd: int, iov: tuple[int, int, Any], offset: int, *, sqe_flags: int = 0
    ) -> None:
        """``writev``/``readv`` of an :meth:`iovec` at ``offset`` (``fd`` a slot with IOSQE_FIXED_FILE)."""
        self._push(OP_WRITEV if write else OP_READV, sqe_flags, fd, offset, iov[0], iov[1], 0, user_data)

    def prep_fsync(self, user_data: int, fd: int, *, datasync: bool = True, sqe_flags: int = 0) -> None:
        """``fdatasync``/``fsync``."""
        self._push(OP_FSYNC, sqe_flags, fd, 0, 0, 0, IORING_FSYNC_DATASYNC if datasync else 0, user_data)

    def prep_ftruncate(self, user_data: int, fd: int, length: int, *, sqe_flags: int = 0) -> None:
        """``ftruncate`` to ``length`` bytes (Linux 6.9+: check :meth:`supports`)."""
        self._push(OP_FTRUNCATE, sqe_flags, fd, length, 0, 0, 0, user_data)

    def prep_close(self, user_data: int, fd: int = 0, *, slot: int | None = None, sqe_flags: int = 0) -> None:
        """``close`` of a descriptor, or of registered slot ``slot``."""
        self._push(OP_CLOSE, sqe_flags, 0 if slot is not None else fd, 0, 0, 0, 0, user_data,
                   file_index=0 if slot is None else slot + 1)  # fmt: skip

    def prep_renameat(
        self, user_data: int, olddfd: int, old: bytes, newdfd: int, new: bytes, *, sqe_flags: int = 0
    ) -> Any:
        """``renameat``; returns the path buffers (keep them until :meth:`submit` returns)."""
        a, b = ctypes.create_string_buffer(old), ctypes.create_string_buffer(new)
        self._push(OP_RENAMEAT, sqe_flags, olddfd, ctypes.addressof(b), ctypes.addressof(a), newdfd, 0, user_data)
        return a, b

    def prep_linkat(
        self, user_data: int, olddfd: int, old: bytes, newdfd: int, new: bytes, flags: int = 0, *, sqe_flags: int = 0
    ) -> Any:
        """``linkat`` (``flags``: ``AT_SYMLINK_FOLLOW`` links what a ``/proc/self/fd/N`` names,
        an ``O_TMPFILE`` file say); returns the path buffers (keep them until :meth:`submit`
        returns)."""
        a, b = ctypes.create_string_buffer(old), ctypes.create_string_buffer(new)
        self._push(OP_LINKAT, sqe_flags, olddfd, ctypes.addressof(b), ctypes.addressof(a), newdfd, flags, user_data)
        return a, b

    def prep_unlinkat(self, user_data: int, dfd: int, path: bytes, *, sqe_flags: int = 0) -> Any:
        """``unlinkat``; returns the path buffer (keep it until :meth:`submit` returns)."""
        a = ctypes.create_string_buffer(path)
        self._push(OP_UNLINKAT, sqe_flags, dfd, 0, ctypes.addressof(a), 0, 0, user_data)
        return a

    def submit(self) -> int:
        """Hand prepared entries to the kernel; returns how many it took.

        Fewer than prepared when the kernel pushes back (EAGAIN, or EBUSY while completions
        wait to be reaped): reap, then call again; the rest stay queued. Other errors raise.
        """
        n = self._to_submit
        done = 0
        while done < n:
            try:
                got = _sys(_NR_ENTER, self.fd, ctypes.c_uint(n - done), ctypes.c_uint(0), ctypes.c_uint(0), None, 0)
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                self._to_submit -= done
                if e.errno in (errno.EAGAIN, errno.EBUSY):
                    return done
                raise
            done += got
        self._to_submit -= done
        return done

    @property
    def unsubmitted(self) -> int:
        """Entries prepared and not yet taken by the kernel."""
        return self._to_submit

    def mark(self) -> tuple[int, int]:
        """Where the queue ends now, for :meth:`roll_back`."""
        return self._sq_tail, self._to_submit

    def is_chain(self, mark: tuple[int, int], n: int) -> bool:
        """Whether exactly ``n`` entries were prepared since :meth:`mark` and the last of them
        is not linked (else the kernel links it to whatever entry is queued next, another
        caller's, and a failure here cancels that one without a completion)."""
        if (self._sq_tail - mark[0]) & 0xFFFFFFFF != n:
            return False
        last = (self._sq_tail - 1) & self._sq_mask
        return not self._sqes[last * 64 + 1] & (IOSQE_IO_LINK | IOSQE_IO_HARDLINK)

    def roll_back(self, mark: tuple[int, int]) -> None:
        """Take back the entries prepared since :meth:`mark` (none submitted since)."""
        self._sq_tail, self._to_submit = mark
        _U32.pack_into(self._ring, self._sq_tail_off, self._sq_tail)

    def discard_unsubmitted(self) -> int:
        """Take back the entries the kernel has not consumed (after a failed submit)."""
        n = self._to_submit
        if n:
            self._sq_tail = (self._sq_tail - n) & 0xFFFFFFFF
            _U32.pack_into(self._ring, self._sq_tail_off, self._sq_tail)
            self._to_submit = 0
        return n

    def wait(self, min_complete: int = 1) -> None:
        """Block until at least ``min_complete`` completions are ready (for tests and teardown)."""
        while True:
            try:
                _sys(_NR_ENTER, self.fd, ctypes.c_uint(0), ctypes.c_uint(min_complete),
                     ctypes.c_uint(_IORING_ENTER_GETEVENTS), None, 0)  # fmt: skip
                return
            except OSError as e:
                if e.errno != errno.EINTR:
                    raise

    # -- completion ------------------------------------------------------------------------
    def reap(self) -> list[tuple[int, int, Any]]:
        """Every ready completion as (user_data, result, what :meth:`keep` held for it)."""
        ring = self._ring
        head = _U32.unpack_from(ring, self._cq_head_off)[0]
        tail = _U32.unpack_from(ring, self._cq_tail_off)[0]
        out: list[tuple[int, int, Any]] = []
        kept = self._kept
        while head != tail:
            ud, res, _flags = _CQE.unpack_from(ring, self._cqes_off + (head & self._cq_mask) * 16)
            out.append((ud, res, kept.pop(ud, None)))
            head = (head + 1) & 0xFFFFFFFF
        if out:
            _U32.pack_into(ring, self._cq_head_off, head)
        if _U32.unpack_from(ring, self._sq_flags_off)[0] & _IORING_SQ_CQ_OVERFLOW:
            # the queue filled up before we reaped: the kernel holds the rest on a list and
            # (since 5.5, NODROP) moves them into the queue only on an enter that asks for
            # completions; until then it posts every new one there too. Nothing else would
            # fetch them: a waiter on the eventfd would wait forever.
            self.overflow_flushes += 1
            self.wait(0)
            out += self.reap()
        return out

    def set_max_workers(self, bounded: int, unbounded: int = 0) -> tuple[int, int]:
        """Cap (or raise) the kernel worker threads that run this ring's blocking requests.

        Opens, creates, renames and writes that allocate block go to ``io-wq`` workers; the
        kernel's default cap for file work is 4 per CPU, which on a small host is below the
        tier's depth. 0 leaves a limit as it is. Returns the previous limits.
        """
        vals = (ctypes.c_uint32 * 2)(bounded, unbounded)
        _sys(_NR_REGISTER, self.fd, _IORING_REGISTER_IOWQ_MAX_WORKERS, vals, 2)
        return int(vals[0]), int(vals[1])

    def register_eventfd(self) -> int:
        """An eventfd that becomes readable when completions arrive (for ``loop.add_reader``)."""
        if self.eventfd is None:
            efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            try:
                _sys(_NR_REGISTER, self.fd, _IORING_REGISTER_EVENTFD, ctypes.byref(ctypes.c_int(efd)), 1)
            except OSError:
                os.close(efd)
                raise
            self.eventfd = efd
        return self.eventfd

    def close(self) -> None:
        """Tear the ring down (idempotent). In-flight requests are cancelled by the kernel."""
        for v in ("_ring", "_sqes"):
            mv = getattr(self, v, None)
            if mv is not None:
                mv.release()
                setattr(self, v, None)
        for m in self._maps:
            m.close()
        self._maps = []
        if self.eventfd is not None:
            os.close(self.eventfd)
            self.eventfd = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        self._kept.clear()


class _Chain:
    """One chain in flight: its results by stage, whether it is over, who waits."""

    __slots__ = ("done", "ends", "error", "keep", "over", "results")

    def __init__(self, n: int, done: Any, keep: Any) -> None:
        self.results: list[int | None] = [None] * n
        self.over = False  # set when the last entry completes (or the chain never started)
        self.done = done
        self.keep = keep  # buffers and iovecs the kernel points at
        self.ends: frozenset[int] = frozenset()  # stages whose report ends the chain
        self.error: OSError | None = None


class LoopRing:
    """A :class:`Ring` served by the running event loop: a chain of entries is one awaitable.

    :meth:`run` takes a function that prepares ``n`` linked entries (``user_data`` base given)
    and resolves with their ``n`` results once every one has completed. Entries prepared in
    one loop iteration go to the kernel in one ``io_uring_enter`` at its end, or, with
    ``eager_submit``, each chain in its own ``io_uring_enter`` as soon as it is prepared: the
    chain then does not wait behind the iteration's other callbacks (a few chunks' worth of
    Python each), at one system call per chain; one call for many entries lets the block
    layer merge adjacent requests, so batching suits a tier whose chunks sit side by side
    (a slab) and eager submission one whose chunks are separate files. ``files``
    direct-descriptor slots are handed out with :meth:`take_slot`/:meth:`put_slot`.
    ``kernel_workers`` caps the kernel threads that run this ring's blocking requests
    (default: one per CPU; 0 leaves the kernel's default, 4 per CPU). The kernel keeps one
    pool of them per thread, so the cap holds for every ring the event-loop thread uses.
    """

    _STAGES = 16  # user_data = chain id * 16 + stage: a chain has at most 16 entries

    def __init__(
        self,
        entries: int,
        files: int = 0,
        *,
        wake_batch: int = 4,
        kernel_workers: int | None = None,
        eager_submit: bool = False,
    ) -> None:
        import asyncio  # kept out of the module import: the Ring is usable without a loop

        self._asyncio = asyncio
        self.ring = Ring(entries, files)
        self._loop = asyncio.get_running_loop()
        self._free_slots = list(range(files - 1, -1, -1))
        self._chains: dict[int, _Chain] = {}
        self._seq = 1
        self._unsubmitted: collections.deque[int] = collections.deque()  # chains prepared, not yet taken
        self._finished: collections.deque[_Chain] = collections.deque()  # complete, waiter not yet woken
        self._wake_scheduled = False
        #: waiters woken per loop iteration (bounds the loop time one iteration spends on chunks)
        self.wake_batch = wake_batch
        self._flush_scheduled = False
        self._eager = eager_submit
        self._closed = False
        try:
            # The kernel's io-wq workers run what cannot complete inline (opens, renames,
            # writes that allocate) and compete with this thread for the CPUs: on 2 cores, 16
            # of them doing ext4 metadata work held the loop's p99 lag at 10-24 ms, 2 at
            # 1.3-6 ms for the same throughput (bench_loop_lag.py runs, bench/README.md;
            # 3 or 4 workers: 7-17 ms). The price: ext4
            # makes an O_DIRECT write that extends its file wait in its worker, so at most one
            # such write per CPU is in flight. (Sizing files with fallocate first freed the
            # workers but cost throughput and lag on the bench disk.)
            workers = kernel_workers if kernel_workers is not None else os.cpu_count() or 1
            if workers > 0:
                self.ring.set_max_workers(workers)
            self._efd = self.ring.register_eventfd()
            self._loop.add_reader(self._efd, self._on_ready)
        except BaseException:
            self.ring.close()
            raise

    @property
    def in_flight(self) -> int:
        """Chains submitted and not yet complete."""
        return len(self._chains)

    def take_slot(self) -> int:
        """A free direct-descriptor slot (the caller's bound keeps one available)."""
        if not self._free_slots:
            raise OSError(errno.EBUSY, "no free io_uring file slot")
        return self._free_slots.pop()

    def put_slot(self, slot: int) -> None:
        """Give a slot back (its file must be closed)."""
        self._free_slots.append(slot)

    async def run(self, n: int, prep: Any, keep: Any = None, *, ends_on_report: Sequence[int] = ()) -> list[int | None]:
        """Prepare a chain of ``n`` entries with ``prep(ring, user_data_base)``; wait for it.

        The entries must form one link chain (every entry but the last flagged
        ``IOSQE_IO_LINK`` or ``IOSQE_IO_HARDLINK``): the chain is complete when its last entry
        completes, and the kernel runs (or cancels) linked entries in order. Entries other than
        the last may carry ``IOSQE_CQE_SKIP_SUCCESS`` to save a wake-up each (not unlinkat,
        renameat, linkat or ftruncate, whose failures the kernel then hides and does not
        stop the chain for); their result is then None when they succeeded. Such an entry
        on a plain (not hard) link reports
        only a failure, and its failure cancels the rest of the chain *without* completion
        entries: name those stages in ``ends_on_report`` so that their report ends the chain
        (the stages after it then read ``-ECANCELED``). Returns the results by stage.

        ``prep`` returns path buffers to hold until submission; ``keep`` (buffers, iovecs)
        is held until completion. If the waiting task is cancelled, the kernel may still be
        using the buffers: the chain is waited for, then CancelledError is raised.
        """
        if self._closed:
            raise OSError(errno.EBADF, "io_uring ring is closed")
        if not 0 < n <= self._STAGES:
            raise ValueError(f"a chain has 1..{self._STAGES} entries; got {n}")
        for _ in range(1000):  # room for the whole chain first: never a chain half in the queue
            if self.ring.space >= n:
                break
            self._flush()
            if self.ring.space >= n:
                break
            await self._asyncio.sleep(0)  # the kernel pushed back: let completions be reaped
        else:
            raise OSError(errno.EBUSY, "io_uring submission queue stays full")
        cid = self._seq
        self._seq += 1
        mark = self.ring.mark()
        try:
            paths = prep(self.ring, cid * self._STAGES)  # the kernel copies them when it takes the entries
            if not self.ring.is_chain(mark, n):
                raise ValueError(f"a chain must be {n} entries, each linked to the next but the last")
        except BaseException:
            self.ring.roll_back(mark)  # no entry of a chain nobody waits for may reach the kernel
            raise
        chain = _Chain(n, self._loop.create_future(), (keep, paths))
        if self.ring.cqe_skip and ends_on_report:
            chain.ends = frozenset(ends_on_report)
        self._chains[cid] = chain
        self._unsubmitted.append(cid)
        if not self._flush_scheduled:  # else a flush is due next iteration (batching, or pushed back)
            if self._eager:
                self._flush()
            else:
                self._flush_scheduled = True
                self._loop.call_soon(self._flush)
        cancelled = False
        while True:
            try:
                await chain.done
                break
            except self._asyncio.CancelledError:
                # the kernel owns the buffers until the chain completes: wait on, then raise
                cancelled = True
                if chain.over:
                    break
                if chain.done.done() and not chain.done.cancelled():
                    break
                chain.done = self._loop.create_future()
        if chain.error is not None:
            raise chain.error
        if cancelled:
            raise self._asyncio.CancelledError()
        return chain.results

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._closed:
            return
        try:
            took = self.ring.submit()
        except OSError as e:
            # a broken ring (not back-pressure): the chains the kernel never saw fail
            self.ring.discard_unsubmitted()
            err = OSError(e.errno, f"io_uring submit failed: {e.strerror}")
            for cid in self._unsubmitted:
                chain = self._chains.pop(cid, None)
                if chain is not None:
                    chain.error, chain.over, chain.keep = err, True, None
                    if not chain.done.done():
                        chain.done.set_result(None)
            self._unsubmitted.clear()
            return
        left = self.ring.unsubmitted
        if not left:
            self._unsubmitted.clear()
            return
        # back-pressure: reap what is done, then try the rest on the next turn of the loop
        while took > 0 and self._unsubmitted:
            cid = self._unsubmitted[0]
            chain = self._chains.get(cid)
            size = len(chain.results) if chain is not None else 0
            if size > took:
                break
            took -= size
            self._unsubmitted.popleft()
        self._on_ready()
        self._flush_scheduled = True
        self._loop.call_soon(self._flush)

    def _on_ready(self) -> None:
        try:
            os.read(self._efd, 8)
        except BlockingIOError:
            pass
        chains = self._chains
        for ud, res, _ in self.ring.reap():
            cid, stage = divmod(ud, self._STAGES)
            chain = chains.get(cid)
            if chain is None:
                continue
            chain.results[stage] = res
            last = len(chain.results) - 1
            if stage in chain.ends and stage < last:
                # a skip-on-success entry failed: the kernel cancelled the rest without reports
                for j in range(stage + 1, last + 1):
                    if chain.results[j] is None:
                        chain.results[j] = -errno.ECANCELED
                stage = last
            if stage == last:
                chain.over = True
                del chains[cid]
                chain.keep = None
                self._finished.append(chain)
        if not self._wake_scheduled:
            self._wake_some()

    def _wake_some(self) -> None:
        """Hand finished chains to their waiters, at most ``wake_batch`` per loop iteration.

        Each waiter goes on to do a chunk's worth of Python (verify, account, prepare the
        next chain); waking all of a big batch at once would hold the loop for all of it.
        The rest wait one iteration, after timers and other callbacks have had their turn.
        """
        self._wake_scheduled = False
        finished = self._finished
        for _ in range(min(self.wake_batch, len(finished))):
            chain = finished.popleft()
            if not chain.done.done():
                chain.done.set_result(None)
        if finished and not self._wake_scheduled:
            self._wake_scheduled = True
            self._loop.call_soon(self._wake_some)

    def abandon(self) -> None:
        """Tear the ring down without waiting, from any thread: for the finalizer of an owner
        dropped without :meth:`aclose`. With chains in flight it stays open (the kernel may
        still write their buffers: a leak, not a corruption)."""
        if self._closed or self._chains:
            return
        if self._loop.is_closed():  # its selector is gone, and with it the reader
            self._closed = True
            self.ring.close()
            return
        try:
            self._loop.call_soon_threadsafe(self._abandon_on_loop)
        except RuntimeError:  # closed meanwhile
            pass

    def _abandon_on_loop(self) -> None:
        if self._closed or self._chains or self._finished:
            return
        self._closed = True
        self._loop.remove_reader(self._efd)
        self.ring.close()

    async def aclose(self) -> None:
        """Wait for chains in flight, then tear the ring down (idempotent)."""
        if self._closed:
            return
        while self._chains or self._finished:
            if self._finished:
                await self._asyncio.sleep(0)  # let _wake_some hand them over
                continue
            await self._asyncio.wait([next(iter(self._chains.values())).done])
        self._closed = True
        self._loop.remove_reader(self._efd)
        self.ring.close()
