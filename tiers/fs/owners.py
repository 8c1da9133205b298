"""The namespace's ownership lock: who else may be reading its files.

Every open tier holds a shared lock on ``<namespace>/.owners`` (an open file description
lock: each tier's is its own, also within one process, and closing another descriptor does
not drop it). A tier may overwrite an evicted file in place only when no one else holds
that lock *after* the file left its name: then no one else can have it open, nor open it
later.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import struct
from pathlib import Path

from asynctier.core.backend import lock_held_by

__all__ = ["OWNERS", "alone", "hold_namespace"]

log = logging.getLogger(__name__)

#: The lock file in the namespace directory.
OWNERS = ".owners"

_F_OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)
_F_OFD_GETLK: int | None = getattr(fcntl, "F_OFD_GETLK", None)
_FLOCK = "=hh4xqqi4x"  # struct flock on 64-bit Linux: type, whence, start, len, pid
_HOLD = struct.pack(_FLOCK, fcntl.F_RDLCK, os.SEEK_SET, 0, 1, 0)
_ANYONE_ELSE = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0)


def hold_namespace(dfd: int, directory: Path, mode: int = 0o600, fix: bool = False) -> int:
    """Take a shared lock on ``.owners`` in the namespace directory ``dfd`` (``directory``,
    for messages); returns its descriptor (the lock lasts as long as it is open), or -1 where
    no such lock can be held (then nothing is recycled). A link at the name is not followed
    (nor created through, dangling): no lock then."""
    if _F_OFD_SETLK is None or struct.calcsize("P") != 8:
        return -1
    path = directory / OWNERS
    fd = -1
    # made with O_EXCL first: the mode is set only on a file this tier made
    for flags in (os.O_RDWR | os.O_CREAT | os.O_EXCL, os.O_RDWR, os.O_RDONLY):  # read-only root: if it exists
        try:
            fd = os.open(OWNERS, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=dfd)
        except OSError:
            continue
        if flags & os.O_EXCL and fix:
            os.fchmod(fd, mode)
        break
    if fd < 0:
        return -1
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return -1
    try:
        fcntl.fcntl(fd, _F_OFD_SETLK, _HOLD)
    except OSError as e:  # no locks here (some network file systems)
        log.info("fs tier %s: cannot lock %s (%r); evicted files are deleted, not recycled", directory, path, e)
        os.close(fd)
        return -1
    lock_held_by(fd)
    return fd


def alone(lock_fd: int) -> bool:
    """Whether no other open tier, in this process or another, holds the lock that
    ``lock_fd`` (from :func:`hold_namespace`) holds. On a network file system this is a
    round trip to the server."""
    if _F_OFD_GETLK is None or lock_fd < 0:
        return False
    try:
        got = fcntl.fcntl(lock_fd, _F_OFD_GETLK, _ANYONE_ELSE)
    except OSError:
        return False
    return bool(struct.unpack(_FLOCK, got)[0] == fcntl.F_UNLCK)
