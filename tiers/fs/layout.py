"""Where chunks live on disk: the namespace directory, its shards, and names from keys.

The format is described in docs/tiers/fs.md; the constants here are part of it.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import logging
import os
import re
import secrets
import time
from pathlib import Path

import xxhash

from asynctier.integrity import key_token
from asynctier.posix_io import spread_subdirs
from asynctier.spec import FORMAT_VERSION, OffloadingSpec

__all__ = [
    "HEADER_BLOCK",
    "LAYOUT_NOTE",
    "N_SHARDS",
    "TMP_PREFIX",
    "TempNames",
    "is_hashed_token",
    "namespace_dir",
    "open_subdir",
    "shard_of",
    "token_key",
    "write_layout_note",
]

log = logging.getLogger(__name__)

#: Bytes reserved in front of the payload for the header; the payload starts block-aligned.
HEADER_BLOCK = 4096
#: Shard directories per namespace (part of the on-disk format).
N_SHARDS = 256
#: Names of files being written (or taken over by an eviction) start with this.
TMP_PREFIX = ".tmp~"
#: What the namespace's digest stands for, for people.
LAYOUT_NOTE = "LAYOUT"

_HASHED_TOKEN = re.compile(r"h[0-9a-f]{64}")
_SAFE_HOST = re.compile(r"[^A-Za-z0-9.-]")
_instance_seq = itertools.count()


def namespace_dir(root: Path, spec: OffloadingSpec) -> Path:
    """``ROOT/v<format>-<layout id>``: one directory per namespace, chunk size and format."""
    return root / f"v{FORMAT_VERSION}-{spec.layout_id}"


def shard_of(key: bytes) -> int:
    """The shard directory (``00`` .. ``ff``) a key's file lives in."""
    return xxhash.xxh3_64_intdigest(key) & (N_SHARDS - 1)


def name_of(key: bytes) -> tuple[int, bytes]:
    """(shard, file name as ASCII bytes) of ``key``'s chunk: what a native job descriptor takes.
    The reference of ``asynctier._speedups.name_of`` (keys of up to 96 bytes)."""
    return shard_of(key), key_token(key).encode()


def is_hashed_token(name: str) -> bool:
    """Whether ``name`` is the hashed token of a long key (its key is in the file's header)."""
    return _HASHED_TOKEN.fullmatch(name) is not None


def token_key(name: str) -> bytes | None:
    """The key a base32 file name stands for; None for hashed tokens and foreign names."""
    if not name or len(name) > 160 or is_hashed_token(name):
        return None
    try:
        key = base64.b32decode(name.upper() + "=" * (-len(name) % 8))
    except (binascii.Error, ValueError):
        return None
    return key if key and key_token(key) == name else None


class TempNames:
    """Unique temporary names of one tier: ``.tmp~<host>~<pid>~<tier>~<n>``.

    The host and process in the name let the scan at ``open()`` tell a dead writer's file
    (removed at once) from a live one's (kept until ``stale_tmp_s``).
    """

    def __init__(self) -> None:
        self.host = _SAFE_HOST.sub("_", os.uname().nodename)[:64] or "host"
        # the random part makes the names unguessable: none can be planted ahead (a link
        # there would make a store fail, O_EXCL, not write through it)
        self.tag = f"{TMP_PREFIX}{self.host}~{os.getpid()}~{next(_instance_seq)}{secrets.token_hex(4)}~"
        self._seq = itertools.count()
        self._prefixed = self.tag.__add__

    def next(self) -> str:
        """A name no other writer uses."""
        return f"{self.tag}{next(self._seq)}"

    def next_many(self, n: int) -> list[str]:
        """:meth:`next` ``n`` times."""
        # (no Python step per name: a group of stores takes one for each of its chunks; and
        # no str.format, which parses its template each time)
        return list(map(self._prefixed, map(str, itertools.islice(self._seq, n))))

    def is_stale(self, name: str, mtime: float, stale_s: float, now: float | None = None) -> bool:
        """Whether the temporary file ``name`` is debris: older than ``stale_s``, or of a
        process on this host that is gone."""
        if (time.time() if now is None else now) - mtime > stale_s:
            return True
        parts = name[len(TMP_PREFIX) :].split("~")
        if len(parts) >= 2 and parts[0] == self.host and parts[1].isdigit():
            pid = int(parts[1])
            if pid == os.getpid():
                return False  # another tier of this process may be writing it
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
        return False


def current_umask() -> int:
    """The process's umask, read without changing it (Linux); 0o022 where it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def set_mode(fd: int, mode: int, fix: bool) -> None:
    """After creating ``fd`` with ``mode``: set it exactly where the umask stripped bits."""
    if fix:
        os.fchmod(fd, mode)


def write_layout_note(dfd: int, spec: OffloadingSpec, mode: int = 0o600, fix: bool = False) -> None:
    """Write ``LAYOUT`` (once) in the namespace directory ``dfd``: what its digest stands for.

    Through a temporary of an unguessable name made with ``O_EXCL | O_NOFOLLOW``: nothing
    planted in the directory beforehand can redirect the write."""
    try:
        os.stat(LAYOUT_NOTE, dir_fd=dfd, follow_symlinks=False)
        return
    except FileNotFoundError:
        pass
    except OSError as e:
        log.debug("fs tier: cannot look at %s: %r", LAYOUT_NOTE, e)
        return
    text = (
        f"asynctier fs tier, format v{FORMAT_VERSION}\nnamespace: {spec.namespace}\n"
        f"chunk_bytes: {spec.chunk_bytes}\nheader_block: {HEADER_BLOCK}\nshards: {N_SHARDS}\n"
    )
    tmp = f"{TMP_PREFIX}layout~{secrets.token_hex(16)}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, mode, dir_fd=dfd)
        try:
            set_mode(fd, mode, fix)
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        os.replace(tmp, LAYOUT_NOTE, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError as e:  # a read-only root still serves loads
        log.debug("fs tier: cannot write %s: %r", LAYOUT_NOTE, e)
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass


def open_subdir(parent: int, name: str, mode: int, fix: bool, *, apart: bool = False) -> int:
    """Open (made with ``mode`` if missing) the directory ``name`` in ``parent``: not through
    a link. ``fix``: the umask strips bits of ``mode``, set it after making it. ``apart``: if
    it must be made, ``parent`` is first flagged so that the file system places it apart from
    its siblings (:func:`~asynctier.posix_io.spread_subdirs`): whichever tier makes a shard
    flags the namespace first, so two tiers making one namespace at once both place theirs
    apart; a namespace whose shards all exist is left as it is."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, dir_fd=parent)
    except FileNotFoundError:
        if apart:
            spread_subdirs(parent)
        made = True
        try:
            os.mkdir(name, mode, dir_fd=parent)
        except FileExistsError:
            made = False  # made by another tier meanwhile
        fd = os.open(name, flags, dir_fd=parent)
        if made and fix:
            os.fchmod(fd, mode)
        return fd
