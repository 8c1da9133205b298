"""The ``chain`` tier under the conformance suite: memory -> fs on every event loop, memory -> fs
-> obj on moto's S3 server, memory -> nvme, and a chain nested in a chain.

The suite's integrity checks damage a chunk in every tier that holds it (after the chain's
background writes are done): a chain must fail the key, never deliver wrong bytes, and leave
no bad copy in any tier.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import obstore
import pytest

from asynctier.testing import ContractChecks, Harness, IntegrityChecks, TierConformance
from asynctier.testing.records import corrupt_record, swap_records
from asynctier.tiers.chain import ChainTier
from asynctier.tiers.fs import FsTier
from asynctier.tiers.memory import MemoryTier
from asynctier.tiers.nvme import NvmeTier
from asynctier.tiers.obj import ObjTier

sys.path.insert(0, str(Path(__file__).parent))
from fs_helpers import chunk_file, damage_file, swap_files
from nvme_helpers import damage_slot, swap_slots
from s3_helpers import s3_config


def _obj_damage(tier: ObjTier, key: bytes, how: str) -> None:
    st, path = tier._st(), tier._path(key)
    body = bytearray(obstore.get(st, path).bytes())
    if how == "flip":
        body[-1] ^= 0xFF
    else:
        del body[-100:]
    obstore.put(st, path, bytes(body))


def _obj_swap(tier: ObjTier, key_a: bytes, key_b: bytes) -> None:
    st, a, b = tier._st(), tier._path(key_a), tier._path(key_b)
    body_a, body_b = obstore.get(st, a).bytes(), obstore.get(st, b).bytes()
    obstore.put(st, a, body_b)
    obstore.put(st, b, body_a)


def leaf_tiers(tier: Any) -> list[Any]:
    """Every single tier under a chain (nested chains flattened)."""
    if isinstance(tier, ChainTier):
        return [t for m in tier.members for t in leaf_tiers(m.tier)]
    return [tier]


class ChainDamage:
    """Damage reaches every copy: the chain's background writes end first, then each tier
    holding the key is damaged on its own medium."""

    async def _holders(self, h: Harness, keys: list[bytes]) -> list[Any]:
        await h.tier.drain()
        out = []
        for t in leaf_tiers(h.tier):
            if all(await t.lookup(keys)):
                out.append(t)
        assert out, "no tier of the chain holds the key to damage"
        return out

    async def corrupt_stored(self, h: Harness, key: bytes, how: str) -> None:
        for t in await self._holders(h, [key]):
            if isinstance(t, MemoryTier):
                await corrupt_record(t, key, how)
            elif isinstance(t, FsTier):
                await anyio.to_thread.run_sync(damage_file, chunk_file(t, key), how)
            elif isinstance(t, NvmeTier):
                damage_slot(t, key, how)
            elif isinstance(t, ObjTier):
                await anyio.to_thread.run_sync(_obj_damage, t, key, how)
            else:
                raise AssertionError(f"no way to damage a chunk of {t!r}")

    async def swap_stored(self, h: Harness, key_a: bytes, key_b: bytes) -> None:
        for t in await self._holders(h, [key_a, key_b]):
            if isinstance(t, MemoryTier):
                await swap_records(t, key_a, key_b)
            elif isinstance(t, FsTier):
                await anyio.to_thread.run_sync(swap_files, chunk_file(t, key_a), chunk_file(t, key_b))
            elif isinstance(t, NvmeTier):
                swap_slots(t, key_a, key_b)
            elif isinstance(t, ObjTier):
                await anyio.to_thread.run_sync(_obj_swap, t, key_a, key_b)
            else:
                raise AssertionError(f"no way to swap chunks of {t!r}")


class ChainConformance(ChainDamage, TierConformance):
    """The whole suite on a chain."""


class TestMemoryFsChain(ChainConformance):
    """Two real tiers, written back; on asyncio, uvloop and trio. A small backlog: the
    flood checks' thousands of stores mostly stay in memory (their write-back dropped and
    counted), which keeps the files to write and delete few."""

    chunk_bytes = 4096

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {
            "type": "chain",
            "tiers": [{"type": "memory"}, {"type": "fs", "root": str(tmp_path / "kv"), "io_engine": "threads"}],
            "write": "back",
            "backlog_chunks": 16,
        }


class TestMemoryFsChainWriteThrough(ChainDamage, ContractChecks, IntegrityChecks):
    """Written through (every tier before the call returns): the contract and integrity
    checks, one loop (the scheduling checks are the same code as above)."""

    backends = ("asyncio",)
    chunk_bytes = 4096
    num_chunks = 16

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {
            "type": "chain",
            "tiers": [{"type": "memory"}, {"type": "fs", "root": str(tmp_path / "kv")}],
            "write": "through",
        }


SLOW = os.environ.get("ASYNCTIER_SLOW_TESTS") == "1"


class TestThreeTierChainOnS3(ChainConformance):
    """memory -> fs -> obj on moto's S3 server; asyncio only (moto is slow: the two checks
    that make thousands of requests run with ASYNCTIER_SLOW_TESTS=1, as for the obj tier)."""

    backends = ("asyncio",)
    chunk_bytes = 4096
    num_chunks = 16

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {
            "type": "chain",
            "tiers": [
                {"type": "memory"},
                {"type": "fs", "root": str(tmp_path / "kv"), "io_engine": "threads"},
                s3_config(),
            ],
            "write": "back",
            "background_batch": 16,
        }

    @pytest.mark.skipif(not SLOW, reason="thousands of requests to a slow moto; set ASYNCTIER_SLOW_TESTS=1")
    def test_loads_not_starved_by_store_flood(self, tmp_path: Path, backend: Any) -> None:
        super().test_loads_not_starved_by_store_flood(tmp_path, backend)

    @pytest.mark.skipif(not SLOW, reason="thousands of requests to a slow moto; set ASYNCTIER_SLOW_TESTS=1")
    def test_inflight_bound_under_1000_concurrent_calls(self, tmp_path: Path, backend: Any) -> None:
        super().test_inflight_bound_under_1000_concurrent_calls(tmp_path, backend)


class TestMemoryNvmeChain(ChainConformance):
    """memory -> nvme (a small sparse slab); asyncio only."""

    backends = ("asyncio",)
    chunk_bytes = 16 * 1024
    num_chunks = 16

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {
            "type": "chain",
            "tiers": [
                {"type": "memory"},
                {
                    "type": "nvme",
                    "path": str(tmp_path / "kv.slab"),
                    "capacity_bytes": 4096 * 24 * 1024,
                    "preallocate": False,
                },
            ],
        }


class TestNestedChain(ChainDamage, ContractChecks, IntegrityChecks):
    """A chain whose second tier is a chain (memory -> (memory -> fs)): the contract and
    integrity checks, one loop."""

    backends = ("asyncio",)
    chunk_bytes = 4096
    num_chunks = 16

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        inner = {"type": "chain", "tiers": [{"type": "memory"}, {"type": "fs", "root": str(tmp_path / "kv")}]}
        return {"type": "chain", "tiers": [{"type": "memory", "name": "front"}, inner]}
