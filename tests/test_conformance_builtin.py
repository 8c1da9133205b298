"""The conformance suite against the built-in memory tier and the example out-of-tree tiers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asynctier.testing import TierConformance


class TestMemoryTier(TierConformance):
    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "memory"}


class TestMemoryTierWithCapacity(TierConformance):
    """Capacity generous enough for the checks; eviction itself is tested in test_memory.py."""

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "memory", "capacity_bytes": 4096 * self.chunk_bytes}


class TestReadmeDirTier(TierConformance):
    """The README's custom tier, loaded out-of-tree by module_path."""

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "DirTier", "module_path": "dir_tier", "root": str(tmp_path / "kv")}


class TestAsyncDictTier(TierConformance):
    """A tier with coroutine primitives, loaded out-of-tree by module_path."""

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "AsyncDictTier", "module_path": "async_dict_tier"}
