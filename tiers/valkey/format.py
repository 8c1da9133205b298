"""Key names and the stored value: the project's chunk header followed by the payload, in one
string value per chunk (docs/tiers/valkey.md, "The stored value")."""

from __future__ import annotations

import ctypes

from asynctier.errors import IntegrityError, TierConfigError
from asynctier.integrity import ChunkHeader, checksum, header_matches, pack_header

__all__ = [
    "check_key_prefix",
    "checksums",
    "copy_released",
    "frame",
    "name_prefix",
    "stored",
    "unframe_into",
    "value_size",
]

_MAX_PREFIX = 256


def check_key_prefix(value: object) -> str:
    """``key_prefix``: a str of 1 to 256 printable characters without braces (a ``{...}`` hash
    tag would put every chunk of a cluster in one slot) or glob characters."""
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= _MAX_PREFIX
        or not value.isprintable()
        or any(c in value for c in "{}*?[]\\ ")
    ):
        raise TierConfigError(
            f"key_prefix must be a str of 1 to {_MAX_PREFIX} printable characters without spaces, "
            f"braces or glob characters (*?[]\\); got {value!r}"
        )
    return value


def name_prefix(key_prefix: str, layout_id: str) -> bytes:
    """What every key name of a layout starts with: ``<key_prefix>:<layout id>:``."""
    return f"{key_prefix}:{layout_id}:".encode()


def value_size(key_len: int, chunk_bytes: int) -> int:
    """Bytes of a stored value: header plus payload."""
    return ChunkHeader.packed_size(key_len) + chunk_bytes


def frame(key: bytes, payload: memoryview, layout_digest: bytes, csum: int | None = None) -> tuple[bytes, memoryview]:
    """The value stored for ``key``: its header and the payload, sent as one argument
    (:func:`~.client.pack` makes the one copy of the payload). ``csum``: the payload's
    checksum when it was computed already (on a worker thread)."""
    return pack_header(key, payload.nbytes, checksum(payload) if csum is None else csum, layout_digest), payload


def copy_released(out: memoryview, value: bytes, offset: int) -> None:
    """``out[:] = value[offset:]`` with the GIL released: a memoryview assignment holds it for
    the whole copy, which would stall the event loop while a worker thread copies megabytes."""
    n = out.nbytes
    if len(value) - offset != n or out.readonly or not out.c_contiguous:
        raise ValueError("copy_released needs a writable contiguous destination of the payload's size")
    if n == 0:
        return
    dst = (ctypes.c_char * n).from_buffer(out)  # an export of ``out``: it cannot be released meanwhile
    # c_char_p points into the bytes object itself (no copy), which the caller keeps alive
    src = ctypes.cast(ctypes.c_char_p(value), ctypes.c_void_p).value
    assert src is not None
    ctypes.memmove(dst, src + offset, n)


def unframe_into(
    key: bytes, value: bytes, out: memoryview, layout_digest: bytes, verify: bool, *, release_gil: bool = False
) -> None:
    """Check ``value`` (as read for ``key``) and copy its payload into ``out``; raise
    :class:`IntegrityError` before touching ``out`` for a value of another size, key or layout,
    a torn header, or (with ``verify``) a payload that does not match its checksum.
    ``release_gil``: copy with the GIL released (a worker thread's call)."""
    mv = memoryview(value)
    hsize = ChunkHeader.packed_size(len(key))
    want = hsize + out.nbytes
    if mv.nbytes != want:
        raise IntegrityError(f"stored value is {mv.nbytes} bytes, expected {want}", key)
    payload = mv[hsize:]
    if not (verify and header_matches(mv, key, out.nbytes, checksum(payload), layout_digest)):
        # the precise error (or, without verify, the header alone)
        header = ChunkHeader.unpack(mv, key=key)
        header.verify(payload, layout_digest=layout_digest, payload_len=out.nbytes, check_data=verify)
        if header.seq != 0 or header.flags != 0:
            raise IntegrityError("chunk header has fields this tier never writes (seq, flags)", key)
    if release_gil:
        copy_released(out, value, hsize)
    else:
        out[:] = payload


def checksums(payloads: list[memoryview]) -> list[int | None]:
    """Each payload's xxh3 (on a worker thread: xxhash releases the GIL while it hashes)."""
    return [checksum(p) for p in payloads]


def stored(reply: object) -> bool:
    """A SET's reply says stored (raw ``OK``, or ``True`` through the client's callbacks)."""
    return reply is True or reply == b"OK"
