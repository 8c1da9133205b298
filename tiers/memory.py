"""``memory``: chunks held in process memory — the reference tier.

``{"type": "memory", "capacity_bytes": 8 << 30}``

Useful for tests, as a fast in-process cache level, and as the worked example of a tier:
it writes only the four per-chunk primitives and inherits the in-flight bound, loads ahead
of stores, back-pressure, LRU eviction under ``capacity_bytes``, stats and cancellation
safety from :class:`asynctier.BlockingChunkTier`.
"""

from __future__ import annotations

import threading
from typing import Any

from asynctier import BlockingChunkTier, ChunkNotFoundError, IntegrityError
from asynctier.integrity import checksum

__all__ = ["MemoryTier"]


class MemoryTier(BlockingChunkTier):
    """Chunks in process memory with LRU eviction; checksummed so ``verify`` means the same here.

    Copies run on worker threads: a multi-megabyte ``memcpy`` would otherwise stall the
    event loop.
    """

    default_type = "memory"
    uses_index = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._chunks: dict[bytes, tuple[bytearray, int]] = {}
        self._lock = threading.Lock()

    def write_chunk(self, key: bytes, data: memoryview) -> None:
        copy = bytearray(data)  # the medium itself: one copy is the point
        entry = (copy, checksum(copy))
        with self._lock:
            self._chunks[key] = entry

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        with self._lock:
            entry = self._chunks.get(key)
        if entry is None:
            raise ChunkNotFoundError(f"no chunk stored under key {key.hex()[:32]}", key)
        data, csum = entry
        if len(data) != len(out):
            raise IntegrityError(f"stored chunk is {len(data)} bytes, expected {len(out)}", key)
        out[:] = data
        if self.verify and checksum(out) != csum:
            raise IntegrityError("chunk payload checksum mismatch", key)

    def chunk_exists(self, key: bytes) -> bool:
        with self._lock:
            return key in self._chunks

    def delete_chunk(self, key: bytes) -> bool:
        with self._lock:
            return self._chunks.pop(key, None) is not None

    def close_medium(self) -> None:
        with self._lock:
            self._chunks.clear()
