"""Helper base classes for tier authors: write the per-chunk primitives, inherit the rest.

:class:`BlockingChunkTier` — primitives are plain blocking functions (system calls, sync
clients); they run on ``max_inflight`` worker threads. :class:`AsyncChunkTier` — primitives
are coroutines (async clients). Both run on asyncio, uvloop and trio.

Either way the subclass writes four methods::

    write_chunk(key, data)   # store one chunk from a read-only memoryview slice
    read_chunk(key, out)     # fill `out` (a writable slice) or raise ChunkNotFoundError
    chunk_exists(key)        # -> bool
    delete_chunk(key)        # -> bool (was something deleted)

and inherits argument validation, the in-flight bound shared by all callers, loads ahead of
queued stores, store back-pressure (``wait`` or ``drop``), stats, capacity with LRU
eviction (``uses_index = True``), removal of chunks that fail verification, and
cancellation safety. The implementation lives in :mod:`asynctier.core`.
"""

from __future__ import annotations

from .core.base import MAX_INFLIGHT, ChunkTier
from .core.blocking import BlockingChunkTier
from .core.bookkeeping import REMOVAL_WAIT_S
from .core.coroutine import AsyncChunkTier
from .core.validation import MAX_KEY_BYTES

__all__ = ["AsyncChunkTier", "BlockingChunkTier", "ChunkTier", "MAX_INFLIGHT", "MAX_KEY_BYTES", "REMOVAL_WAIT_S"]
