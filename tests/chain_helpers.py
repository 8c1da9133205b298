"""What the chain tests share: a primary buffer with random chunks, and chains built on it."""

from __future__ import annotations

from typing import Any

from s3_helpers import Rig, keys

from asynctier.tiers.chain import ChainTier

__all__ = ["CHUNK", "ChainRig", "in_tier", "keys"]

CHUNK = 4096


class ChainRig(Rig):
    """A spec, a primary buffer of random chunks (the obj tests' rig), and a chain built on them."""

    def __init__(self, num_chunks: int = 32, chunk_bytes: int = CHUNK, namespace: str = "chain/test") -> None:
        super().__init__(chunk_bytes, num_chunks, namespace)

    def chain(self, **config: Any) -> ChainTier:
        tier = self.tier({"type": "chain", **config})
        assert isinstance(tier, ChainTier)
        return tier

    def restore(self) -> None:
        """Put the original chunks back (before storing again)."""
        self.buf[:] = self.orig


async def in_tier(chain: ChainTier, name: str, ks: list[bytes]) -> list[bool]:
    """What the chain's tier ``name`` itself holds (asked directly, not through the chain)."""
    return await chain.member(name).tier.lookup(ks)
