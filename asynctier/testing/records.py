"""The suite's default way to damage a stored chunk: through the tier's own primitives.

A tier that lets the base class frame its chunks (``frames_own_bytes = False``) stores opaque
records (header and payload, :mod:`asynctier.core.framing`) with ``write_chunk`` and returns
them with ``read_chunk``. The default corruption hooks read such a record, change it, and
write it back under a key, exactly as a bad disk or a buggy client would leave it. A tier
that frames its own bytes stores them in its own format, which only its author knows how to
damage: the suite tells them to override the hooks.
"""

from __future__ import annotations

import anyio
import anyio.to_thread
import pytest

from ..core.blocking import BlockingChunkTier
from ..core.coroutine import AsyncChunkTier
from ..core.framing import frame_size
from ..integrity import ChunkHeader

__all__ = ["CORRUPTIONS", "RawRecords", "corrupt_record", "hooks_missing", "swap_records"]

#: The ways :meth:`TierConformance.corrupt_stored` damages one stored chunk.
CORRUPTIONS = ("flip", "truncate")

_HOOKS_HELP = (
    "the conformance suite cannot damage a stored chunk of the {tier!r} tier ({cls}) through its primitives: "
    "{why}. Override the hooks `async def corrupt_stored(self, h, key, how)` (how is 'flip': change one "
    "payload byte, or 'truncate': leave the stored chunk shorter) and `async def swap_stored(self, h, key_a, "
    "key_b)` (each key then holds the other's stored bytes) in your TierConformance subclass, damaging the "
    "chunk on the medium itself; see the asynctier.testing docstring"
)


def hooks_missing(tier: object, why: str) -> str:
    """The failure message for a tier whose test class must implement the corruption hooks."""
    name = getattr(tier, "tier_type", type(tier).__name__)
    return _HOOKS_HELP.format(tier=name, cls=type(tier).__qualname__, why=why)


class RawRecords:
    """Read and write the records a framed tier stores, by key, through its primitives."""

    def __init__(self, tier: object) -> None:
        if not isinstance(tier, (BlockingChunkTier, AsyncChunkTier)):
            pytest.fail(hooks_missing(tier, "it is not built on BlockingChunkTier or AsyncChunkTier"), pytrace=False)
        if tier.frames_own_bytes:
            pytest.fail(
                hooks_missing(tier, "it frames its own bytes (frames_own_bytes = True), in a format only it knows"),
                pytrace=False,
            )
        self.tier = tier
        self.chunk_bytes = tier.offloading_spec.chunk_bytes

    def payload_start(self, key: bytes) -> int:
        """Where the payload begins in a record of ``key``."""
        return ChunkHeader.packed_size(len(key))

    async def read(self, key: bytes) -> bytearray:
        record = bytearray(frame_size(key, self.chunk_bytes))
        with memoryview(record) as out:
            if isinstance(self.tier, BlockingChunkTier):
                await anyio.to_thread.run_sync(self.tier.read_chunk, key, out)
            else:
                await self.tier.read_chunk(key, out)
        return record

    async def write(self, key: bytes, record: bytes | bytearray) -> None:
        data = memoryview(record).toreadonly()
        if isinstance(self.tier, BlockingChunkTier):
            await anyio.to_thread.run_sync(self.tier.write_chunk, key, data)
        else:
            await self.tier.write_chunk(key, data)


async def corrupt_record(tier: object, key: bytes, how: str) -> None:
    """Damage the record stored under ``key``: ``"flip"`` one payload byte, or ``"truncate"``
    it to half its payload."""
    if how not in CORRUPTIONS:
        raise ValueError(f"how must be one of {CORRUPTIONS}; got {how!r}")
    raw = RawRecords(tier)
    record = await raw.read(key)
    if how == "flip":
        record[raw.payload_start(key) + raw.chunk_bytes // 2] ^= 0xFF
    else:
        record = record[: len(record) - raw.chunk_bytes // 2]
    await raw.write(key, record)


async def swap_records(tier: object, key_a: bytes, key_b: bytes) -> None:
    """Store each key's record under the other key."""
    raw = RawRecords(tier)
    record_a = await raw.read(key_a)
    record_b = await raw.read(key_b)
    await raw.write(key_a, record_b)
    await raw.write(key_b, record_a)
