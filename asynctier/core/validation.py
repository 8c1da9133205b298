"""Argument and parameter checks that run before any I/O (programmer errors raise at once)."""

from __future__ import annotations

import os
import stat
from collections.abc import KeysView, Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path

from ..errors import TierConfigError
from ..spec import OffloadingSpec

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_SECONDS",
    "check_bool",
    "check_keys",
    "check_pairs",
    "check_path",
    "check_private_dir",
    "integer",
    "permission_bits",
    "positive_int",
    "seconds",
]

#: Longest key accepted (keys are prefix hashes; this leaves room for them in chunk headers).
MAX_KEY_BYTES = 1024

#: Durations beyond a day are mistakes (inf, milliseconds taken for seconds), and the HTTP
#: client refuses some of them only when the store is built.
MAX_SECONDS = 86400.0


def seconds(name: str, value: object, *, zero_ok: bool) -> float:
    """A duration in seconds: a real number (not a bool), > 0 (or >= 0) and <= MAX_SECONDS; NaN refused."""
    if (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and (value >= 0 if zero_ok else value > 0)  # NaN fails this and the next
        and value <= MAX_SECONDS
    ):
        return float(value)
    bound = ">= 0" if zero_ok else "> 0"
    raise TierConfigError(f"{name} must be a number of seconds {bound} and <= {MAX_SECONDS:g}; got {value!r}")


def integer(name: str, value: object, minimum: int = 1, maximum: int | None = None) -> int:
    """An int (not a bool) from ``minimum`` (to ``maximum``)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise TierConfigError(f"{name} must be an int {bound}; got {value!r}")
    return value


def positive_int(name: str, value: object, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        accepted = "a positive int" + (" or None" if allow_none else "")
        raise TierConfigError(f"{name} must be {accepted}; got {value!r}")
    return value


def check_bool(name: str, value: object, *, also: tuple[str, ...] = ()) -> None:
    """A flag: exactly ``True`` or ``False`` (not 0, 1 or anything else equal to them), or one
    of the strings in ``also`` (such as ``"auto"``)."""
    if isinstance(value, bool) or (isinstance(value, str) and value in also):
        return
    accepted = ", ".join([*(repr(a) for a in also), "True"]) + " or False"
    raise TierConfigError(f"{name} must be {accepted}; got {value!r:.80}")


def permission_bits(name: str, value: object, owner: int = 0) -> int:
    """A file or directory mode parameter: an int from 0 to 0o777 (not a bool, not a string)
    with at least the ``owner`` bits (0o600 for a file the tier reads and writes, 0o700 for a
    directory it works in: without them every store succeeded and every load failed)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
        raise TierConfigError(f"{name} must be an int from 0 to 0o777 (permission bits, e.g. 0o600); got {value!r}")
    if value & owner != owner:
        raise TierConfigError(
            f"{name} must give the owner {oct(owner)} (the tier reads and writes what it makes); got {oct(value)}"
        )
    return value


def make_dirs(path: Path, mode: int, who: str, name: str) -> bool:
    """Make the directory ``path`` if it is missing, and its missing parents, each with exactly
    ``mode`` whatever the umask (``mkdir -p`` gave the parents 0o755, or 0o777 under umask 0,
    where the tier's ``dir_mode`` is for every directory it makes); True if ``path`` itself was
    made. A part of the path that is there and not a directory is refused, naming it and the
    parameter ``name``."""
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p) and p.parent != p:
        missing.append(p)
        p = p.parent
    if not p.is_dir():  # (a link to a directory is the user's name for it)
        what = "is a file" if p.is_file() else "is not a directory"
        raise TierConfigError(
            f"{who}: {name} {str(path)!r}: {str(p)!r} {what}; give a directory (made, with its parents, if missing)"
        )
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:  # made meanwhile by another process: theirs, as it is
            if not d.is_dir():
                raise TierConfigError(f"{who}: {name} {str(path)!r}: {str(d)!r} is not a directory") from None
            continue
        os.chmod(d, mode)
    return bool(missing) and missing[0] == path


def check_private_dir(fd: int, path: Path, who: str) -> None:
    """Refuse (with :class:`TierConfigError` naming mode and owner) the open directory ``fd``
    if others may write into it: they could put links, FIFOs or files of their own at the
    names the tier uses, or replace its files. Allowed: not writable by others, nor by its
    group unless it is ours; or sticky and ours (others cannot rename or remove our names)."""
    st = os.fstat(fd)
    mine = st.st_uid == os.geteuid()
    others_write = st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and not mine)
    if others_write and not (st.st_mode & stat.S_ISVTX and mine):
        raise TierConfigError(
            f"{who}: {path} is writable by others (mode {stat.S_IMODE(st.st_mode):#o}, owner uid {st.st_uid}): "
            "anyone who can write there can plant files or links at the names the tier uses; use a directory "
            "that is not writable by others (chmod go-w), or sticky and owned by this user"
        )


