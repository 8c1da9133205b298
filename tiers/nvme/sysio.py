"""The nvme tier's system calls that must move every byte: loops on short transfers, and
opening a slab without access-time updates."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from asynctier.posix_io import O_NOATIME

__all__ = ["open_noatime", "preadv_all", "pwritev_all", "write_all"]


def open_noatime(p: Path, flags: int) -> int:
    """``os.open`` with O_NOATIME where the process may ask it (it owns the slab, or has
    CAP_FOWNER): a load then never dirties the slab's inode (relatime would, on the first
    read after each write), which costs a journal handle inside the read."""
    if O_NOATIME:
        try:
            return os.open(p, flags | O_NOATIME, 0o600)
        except OSError as e:
            if e.errno != errno.EPERM:
                raise
            # another user's slab (or device node): plain reads
    return os.open(p, flags, 0o600)


def write_all(fd: int, view: memoryview) -> None:
    """Append all of ``view`` at ``fd``'s position (journal and checkpoint files)."""
    while view.nbytes:
        n = os.write(fd, view)
        view = view[n:]


def pwritev_all(fd: int, bufs: list[memoryview], offset: int) -> None:
    """Write ``bufs`` back to back at ``offset``: one ``pwritev``, finished buffer by buffer
    after a short write (rare)."""
    total = sum(b.nbytes for b in bufs)
    n = os.pwritev(fd, bufs, offset)
    if n == total:
        return
    done = n
    pos = 0
    for b in bufs:
        if done >= b.nbytes:
            done -= b.nbytes
            pos += b.nbytes
            continue
        rest = b[done:]
        while rest.nbytes:
            m = os.pwrite(fd, rest, offset + pos + done)
            if m <= 0:
                raise OSError(errno.EIO, f"pwrite wrote {m} bytes at offset {offset + pos + done}")
            rest = rest[m:]
            done += m
        pos += b.nbytes
        done = 0


def preadv_all(fd: int, bufs: list[memoryview], offset: int) -> int:
    """Read into ``bufs`` back to back from ``offset``; the bytes read (fewer only at the end
    of the file)."""
    total = sum(b.nbytes for b in bufs)
    n = os.preadv(fd, bufs, offset)
    if n == total or n == 0:
        return n
    got = n
    pos = 0
    for b in bufs:
        if got >= pos + b.nbytes:
            pos += b.nbytes
            continue
        rest = b[got - pos :] if got > pos else b
        while rest.nbytes:
            m = os.preadv(fd, [rest], offset + got)
            if m == 0:
                return got
            rest = rest[m:]
            got += m
        pos += b.nbytes
    return got
