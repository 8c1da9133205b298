"""A persistent tier of its own with ``uses_index = True`` (the base class keeps its LRU index)
finds at open what an earlier process stored: the index is filled from ``list_chunks()``.
It started empty at every open: the chunks on the medium were neither served nor counted
against ``capacity_bytes``, nor ever evicted."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import anyio
import pytest

from asynctier import BlockingChunkTier, ChunkNotFoundError, OffloadingSpec

CHUNK = 4096
SPEC = OffloadingSpec(CHUNK, 8, namespace="test/index-at-open")


class HexDirTier(BlockingChunkTier):
    """One file per chunk, named by the key's hex (so the listing gives the keys back)."""

    uses_index = True

    def __init__(self, *, root: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.dir = Path(root) / self.offloading_spec.layout_id

    def open_medium(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)

    def write_chunk(self, key: bytes, data: memoryview) -> None:
        tmp = self.dir / f"{key.hex()}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, self.dir / key.hex())

    def read_chunk(self, key: bytes, out: memoryview) -> int:
        try:
            data = (self.dir / key.hex()).read_bytes()
        except FileNotFoundError:
            raise ChunkNotFoundError("not stored", key) from None
        out[: len(data)] = data
        return len(data)

    def chunk_exists(self, key: bytes) -> bool:
        return (self.dir / key.hex()).exists()

    def delete_chunk(self, key: bytes) -> bool:
        try:
            (self.dir / key.hex()).unlink()
        except FileNotFoundError:
            return False
        return True

    def list_chunks(self) -> list[bytes]:
        return [bytes.fromhex(p.name) for p in self.dir.iterdir() if not p.name.endswith(".tmp")]


class UnlistedDirTier(HexDirTier):
    def list_chunks(self) -> list[bytes]:
        raise NotImplementedError


def build(cls: type[HexDirTier], root: Path, **config: Any) -> tuple[HexDirTier, bytearray]:
    buf = bytearray(os.urandom(SPEC.total_bytes))
    return cls(offloading_spec=SPEC, primary_kv_view=memoryview(buf), root=str(root), **config), buf


def test_chunks_of_an_earlier_process_are_indexed_counted_and_evicted(tmp_path: Path) -> None:
    per = SPEC.chunk_bytes  # stored_size(): the payload (the framing's header is not counted)
    keys = [b"old-%d" % i for i in range(4)]

    async def main() -> None:
        tier, _ = build(HexDirTier, tmp_path, capacity_bytes=4 * per)
        async with tier:
            assert (await tier.offload(keys, [0, 1, 2, 3])).ok
        tier, _ = build(HexDirTier, tmp_path, capacity_bytes=4 * per)
        async with tier:
            assert await tier.lookup(keys) == [True] * 4
            s = tier.stats()
            assert s.stored_chunks == 4 and s.used_bytes == 4 * per
            assert (await tier.offload([b"new-0", b"new-1"], [4, 5])).ok  # the tier is full: two go
            assert sum(await tier.lookup(keys)) == 2 and tier.stats().stored_chunks == 4
        on_disk = sorted(p.name for p in tier.dir.iterdir())
        assert len(on_disk) == 4, on_disk

    anyio.run(main)


def test_an_indexed_tier_that_cannot_list_says_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        tier, _ = build(UnlistedDirTier, tmp_path)
        with caplog.at_level(logging.WARNING):
            async with tier:
                assert tier.stats().stored_chunks == 0

    anyio.run(main)
    assert "cannot list its chunks" in caplog.text
