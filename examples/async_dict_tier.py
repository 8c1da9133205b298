"""A custom tier whose primitives are coroutines (for tiers built on async clients).

Records live in a dict; each primitive yields to the event loop as an async client would
(through anyio, so the tier runs on asyncio, uvloop and trio). With ``frames_own_bytes =
False`` the base class frames each chunk (key, length, layout, checksum, payload) and checks
what ``read_chunk`` returns, so the four primitives get integrity for free.
Use it with: {"type": "AsyncDictTier", "module_path": "async_dict_tier"}
"""

from __future__ import annotations

from typing import Any

import anyio.lowlevel

from asynctier import AsyncChunkTier, ChunkNotFoundError, IntegrityError


class AsyncDictTier(AsyncChunkTier):
    frames_own_bytes = False  # the base class frames and checks every record
    persistent = False  # in process memory: a new instance starts empty

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._records: dict[bytes, bytes] = {}

    async def write_chunk(self, key: bytes, data: memoryview) -> None:
        await anyio.lowlevel.checkpoint()  # where a real client would await the network
        self._records[key] = bytes(data)

    async def read_chunk(self, key: bytes, out: memoryview) -> None:
        await anyio.lowlevel.checkpoint()
        try:
            record = self._records[key]
        except KeyError:
            raise ChunkNotFoundError("not stored", key) from None
        if len(record) != len(out):  # a bad copy: the base class removes it
            raise IntegrityError(f"stored record is {len(record)} bytes, expected {len(out)}", key)
        out[:] = record

    async def chunk_exists(self, key: bytes) -> bool:
        return key in self._records

    async def delete_chunk(self, key: bytes) -> bool:
        return self._records.pop(key, None) is not None
