"""Blocking POSIX I/O primitives shared by the file-backed tiers (fs, nvme).

All of them move bytes straight between a file and a memoryview slice with
``os.preadv``/``os.pwritev`` (the GIL is released during the system call), loop on short
transfers, and never copy in Python. O_DIRECT needs both the buffer address and the length
aligned to the medium's logical block: :func:`direct_io_ok` says when it is, and
:func:`aligned_buffer` makes page-aligned memory for bounce buffers.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import stat

__all__ = [
    "O_DIRECT",
    "aligned_buffer",
    "buffer_address",
    "direct_io_ok",
    "fsync_dir",
    "logical_block_size",
    "pread_into",
    "pwrite_all",
]

#: ``os.O_DIRECT`` where the platform has it, else 0 (direct I/O then never applies).
O_DIRECT: int = getattr(os, "O_DIRECT", 0)


class _PyBuffer(ctypes.Structure):
    _fields_ = [  # the C layout of Py_buffer
        ("buf", ctypes.c_void_p),
        ("obj", ctypes.c_void_p),
        ("len", ctypes.c_ssize_t),
        ("itemsize", ctypes.c_ssize_t),
        ("readonly", ctypes.c_int),
        ("ndim", ctypes.c_int),
        ("format", ctypes.c_char_p),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("suboffsets", ctypes.c_void_p),
        ("internal", ctypes.c_void_p),
    ]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def buffer_address(view: memoryview) -> int:
    """The address of the first byte of a contiguous view, read-only or not (no copy)."""
    pb = _PyBuffer()
    if _get_buffer(view, ctypes.byref(pb), 0) != 0:  # PyBUF_SIMPLE
        raise TypeError("cannot get the address of this buffer")
    try:
        return int(pb.buf or 0)
    finally:
        _release_buffer(ctypes.byref(pb))


def aligned_buffer(nbytes: int) -> memoryview:
    """Page-aligned, zeroed, writable memory of ``nbytes`` (anonymous mmap)."""
    return memoryview(mmap.mmap(-1, max(nbytes, 1)))[:nbytes]


def direct_io_ok(view: memoryview, offset: int, block: int) -> bool:
    """True when ``view`` (address and length) and ``offset`` are all multiples of ``block``."""
    if not O_DIRECT or view.nbytes % block or offset % block:
        return False
    addr = buffer_address(view)
    return addr != 0 and addr % block == 0


def logical_block_size(path: str | os.PathLike[str]) -> int:
    """The logical block size O_DIRECT needs for files at ``path`` (a file, directory or device).

    For a block device it asks the kernel (BLKSSZGET); for files it uses the file system's
    preferred block size, which is a multiple of the logical block size.
    """
    st = os.stat(path)
    if stat.S_ISBLK(st.st_mode):
        import fcntl

        blkssz = 0x1268  # BLKSSZGET
        fd = os.open(path, os.O_RDONLY)
        try:
            buf = bytearray(4)
            fcntl.ioctl(fd, blkssz, buf)
            return int.from_bytes(buf, "little") or 512
        finally:
            os.close(fd)
    return max(512, os.statvfs(path).f_bsize)


def pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    """Write all of ``view`` at ``offset``, looping on short writes."""
    done = 0
    total = view.nbytes
    while done < total:
        n = os.pwritev(fd, [view[done:]], offset + done)
        if n <= 0:
            raise OSError(errno.EIO, f"pwritev wrote {n} bytes at offset {offset + done}")
        done += n


def pread_into(fd: int, view: memoryview, offset: int) -> int:
    """Read into all of ``view`` from ``offset``, looping on short reads; return bytes read.

    Fewer than ``len(view)`` bytes means end of file.
    """
    done = 0
    total = view.nbytes
    while done < total:
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            break
        done += n
    return done


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so a rename or create inside it is durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
