"""What the chain tests share: a primary buffer with random chunks, and chains built on it."""

from __future__ import annotations

import os
import uuid
from typing import Any

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.tiers.chain import ChainTier

CHUNK = 4096


class ChainRig:
    """A spec, a primary buffer of random chunks, and a chain built on them."""

    def __init__(self, num_chunks: int = 32, chunk_bytes: int = CHUNK, namespace: str = "chain/test") -> None:
        self.spec = OffloadingSpec(chunk_bytes, num_chunks, namespace=namespace)
        self.buf = bytearray(os.urandom(self.spec.total_bytes))
        self.orig = bytes(self.buf)

    def chain(self, **config: Any) -> ChainTier:
        tier = SecondaryTierFactory.create_secondary_tier({"type": "chain", **config}, memoryview(self.buf), self.spec)
        assert isinstance(tier, ChainTier)
        return tier

    def chunk(self, cid: int) -> bytes:
        c = self.spec.chunk_bytes
        return bytes(self.buf[cid * c : (cid + 1) * c])

    def orig_chunk(self, cid: int) -> bytes:
        c = self.spec.chunk_bytes
        return self.orig[cid * c : (cid + 1) * c]

    def zero(self) -> None:
        self.buf[:] = bytes(len(self.buf))

    def restore(self) -> None:
        """Put the original chunks back (before storing again)."""
        self.buf[:] = self.orig


def keys(n: int, tag: str = "k") -> list[bytes]:
    salt = uuid.uuid4().hex[:8]
    return [f"{tag}-{salt}-{i}".encode() for i in range(n)]


async def in_tier(chain: ChainTier, name: str, ks: list[bytes]) -> list[bool]:
    """What the chain's tier ``name`` itself holds (asked directly, not through the chain)."""
    return await chain.member(name).tier.lookup(ks)