def _unordered(items: object) -> bool:
    """A set: iterated in hash order (a dict and its keys() keep insertion order)."""
    if type(items) is list or type(items) is tuple:  # the usual case, without an ABC's check
        return False
    return isinstance(items, AbstractSet) and not isinstance(items, KeysView)


def plain_keys(keys: list[object], max_len: int) -> bool:
    """Whether each of ``keys`` is a ``bytes`` of 1 to ``max_len`` bytes (the reference of
    ``asynctier._speedups.plain_keys``)."""
    return all(type(k) is bytes and 0 < len(k) <= max_len for k in keys)


def plain_ids(ids: list[object], n: int) -> bool:
    """Whether ``ids`` is not empty and each is an ``int`` in ``[0, n)`` (the reference of
    ``asynctier._speedups.plain_ids``)."""
    return bool(ids) and all(type(c) is int for c in ids) and min(ids) >= 0 and max(ids) < n  # type: ignore[type-var,operator]


try:
    from .._speedups import plain_ids as _plain_ids
    from .._speedups import plain_keys as _plain_keys
except ImportError:  # pragma: no cover - installed without a C compiler
    _plain_keys, _plain_ids = plain_keys, plain_ids


def check_keys(keys: Sequence[bytes]) -> list[bytes]:
    if isinstance(keys, (bytes, bytearray, memoryview, str)):
        raise TypeError("keys must be a sequence of bytes keys (for example [key]), not a single key")
    if _unordered(keys) or not hasattr(keys, "__iter__"):  # keys would meet the wrong slots; or no list
        raise TypeError(f"keys must be an ordered sequence (a list or tuple: a transfer pairs them with "
                        f"chunk_ids by position); got a {type(keys).__name__}")  # fmt: skip
    out = list(keys)
    if _plain_keys(out, MAX_KEY_BYTES):  # the common case in one call; else each, for the error
        if len(set(out)) != len(out):
            raise ValueError("keys must be distinct within one call")
        return out
    for k in out:
        if type(k) is not bytes:
            raise TypeError(f"each key must be bytes; got {type(k).__name__} {k!r:.60}")
        if not k or len(k) > MAX_KEY_BYTES:
            raise ValueError(f"each key must be 1..{MAX_KEY_BYTES} bytes long; got {len(k)} bytes")
    if len(set(out)) != len(out):
        raise ValueError("keys must be distinct within one call")
    return out


def check_pairs(
    spec: OffloadingSpec, view: memoryview, keys: Sequence[bytes], chunk_ids: Sequence[int], *, load: bool
) -> tuple[list[bytes], list[int]]:
    ks = check_keys(keys)
    if isinstance(chunk_ids, (bytes, bytearray, str)) or _unordered(chunk_ids) or not hasattr(chunk_ids, "__iter__"):
        raise TypeError(
            f"chunk_ids must be an ordered sequence of ints (a list or tuple); got a {type(chunk_ids).__name__}"
        )
    ids = list(chunk_ids)
    # the common case checked in bulk (plain ints in range); else one by one, for the error
    if not _plain_ids(ids, spec.num_chunks):
        ids = [spec.check_chunk_id(c) for c in ids]
    if len(ks) != len(ids):
        raise ValueError(f"got {len(ks)} keys but {len(ids)} chunk ids; they pair up one to one")
    if load:
        if view.readonly:
            raise TypeError("primary_kv_view is read-only; load needs a writable buffer")
        if len(set(ids)) != len(ids):
            raise ValueError("chunk ids must be distinct within one load (two keys cannot fill one slot)")
    return ks, ids


def check_path(name: str, value: object) -> Path:
    """A file-system path parameter: a non-empty ``str`` or ``os.PathLike`` without NUL
    (refused here, at construction, not at ``open()``)."""
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise TierConfigError(f"{name} must be a path (a str or os.PathLike); got {type(value).__name__} {value!r:.80}")
    text = os.fspath(value)
    if not isinstance(text, str) or not text:
        raise TierConfigError(f"{name} must be a non-empty path; got {value!r:.80}")
    if "\0" in text:
        raise TierConfigError(f"{name} must not contain a NUL character; got {value!r:.80}")
    return Path(text)
