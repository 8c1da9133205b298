"""The runtime every helper-based tier inherits (docs/architecture.md).

:class:`BlockingChunkTier` and :class:`AsyncChunkTier` are the base classes tier authors
subclass (docs/writing-a-tier.md); :class:`ChunkTier` is what they share: the common
parameters, lifecycle, argument checks, scheduling of jobs on an engine, bookkeeping and stats.
"""

from __future__ import annotations

from .base import MAX_INFLIGHT, ChunkTier
from .blocking import BlockingChunkTier
from .bookkeeping import REMOVAL_WAIT_S
from .coroutine import AsyncChunkTier
from .ops import Op
from .validation import MAX_KEY_BYTES

__all__ = ["AsyncChunkTier", "BlockingChunkTier", "ChunkTier", "MAX_INFLIGHT", "MAX_KEY_BYTES", "Op", "REMOVAL_WAIT_S"]
