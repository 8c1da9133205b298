"""The conformance suite, on asyncio, uvloop and trio, against the built-in memory tier and
the example out-of-tree tiers (which rely on the base class's integrity framing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asynctier.tiers.memory import MemoryTier

from asynctier.testing import Harness, TierConformance


class MemoryTierDamage(TierConformance):
    """The memory tier keeps each chunk as (bytes, checksum) in a dict: damage them there."""

    def _chunks(self, h: Harness) -> dict[bytes, tuple[bytearray, int]]:
        assert isinstance(h.tier, MemoryTier)
        chunks: dict[bytes, tuple[bytearray, int]] = h.tier._chunks
        return chunks

    async def corrupt_stored(self, h: Harness, key: bytes, how: str) -> None:
        data, csum = self._chunks(h)[key]
        cut = len(data) - self.chunk_bytes // 2  # in the payload, whether framed or not
        if how == "flip":
            data[cut] ^= 0xFF
        else:
            self._chunks(h)[key] = (data[:cut], csum)

    async def swap_stored(self, h: Harness, key_a: bytes, key_b: bytes) -> None:
        chunks = self._chunks(h)
        chunks[key_a], chunks[key_b] = chunks[key_b], chunks[key_a]


class TestMemoryTier(MemoryTierDamage):
    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "memory"}


class TestMemoryTierWithCapacity(MemoryTierDamage):
    """Capacity generous enough for the checks; eviction itself is tested in test_memory.py."""

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "memory", "capacity_bytes": 4096 * self.chunk_bytes}


class TestReadmeDirTier(TierConformance):
    """The README's custom tier, loaded out-of-tree by module_path; the suite's default
    integrity hooks rewrite its records through its own primitives."""

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "DirTier", "module_path": "dir_tier", "root": str(tmp_path / "kv")}


class TestAsyncDictTier(TierConformance):
    """A tier with coroutine primitives, loaded out-of-tree by module_path."""

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "AsyncDictTier", "module_path": "async_dict_tier"}
