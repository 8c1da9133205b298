"""What an object holds and what it is called: names from keys, the header in front of the payload.

An object is ``<prefix><layout id>/<key token>`` and its body is a packed
:class:`~asynctier.integrity.ChunkHeader` followed by the payload (docs/tiers/obj.md). The
header rides in the body rather than in object metadata: it works the same on every store
(obstore's local store has no metadata) and arrives in the same response as the payload.
"""

from __future__ import annotations

import base64

from asynctier.core import MAX_KEY_BYTES
from asynctier.errors import IntegrityError, TierConfigError
from asynctier.integrity import ChunkHeader, checksum, key_token

from .params import integer

__all__ = [
    "HASHED_NAME_LEN",
    "S3_MIN_PART",
    "check_size",
    "frame_header",
    "header_probe_size",
    "is_hashed_name",
    "key_from_plain_name",
    "check_part_size",
    "object_name",
    "object_size",
    "read_header",
]

#: S3's smallest multipart part (all but the last).
S3_MIN_PART = 5 << 20
#: Length of a hashed key token (``"h"`` + 64 hex digits); never a base32 length, so the two
#: kinds of names cannot be confused.
HASHED_NAME_LEN = 65


def object_name(key: bytes) -> str:
    """The last path segment of ``key``'s object (a file-name-safe token, see ``key_token``)."""
    return key_token(key)


def object_size(key_len: int, payload_len: int) -> int:
    """Bytes of the object of a chunk: the header for a key of ``key_len`` bytes, then the payload."""
    return ChunkHeader.packed_size(key_len) + payload_len


def frame_header(key: bytes, data: memoryview, layout_digest: bytes) -> bytes:
    """The header that goes in front of ``data`` (its checksum computed here)."""
    return ChunkHeader(key, data.nbytes, checksum(data), layout_digest).pack()


def key_from_plain_name(name: str) -> bytes | None:
    """The key a base32 name stands for; None for a hashed name (its header holds the key) or
    a name that is not a key token at all."""
    if is_hashed_name(name):
        return None
    try:
        key = base64.b32decode(name.upper() + "=" * (-len(name) % 8))
    except ValueError:
        return None
    # only the name this tier gives the key: an upper-case spelling, or one with other trailing
    # bits, decodes to a key too, and was listed as that key (twice beside the real object)
    return key if 0 < len(key) <= MAX_KEY_BYTES and object_name(key) == name else None


def is_hashed_name(name: str) -> bool:
    return name.startswith("h") and len(name) == HASHED_NAME_LEN


def check_part_size(value: object, *, s3: bool) -> int:
    """``part_size`` checked: the header of the longest key must fit in the first part, which
    a load reads (and checks) before the rest; S3 refuses parts under 5 MiB."""
    size = integer("part_size", value)
    smallest = S3_MIN_PART if s3 else ChunkHeader.packed_size(MAX_KEY_BYTES)
    if size < smallest:
        why = "S3's smallest multipart part" if s3 else f"the header of a {MAX_KEY_BYTES}-byte key"
        raise TierConfigError(f"part_size must be at least {smallest} bytes ({why}); got {size}")
    return size


def header_probe_size(object_bytes: int) -> int:
    """Bytes to read from an object's start to be sure of its whole header (longest key)."""
    return min(object_bytes, ChunkHeader.packed_size(MAX_KEY_BYTES))


def check_size(what: str, got: int, expected: int, key: bytes, hint: str = "") -> None:
    """Raise :class:`IntegrityError` unless ``got == expected`` (truncated or foreign objects)."""
    if got != expected:
        raise IntegrityError(f"{what} is {got} bytes, expected {expected}{hint}", key)


def read_header(buf: memoryview, key: bytes, layout_digest: bytes, payload_len: int) -> ChunkHeader:
    """Parse and check the header at the start of ``buf``: its own checksum, the key, the
    layout and the payload length (the payload's checksum is checked once it has arrived)."""
    header = ChunkHeader.unpack(buf, key=key)
    header.verify(b"", layout_digest=layout_digest, payload_len=payload_len, check_data=False)
    return header
