"""``valkey``: chunks as values on a Valkey or Redis server or cluster.

``{"type": "valkey", "url": "redis://host:6379", ...}``; ``rediss://`` for TLS, ``valkey://``
and ``valkeys://`` alike, several comma-separated seeds (or ``cluster=True``) for a cluster.
Built on valkey-py's asyncio client, imported by this package only (``import asynctier`` never
imports it). Config, the stored value, what to set on the server, faults and the breaker are
described in docs/tiers/valkey.md.

Modules: :mod:`.url` (the ``url`` and credentials), :mod:`.client` (building the client, one
pipeline), :mod:`.format` (key names and the stored value), :mod:`.errors` (the client's errors
as per-chunk failures), :mod:`.redact` (secrets out of every text), and :mod:`.tier` (the tier).
"""

from __future__ import annotations

from .errors import ValkeyIOError
from .tier import ValkeyTier

__all__ = ["ValkeyIOError", "ValkeyTier"]
