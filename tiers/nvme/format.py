"""The nvme tier's on-disk byte layouts: superblock, journal, checkpoint (slot headers are
:mod:`asynctier.integrity`'s). docs/tiers/nvme.md describes every field.

All integers are little-endian. Each structure carries the xxh3-64 of its bytes, so a torn or
foreign one is told apart before any field is trusted.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import xxhash

from asynctier.engines.speedups import speedups

__all__ = [
    "CHECKPOINT_HEAD",
    "CK_MAGIC",
    "EVICT",
    "JOURNAL_HEAD",
    "JR_MAGIC",
    "PUBLISH",
    "RECORD",
    "SB_MAGIC",
    "SUPERBLOCK",
    "Superblock",
    "U64",
    "VERSION",
    "pack_journal_head",
    "pack_record",
    "pack_records",
    "round_up",
    "xxh",
]

SB_MAGIC = b"ATNVSLAB"
CK_MAGIC = b"ATNVCKPT"
JR_MAGIC = b"ATNVJRNL"
VERSION = 1
# superblock: magic, version, block, chunk_bytes, slot_size, slots in this stripe, epoch,
# stripe index, stripe count, slab-set id, layout digest, data offset
SUPERBLOCK = struct.Struct("<8sIIQQQQII16s16sQ")
# checkpoint header: magic, version, flags, journal generation to replay from, slab-set id,
# slots, LRU head, LRU tail, key bytes
CHECKPOINT_HEAD = struct.Struct("<8sIIQ16sQqqQ")
# journal file header: magic, version, pad, generation, slab-set id
JOURNAL_HEAD = struct.Struct("<8sIIQ16s")
# journal record: type, pad, key length, slot, seq, payload checksum (then key, then xxh3)
RECORD = struct.Struct("<BBHIQQ")
U64 = struct.Struct("<Q")
PUBLISH, EVICT = 1, 2


def xxh(data: bytes | memoryview | bytearray) -> int:
    """xxh3-64 of ``data``: the checksum of every structure on this page."""
    return xxhash.xxh3_64_intdigest(data)


def round_up(n: int, block: int) -> int:
    """``n`` rounded up to a multiple of ``block``."""
    return -(-n // block) * block


def pack_record(typ: int, key: bytes, slot: int, seq: int, csum: int) -> bytes:
    """One journal record (``PUBLISH`` or ``EVICT``) with its trailing checksum."""
    return pack_records(typ, ((key, slot, seq, csum),))[0]


def _pack_records(typ: int, items: Sequence[tuple[bytes, int, int, int]]) -> list[bytes]:
    """:func:`pack_record` of type ``typ`` for each ``(key, slot, seq, csum)`` (a store's
    batch of them, one loop: this runs per chunk on the event loop's thread). The reference
    of ``asynctier._speedups.pack_records``, which :func:`pack_records` is where built."""
    pack, tail, hash64 = RECORD.pack, U64.pack, xxhash.xxh3_64_intdigest
    out: list[bytes] = []
    for key, slot, seq, csum in items:
        body = pack(typ, 0, len(key), slot, seq, csum) + key
        out.append(body + tail(hash64(body)))
    return out


_fast = speedups()
pack_records: Callable[[int, Sequence[tuple[bytes, int, int, int]]], list[bytes]] = (
    _pack_records if _fast is None else _fast.pack_records
)


def pack_journal_head(gen: int, slab_id: bytes) -> bytes:
    """The header that opens a journal file of generation ``gen``, with its checksum."""
    head = JOURNAL_HEAD.pack(JR_MAGIC, VERSION, 0, gen, slab_id)
    return head + U64.pack(xxh(head))


@dataclass(frozen=True)
class Superblock:
    """The first block of every slab: what the slab set is and how it is cut into slots."""

    block: int
    chunk_bytes: int
    slot_size: int
    per_stripe: int
    epoch: int
    stripe: int
    stripes: int
    slab_id: bytes
    layout_digest: bytes
    data_off: int
    version: int = VERSION

    #: bytes :meth:`pack` returns: the fields and their checksum
    SIZE = SUPERBLOCK.size + U64.size

    def pack(self) -> bytes:
        head = SUPERBLOCK.pack(
            SB_MAGIC,
            self.version,
            self.block,
            self.chunk_bytes,
            self.slot_size,
            self.per_stripe,
            self.epoch,
            self.stripe,
            self.stripes,
            self.slab_id,
            self.layout_digest,
            self.data_off,
        )
        return head + U64.pack(xxh(head))

    @classmethod
    def unpack(cls, buf: bytes | memoryview | bytearray) -> Superblock | None:
        """The superblock at the start of ``buf``; None without the magic or with a bad checksum."""
        mv = memoryview(buf)
        if mv.nbytes < cls.SIZE or bytes(mv[:8]) != SB_MAGIC:
            return None
        if xxh(mv[: SUPERBLOCK.size]) != U64.unpack_from(mv, SUPERBLOCK.size)[0]:
            return None
        _m, version, block, chunk, slot_size, per_stripe, epoch, stripe, stripes, sid, digest, data_off = (
            SUPERBLOCK.unpack_from(mv)
        )
        return cls(block, chunk, slot_size, per_stripe, epoch, stripe, stripes, sid, digest, data_off, version)
