"""The nvme tier's files in their directories: made with the configured modes, never opened
through a symbolic link, and only in directories others cannot write into (docs/security.md).

The index directory (checkpoint and journal) is opened once; every file in it is opened
relative to that descriptor with ``O_NOFOLLOW``, new files with ``O_EXCL``, the checkpoint's
temporary under an unguessable name.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path

from asynctier import TierConfigError
from asynctier.core.validation import check_private_dir, make_dirs

__all__ = ["IndexDir", "check_opened_slab", "create_slab", "open_dir", "slab_kind"]

_O_DIRECTORY: int = getattr(os, "O_DIRECTORY", 0)
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: the name part that marks a checkpoint's temporary (followed by a random part)
TEMP_MARK = ".tmp."


def open_dir(path: Path, mode: int, name: str) -> tuple[int, bool]:
    """Open the directory ``path`` (made with ``mode``, and any missing parents, if it is not
    there): (its descriptor, whether this call made it). A directory others may write into
    is refused. ``path`` itself may be a link: it is the user's name for the directory."""
    made = make_dirs(path, mode, "nvme tier", name)  # exactly ``mode``, whatever the umask
    fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | os.O_CLOEXEC)
    try:
        check_private_dir(fd, path, "nvme tier")
    except BaseException:
        os.close(fd)
        raise
    return fd, made


def slab_kind(p: Path, dir_mode: int, *, create: bool = True) -> str:
    """What is at the slab path ``p``: ``"new"`` (nothing: a file to create), ``"file"``, or
    ``"device"`` (a block device, or a link to one: the names under /dev/disk/ are links).

    The slab's directory is made if missing (with ``dir_mode``; not without ``create``) and
    must not be writable by others. A link to anything but a block device, and anything but
    a regular file or a block device, is refused: the tier writes into what it opens.
    """
    if create or p.parent.is_dir():
        fd, _ = open_dir(p.parent, dir_mode, "the slab's directory")
        os.close(fd)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return "new"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.stat(p)
        except FileNotFoundError:
            target = st
        if stat.S_ISBLK(target.st_mode):
            return "device"
        raise TierConfigError(
            f"nvme tier: {p} is a symbolic link; a slab file is never opened through a link (only a link to a "
            "block device is followed): give the path of the file itself"
        )
    if stat.S_ISBLK(st.st_mode):
        return "device"
    if stat.S_ISREG(st.st_mode):
        return "file"
    raise TierConfigError(
        f"nvme tier: {p} is neither a regular file nor a block device (mode {stat.filemode(st.st_mode)}); "
        "give the path of a slab file (created if missing) or of a block device"
    )


def create_slab(p: Path, mode: int) -> None:
    """Create the new slab file ``p`` with exactly ``mode`` (empty; not through a link, and
    not over a file that appeared meanwhile)."""
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def check_opened_slab(fd: int, p: Path, kind: str) -> None:
    """After opening slab ``p``: it is still what :func:`slab_kind` found (a regular file, or a
    block device), not something swapped in since."""
    st = os.fstat(fd)
    ok = stat.S_ISBLK(st.st_mode) if kind == "device" else stat.S_ISREG(st.st_mode)
    if not ok:
        raise TierConfigError(f"nvme tier: {p} changed while being opened (now mode {stat.filemode(st.st_mode)})")


def not_regular(path: Path, st: os.stat_result) -> TierConfigError:
    """The error for something other than a regular file where the tier keeps a file."""
    return TierConfigError(
        f"nvme tier: {path} is not a regular file (mode {stat.filemode(st.st_mode)}); the tier opens no link, "
        "FIFO, directory or device in its index directory: remove it or use another index_dir"
    )


class IndexDir:
    """The directory of the checkpoint and the journal generations, held open."""

    def __init__(self, path: Path, file_mode: int, dir_mode: int, name: str = "index_dir") -> None:
        self.path = path
        self.name = name  # what the user called it, in errors
        self.file_mode = file_mode
        self.dir_mode = dir_mode
        self.fd = -1
        #: this open made the directory (a failed open removes it again if empty)
        self.made = False

    def open(self) -> None:
        self.fd, self.made = open_dir(self.path, self.dir_mode, self.name)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def undo(self) -> None:
        """After a failed open: close, and remove the directory if this open made it and it is empty."""
        self.close()
        if self.made:
            try:
                os.rmdir(self.path)
            except OSError:
                pass  # not empty, or gone: the open's own error is the one to report

    def names(self) -> list[str]:
        return os.listdir(self.fd)

    def read(self, name: str) -> bytes | None:
        """The bytes of file ``name`` (None if there is none); refuses a link or a non-regular file."""
        try:
            fd = os.open(name, _READ, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno == errno.ELOOP:  # O_NOFOLLOW met a link
                raise not_regular(self.path / name, os.stat(name, dir_fd=self.fd, follow_symlinks=False)) from None
            raise
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise not_regular(self.path / name, st)
            return f.read()

    def create(self, name: str) -> int:
        """A new file ``name`` for writing, with the file mode; whatever had the name goes first
        (a leftover of an earlier run: not a link's target, never a directory)."""
        self.unlink(name)
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, self.file_mode,
                     dir_fd=self.fd)  # fmt: skip
        try:
            os.fchmod(fd, self.file_mode)  # exactly the mode, whatever the umask
        except BaseException:
            os.close(fd)
            raise
        return fd

    def open_existing(self, name: str, flags: int) -> int:
        """Open the existing regular file ``name`` (not through a link)."""
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise not_regular(self.path / name, st)
        return fd

    def temp_name(self, name: str) -> str:
        """An unguessable temporary name for a new version of ``name``."""
        return f"{name}{TEMP_MARK}{secrets.token_hex(8)}"

    def unlink(self, name: str) -> bool:
        """Remove ``name`` (a link itself, never its target); False if it was not there."""
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        return True

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def sync(self) -> None:
        """Make the names made or removed in the directory durable."""
        os.fsync(self.fd)
