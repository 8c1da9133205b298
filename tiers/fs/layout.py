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
import time
from pathlib import Path

import xxhash

from asynctier.integrity import key_token
from asynctier.spec import FORMAT_VERSION, OffloadingSpec

__all__ = [
    "HEADER_BLOCK",
    "LAYOUT_NOTE",
    "N_SHARDS",
    "TMP_PREFIX",
    "TempNames",
    "is_hashed_token",
    "namespace_dir",
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
        self.tag = f"{TMP_PREFIX}{self.host}~{os.getpid()}~{next(_instance_seq)}~"
        self._seq = itertools.count()

    def next(self) -> str:
        """A name no other writer uses."""
        return f"{self.tag}{next(self._seq)}"

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


def write_layout_note(directory: Path, spec: OffloadingSpec, temp: str) -> None:
    """Write ``LAYOUT`` (once): what the namespace directory's digest stands for."""
    note = directory / LAYOUT_NOTE
    if note.exists():
        return
    text = (
        f"asynctier fs tier, format v{FORMAT_VERSION}\nnamespace: {spec.namespace}\n"
        f"chunk_bytes: {spec.chunk_bytes}\nheader_block: {HEADER_BLOCK}\nshards: {N_SHARDS}\n"
    )
    tmp = directory / temp
    try:
        tmp.write_text(text)
        os.replace(tmp, note)
    except OSError as e:  # a read-only root still serves loads
        log.debug("fs tier: cannot write %s: %r", note, e)
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
