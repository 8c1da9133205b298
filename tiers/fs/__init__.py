"""``fs``: one file per chunk on any POSIX file system (local disks, NFS, Lustre, ...).

``{"type": "fs", "root": "/mnt/nvme/kv", "capacity_bytes": 500 << 30}``

One checksummed file per chunk, published atomically, under a namespace directory per
(namespace, chunk size, format) with 256 shards; capacity-bounded (LRU eviction, evicted
files recycled in place), rebuilt from disk at ``open()``. The format and its recovery:
docs/tiers/fs.md. Modules: :mod:`.layout` (names, shards), :mod:`.owners` (who else has the
namespace open), :mod:`.scan` (recovery), :mod:`.pool` (files made ahead), :mod:`.protocol`
(what a store, load or eviction does), :mod:`.threads` and :mod:`.native` (the two engines
that run it), :mod:`.tier` (:class:`FsTier`).
"""

from .layout import HEADER_BLOCK, N_SHARDS
from .tier import FsTier

__all__ = ["FsTier", "HEADER_BLOCK", "N_SHARDS"]
