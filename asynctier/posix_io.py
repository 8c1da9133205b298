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
import logging
import mmap
import os
import stat
import struct
import sys

__all__ = [
    "O_DIRECT",
    "O_NOATIME",
    "aligned_buffer",
    "buffer_address",
    "direct_io_ok",
    "fsync_dir",
    "libc",
    "logical_block_size",
    "memory_fs",
    "network_fs",
    "pread_into",
    "pwrite_all",
    "spread_subdirs",
]

log = logging.getLogger("asynctier")

#: ``os.O_DIRECT`` where the platform has it, else 0 (direct I/O then never applies).
O_DIRECT: int = getattr(os, "O_DIRECT", 0)
#: ``os.O_NOATIME`` where the platform has it, else 0: reads that leave the access time (and
#: so the inode) alone. Only the file's owner or CAP_FOWNER may ask: others get EPERM.
O_NOATIME: int = getattr(os, "O_NOATIME", 0)


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


#: statfs(2) ``f_type`` of file systems whose locks (and metadata) go over the network
_NETWORK_FS_MAGIC = {
    0x6969: "nfs",
    0x517B: "smb",
    0xFF534D42: "cifs",
    0xFE534D42: "smb2",
    0x0BD00BD0: "lustre",
    0x00C36400: "ceph",
    0x47504653: "gpfs",
    0x65735546: "fuse",
    0x5346414F: "afs",
    0x01021997: "9p",
    0x7461636F: "ocfs2",
    0x01161970: "gfs2",
    0x19830326: "beegfs",
    0x73757245: "coda",
}


#: statfs(2) ``f_type`` of file systems held in memory: their reads and writes are copies on
#: the CPU, O_DIRECT or not (tmpfs accepts O_DIRECT since Linux 6.6)
_MEMORY_FS_MAGIC = {0x01021994: "tmpfs", 0x858458F6: "ramfs", 0x958458F6: "hugetlbfs"}


_LIBC: ctypes.CDLL | None = None


def libc() -> ctypes.CDLL:
    """The C library this process runs on (errno kept for :func:`ctypes.get_errno`), loaded
    once: for the system calls :mod:`os` does not wrap (statfs, madvise with new advice)."""
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _fs_magic(path: str | os.PathLike[str]) -> int | None:
    """statfs(2) ``f_type`` of the file system holding ``path``; None where it cannot be told
    (64-bit Linux only)."""
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_long) != 8:
        return None
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes; f_type comes first
    if libc().statfs(os.fsencode(path), buf) != 0:
        return None
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def network_fs(path: str | os.PathLike[str]) -> str | None:
    """The name of the network (or FUSE) file system holding ``path``, None for a local one
    or where it cannot be told (statfs(2) on 64-bit Linux only).

    Tiers use it to keep calls that may wait on a server (locks, for one) off the event loop.
    """
    magic = _fs_magic(path)
    return None if magic is None else _NETWORK_FS_MAGIC.get(magic)


def memory_fs(path: str | os.PathLike[str]) -> str | None:
    """The name of the in-memory file system (tmpfs, ramfs, hugetlbfs) holding the regular
    file or directory ``path``, else None (a device node's is its /dev's, not the device's:
    ask only for files)."""
    magic = _fs_magic(path)
    return None if magic is None else _MEMORY_FS_MAGIC.get(magic)


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


# chattr's +T ("top of directory hierarchies"), <linux/fs.h>: ext2/3/4 place the directories
# made in one so flagged apart, over the block groups, as they place the file system's top ones
_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS, _FS_TOPDIR_FL = 0x80086601, 0x40086602, 0x00020000


def spread_subdirs(directory: int | str | os.PathLike[str]) -> bool:
    """Have the file system place the directories made in ``directory`` (a descriptor, or a
    path, followed through symbolic links: the caller's own directory) apart (ext2/3/4's
    ``FS_TOPDIR_FL``, ``chattr +T``); whether it took the flag (other file systems refuse it).

    Why: ext4 puts a new file in its directory's block group, and without a journal it skips
    every inode of that group freed in the last minute (more while its inode table block is
    not yet written back), one by one, on each create.
    Files spread over many groups meet few of those; all in one or two groups, right after
    files were deleted there, each create meets them all (the fs tier's shards, and the
    figures: docs/tiers/fs.md, "Where the shards live")."""
    import fcntl  # (POSIX; imported here: this module is imported everywhere)

    if not isinstance(directory, int):
        try:
            fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_CLOEXEC)
        except OSError as e:
            log.debug("cannot open %s to place the directories made in it apart: %r", directory, e)
            return False
        try:
            return spread_subdirs(fd)
        finally:
            os.close(fd)
    dfd = directory
    try:
        # (the kernel reads and writes an int, whatever the ioctl's number says)
        (flags,) = struct.unpack("i", fcntl.ioctl(dfd, _FS_IOC_GETFLAGS, struct.pack("i", 0)))
        if not flags & _FS_TOPDIR_FL:
            fcntl.ioctl(dfd, _FS_IOC_SETFLAGS, struct.pack("i", flags | _FS_TOPDIR_FL))
    except OSError as e:
        if e.errno not in (errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM, errno.EACCES):
            log.debug("cannot flag a directory to place the ones made in it apart: %r", e)
        return False
    return True
