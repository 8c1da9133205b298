"""What travels with every stored chunk, and how keys become names.

A :class:`ChunkHeader` carries the format version, the key, the payload length, an xxh3-64
checksum of the payload, a sequence number and the layout digest, and is itself protected
by a checksum, so a torn or foreign header is detected before its fields are trusted.
Tiers place it wherever suits the medium: in front of the payload in a file or slot, or as
object metadata.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import xxhash

from .errors import IntegrityError
from .spec import FORMAT_VERSION

__all__ = ["ChunkHeader", "HEADER_MAGIC", "checksum", "header_matches", "key_token", "pack_header"]

HEADER_MAGIC = b"ATKV"
#: Keys up to this many bytes are named by their base32; longer ones by a hash (:func:`key_token`).
MAX_B32_KEY = 96
# magic, version, flags, key_len, payload_len, checksum, seq, digest, header_checksum
_FIXED = struct.Struct("<4sHHIQQQ16s")
_TAIL = struct.Struct("<Q")


def checksum(data: memoryview | bytes | bytearray) -> int:
    """xxh3-64 of ``data`` (the GIL is released while hashing, so threads hash in parallel)."""
    return xxhash.xxh3_64_intdigest(data)


_B32_ALPHABET = bytes.maketrans(bytes(range(32)), b"abcdefghijklmnopqrstuvwxyz234567")
_B32_STAGES: dict[int, list[tuple[int, int]]] = {}


def _b32_stages(fields: int) -> list[tuple[int, int]]:
    """(mask, multiplier) steps that move ``fields`` packed 5-bit fields of an int into the
    low bits of one byte each: step ``b`` lifts the fields whose index has bit ``b`` set by
    ``3 << b`` bits (``v += (v & mask) * (2**shift - 1)``), highest bit first, so that no
    lifted field lands on one not yet moved."""
    steps = []
    for bit in range(max(0, (fields - 1).bit_length() - 1), -1, -1):
        mask = 0
        for i in range(fields):
            if i >> bit & 1:
                mask |= 31 << (5 * i + 3 * ((i >> (bit + 1)) << (bit + 1)))
        steps.append((mask, (1 << (3 << bit)) - 1))
    return steps


def _b32(key: bytes) -> str:
    """``base64.b32encode(key)``, lowercase, without padding; ~3x faster (the standard
    library's encoder loops in Python, ~10 us for a 32-byte key; every load and store names
    its file with this)."""
    n = len(key)
    pad = -n % 5
    fields = (n + pad) * 8 // 5
    steps = _B32_STAGES.get(fields)
    if steps is None:
        steps = _B32_STAGES[fields] = _b32_stages(fields)
    v = int.from_bytes(key, "big") << (8 * pad)
    for mask, mul in steps:
        v += (v & mask) * mul
    return v.to_bytes(fields, "big").translate(_B32_ALPHABET)[: (8 * n + 4) // 5].decode("ascii")


try:  # its C twin where it was built (asynctier/_speedups.c): ~20x faster, the same strings
    from ._speedups import b32 as _b32_fast
except ImportError:  # pragma: no cover - installed without a C compiler
    _b32_fast = _b32


def key_token(key: bytes) -> str:
    """A file-name-safe, collision-free token for a key.

    Keys up to 96 bytes are base32-encoded (RFC 4648 alphabet, lowercase, no padding: at
    most 154 characters, safe on case-insensitive file systems); longer keys are hashed
    with BLAKE2b-256 — the header still stores the full key, so a hash collision is caught
    on load.
    """
    if len(key) <= MAX_B32_KEY:
        return _b32_fast(key)
    return "h" + hashlib.blake2b(key, digest_size=32).hexdigest()


def pack_header(
    key: bytes,
    payload_len: int,
    csum: int,
    layout_digest: bytes,
    seq: int = 0,
    version: int = FORMAT_VERSION,
    flags: int = 0,
) -> bytes:
    """``ChunkHeader(...).pack()`` without building the object (hot paths pack one per chunk).

    Packing is deterministic, so a reader that knows what a header should say can compare
    the stored bytes with this instead of parsing them.
    """
    body = _FIXED.pack(HEADER_MAGIC, version, flags, len(key), payload_len, csum, seq, layout_digest) + key
    return body + _TAIL.pack(xxhash.xxh3_64_intdigest(body))


def pack_headers_into(
    block: memoryview | bytearray,
    start: int,
    stride: int,
    keys: Sequence[bytes],
    payload_len: int,
    layout_digest: bytes,
    seqs: Sequence[int],
) -> int:
    """For each ``j``, ``pack_header(keys[j], payload_len, 0, layout_digest, seqs[j])``
    written at ``block[(start + j) * stride:]`` (a run of chunks' headers, their checksums
    left to whoever writes the payloads); the last one's size, 0 for none. The reference of
    ``asynctier._speedups.pack_headers_into``."""
    if len(keys) != len(seqs):
        raise ValueError(f"pack_headers_into(): {len(keys)} keys but {len(seqs)} seqs")
    heads = [pack_header(key, payload_len, 0, layout_digest, seq) for key, seq in zip(keys, seqs)]
    for j, head in enumerate(heads):
        if len(head) > stride or (start + j) * stride + len(head) > len(block):
            raise ValueError(f"pack_headers_into(): header {j} ({len(head)} bytes) does not fit block {start + j}")
    for j, head in enumerate(heads):
        at = (start + j) * stride
        block[at : at + len(head)] = head
    return len(heads[-1]) if heads else 0


def header_matches(
    buf: bytes | memoryview | bytearray,
    key: bytes,
    payload_len: int,
    csum: int,
    layout_digest: bytes,
    seq: int = 0,
) -> bool:
    """Whether ``buf`` starts with exactly the header a chunk of ``key`` with this payload
    length, checksum, layout and sequence number would have been stored with (version and
    flags current).

    A fast accept for loads that know what to expect (one pack and a compare, ~5x faster
    than :meth:`ChunkHeader.unpack` and :meth:`ChunkHeader.verify`); on False, parse with
    those for the precise error.
    """
    want = pack_header(key, payload_len, csum, layout_digest, seq)
    return buf[: len(want)] == want


@dataclass(frozen=True)
class ChunkHeader:
    """Metadata stored with a chunk; :meth:`pack` / :meth:`unpack` to and from bytes."""

    key: bytes
    payload_len: int
    checksum: int
    layout_digest: bytes
    seq: int = 0
    version: int = FORMAT_VERSION
    flags: int = 0

    @property
    def size(self) -> int:
        """Packed size in bytes."""
        return _FIXED.size + len(self.key) + _TAIL.size

    @staticmethod
    def packed_size(key_len: int) -> int:
        """Packed size of a header for a key of ``key_len`` bytes."""
        return _FIXED.size + key_len + _TAIL.size

    def pack(self) -> bytes:
        """The header as bytes (see :attr:`size`)."""
        return pack_header(
            self.key, self.payload_len, self.checksum, self.layout_digest, self.seq, self.version, self.flags
        )

    @classmethod
    def unpack(cls, buf: bytes | memoryview | bytearray, *, key: bytes | None = None) -> ChunkHeader:
        """Parse a header from the start of ``buf``; raise :class:`IntegrityError` if it is bad.

        With ``key``, also check that the header belongs to that key.
        """
        mv = memoryview(buf)
        if mv.nbytes < _FIXED.size:
            raise IntegrityError(f"truncated chunk header: {mv.nbytes} bytes", key)
        magic, version, flags, key_len, payload_len, csum, seq, digest = _FIXED.unpack_from(mv)
        if magic != HEADER_MAGIC:
            raise IntegrityError("not a chunk header (bad magic)", key)
        end = _FIXED.size + key_len
        if mv.nbytes < end + _TAIL.size:
            raise IntegrityError(f"truncated chunk header: {mv.nbytes} bytes, need {end + _TAIL.size}", key)
        (hcsum,) = _TAIL.unpack_from(mv, end)
        if xxhash.xxh3_64_intdigest(mv[:end]) != hcsum:
            raise IntegrityError("chunk header checksum mismatch (torn or corrupted header)", key)
        if version != FORMAT_VERSION:
            raise IntegrityError(f"chunk format version {version}, expected {FORMAT_VERSION}", key)
        stored_key = bytes(mv[_FIXED.size : end])
        if key is not None and stored_key != key:
            raise IntegrityError("chunk header holds another key", key)
        return cls(stored_key, payload_len, csum, bytes(digest), seq, version, flags)

    def verify(
        self,
        payload: memoryview | bytes | bytearray,
        *,
        layout_digest: bytes,
        payload_len: int,
        check_data: bool = True,
    ) -> None:
        """Check digest, length and (with ``check_data``) the payload checksum."""
        if self.layout_digest != layout_digest:
            raise IntegrityError("chunk belongs to another layout (namespace, chunk size or format)", self.key)
        if self.payload_len != payload_len:
            raise IntegrityError(f"chunk payload is {self.payload_len} bytes, expected {payload_len}", self.key)
        if check_data and checksum(payload) != self.checksum:
            raise IntegrityError("chunk payload checksum mismatch", self.key)
