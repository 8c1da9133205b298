"""asynctier: an async storage-tier runtime for LLM KV caches.

Built-in tiers (``memory``, ``fs``, ``nvme``, ``obj``, ``chain``, ``valkey``) are registered here by module path
only; their modules and client libraries are imported when a tier of that type is first
built.
"""

from __future__ import annotations

from .contract import SecondaryTierManager
from .core import AsyncChunkTier, BlockingChunkTier, ChunkTier
from .errors import (
    AsyncTierError,
    BackpressureError,
    CapacityError,
    ChunkError,
    ChunkNotFoundError,
    ChunkTimeoutError,
    IntegrityError,
    MediumDamagedError,
    TierClosedError,
    TierConfigError,
    TierNotOpenError,
    TierStateError,
    TierUnavailableError,
)
from .factory import ENTRY_POINT_GROUP, SecondaryTierFactory
from .spec import OffloadingSpec
from .stats import LatencySummary, TierStats, TransferFailedError, TransferResult

__version__ = "0.1.0"

__all__ = [
    "AsyncChunkTier",
    "AsyncTierError",
    "BackpressureError",
    "BlockingChunkTier",
    "CapacityError",
    "ChunkError",
    "ChunkNotFoundError",
    "ChunkTier",
    "ChunkTimeoutError",
    "ENTRY_POINT_GROUP",
    "IntegrityError",
    "MediumDamagedError",
    "LatencySummary",
    "OffloadingSpec",
    "SecondaryTierFactory",
    "SecondaryTierManager",
    "TierClosedError",
    "TierConfigError",
    "TierNotOpenError",
    "TierStateError",
    "TierStats",
    "TierUnavailableError",
    "TransferFailedError",
    "TransferResult",
    "__version__",
]

BUILTIN_TIERS = {
    "memory": ("asynctier.tiers.memory", "MemoryTier"),
    "fs": ("asynctier.tiers.fs", "FsTier"),
    "nvme": ("asynctier.tiers.nvme", "NvmeTier"),
    "obj": ("asynctier.tiers.obj", "ObjTier"),
    "chain": ("asynctier.tiers.chain", "ChainTier"),
    "valkey": ("asynctier.tiers.valkey", "ValkeyTier"),
}

for _type, (_module, _cls) in BUILTIN_TIERS.items():
    SecondaryTierFactory.register_tier(_type, _module, _cls)
del _type, _module, _cls
