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

__all__ = ["MemoryTier"]


class MemoryTier(BlockingChunkTier):
    """Chunks in process memory with LRU eviction.

    Each chunk is kept as the record the base class frames (header with key, layout digest
    and checksum, then the payload), so ``verify`` means here what it means on disk. Copies
    run on worker threads: a multi-megabyte ``memcpy`` would otherwise stall the event loop.
    """

    default_type = "memory"
    uses_index = True
    applies_timeout = False  # (local I/O: nothing cuts a system call off)
    persistent = False  # a fresh process always sees it empty

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._chunks: dict[bytes, bytearray] = {}
        self._lock = threading.Lock()

    def write_chunk(self, key: bytes, data: memoryview) -> None:
        copy = bytearray(data)  # the medium itself: one copy is the point
        with self._lock:
            self._chunks[key] = copy

    def read_chunk(self, key: bytes, out: memoryview) -> int:
        with self._lock:
            data = self._chunks.get(key)
        if data is None:
            raise ChunkNotFoundError(f"no chunk stored under key {key.hex()[:32]}", key)
        if len(data) != len(out):
            raise IntegrityError(f"stored record is {len(data)} bytes, expected {len(out)}", key)
        out[:] = data
        return len(data)

    def chunk_exists(self, key: bytes) -> bool:
        with self._lock:
            return key in self._chunks

    def delete_chunk(self, key: bytes) -> bool:
        with self._lock:
            return self._chunks.pop(key, None) is not None

    def close_medium(self) -> None:
        with self._lock:
            self._chunks.clear()
