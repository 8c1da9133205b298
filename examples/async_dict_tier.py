"""A custom tier whose primitives are coroutines (for tiers built on async clients).

Chunks live in a dict; each primitive yields to the event loop as an async client would
(through anyio, so the tier runs on asyncio, uvloop and trio).
Use it with: {"type": "AsyncDictTier", "module_path": "async_dict_tier"}
"""

from __future__ import annotations

import anyio
from typing import Any

from asynctier import AsyncChunkTier, ChunkNotFoundError


class AsyncDictTier(AsyncChunkTier):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._chunks: dict[bytes, bytes] = {}

    async def write_chunk(self, key: bytes, data: memoryview) -> None:
        await anyio.sleep(0)  # where a real client would await the network
        self._chunks[key] = bytes(data)

    async def read_chunk(self, key: bytes, out: memoryview) -> None:
        await anyio.sleep(0)
        try:
            out[:] = self._chunks[key]
        except KeyError:
            raise ChunkNotFoundError("not stored", key) from None

    async def chunk_exists(self, key: bytes) -> bool:
        return key in self._chunks

    async def delete_chunk(self, key: bytes) -> bool:
        return self._chunks.pop(key, None) is not None
