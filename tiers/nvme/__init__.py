"""``nvme``: preallocated O_DIRECT slabs cut into fixed slots, with a crash-safe index.

``{"type": "nvme", "path": "/mnt/nvme/kv.slab", "capacity_bytes": 64 << 30}``, or
``{"type": "nvme", "paths": ["/mnt/a/kv.slab", "/mnt/b/kv.slab"], ...}`` to stripe slots
across several devices (slot ``g`` lives on stripe ``g % n``), or a block device
(``"path": "/dev/nvme1n1", "index_dir": "/var/lib/asynctier"``).

Each slot holds one chunk: a header block (key, length, checksum, sequence number, layout
digest) and the payload, written by one ``pwritev`` straight from the primary view when it
is block-aligned (else through a bounce buffer). Memory holds the authoritative index
(key -> slot, LRU order) so ``lookup`` is O(1); on disk it is a checkpoint plus a journal of
``PUBLISH`` / ``EVICT`` records, so no acknowledged chunk is lost and no wrong bytes are
served after a crash at any moment. docs/tiers/nvme.md gives the byte layouts, the order of
writes and what recovery trusts.

Modules: :mod:`.format` (byte layouts), :mod:`.slab` (slabs, superblocks, geometry, slot
I/O), :mod:`.slots` (the in-memory index), :mod:`.journal`, :mod:`.checkpoint`,
:mod:`.catalog` (index and journal together: allocate, publish, evict, recover),
:mod:`.groups` (coalesced jobs), :mod:`.tier` (:class:`NvmeTier`).
"""

from __future__ import annotations

from .checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from .tier import NvmeTier

__all__ = ["Checkpoint", "NvmeTier", "read_checkpoint", "write_checkpoint"]
