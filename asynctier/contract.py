"""The async contract every secondary tier implements: :class:`SecondaryTierManager`.

Semantics users rely on (and :mod:`asynctier.testing` checks for every tier):

* **Construction does no I/O.** ``await tier.open()`` (or ``async with tier``) scans,
  connects, recovers; ``await tier.aclose()`` lets calls in progress finish, then releases.
  Both are idempotent. A closed tier stays closed.
* **Per-chunk failures are returned, never raised.** ``offload``/``load``/``remove`` return a
  :class:`~asynctier.stats.TransferResult` in which every key is either in ``succeeded`` or in
  ``failed`` (key -> exception). A failure is never reported as success; a failed load
  leaves that primary slot's content unspecified.
* **Programmer errors raise at once, before any I/O:** keys that are not a sequence of
  non-empty ``bytes``, duplicate keys in one call, ``len(keys) != len(chunk_ids)``, a chunk
  id out of range, a read-only view for ``load``, a tier not open or closed.
* **Bounded concurrency:** at most ``max_inflight`` chunk I/Os run at once across all
  callers; one call's chunks run in parallel up to that bound; loads go ahead of queued
  stores; stores either wait for room or are dropped (``store_backpressure``). A tier that
  coalesces adjacent small chunks into one I/O (the nvme tier's groups, up to
  ``coalesce_bytes``) counts that I/O once.
* **Cancellation:** when the awaiting task is cancelled, no new chunk I/O of that call
  starts, and ``CancelledError`` reaches the caller only after every I/O already touching the
  caller's buffer has finished. The caller may reuse its slots the moment it regains
  control. An offload cancelled part-way leaves each key either fully stored or absent.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from types import TracebackType
from typing import Any, ClassVar

from .spec import OffloadingSpec
from .stats import TierStats, TransferResult

__all__ = ["SecondaryTierManager"]


class SecondaryTierManager(abc.ABC):
    """A secondary storage tier for chunks of the primary KV buffer, driven from async code.

    Implement this directly for full control, or subclass
    :class:`asynctier.core.BlockingChunkTier` / :class:`asynctier.core.AsyncChunkTier`
    and write only the per-chunk primitives.

    The factory constructs tiers as ``cls(offloading_spec=..., primary_kv_view=...,
    tier_type=..., **config)``.
    """

    #: Short name of the tier kind (``"fs"``); instances carry the configured ``tier_type``.
    default_type: ClassVar[str] = ""

    offloading_spec: OffloadingSpec
    tier_type: str

    @abc.abstractmethod
    async def open(self) -> SecondaryTierManager:
        """Open the medium (scan, connect, recover). Idempotent; returns ``self``."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Let calls in progress finish, then release the medium. Idempotent."""

    @abc.abstractmethod
    async def offload(self, keys: Sequence[bytes], chunk_ids: Sequence[int]) -> TransferResult:
        """Store primary chunks ``chunk_ids[i]`` under ``keys[i]``. Keys already stored are kept."""

    @abc.abstractmethod
    async def load(self, keys: Sequence[bytes], chunk_ids: Sequence[int]) -> TransferResult:
        """Read the chunks stored under ``keys[i]`` into primary chunks ``chunk_ids[i]``."""

    @abc.abstractmethod
    async def lookup(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key is stored (a hint: a later load may still miss)."""

    async def lookup_prefix(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` are stored: the length of the prefix a load could serve.

        ``keys`` are the chunk keys of one sequence in order (a prefix-caching server's
        question). A hint like :meth:`lookup`. The default asks :meth:`lookup` once for all
        keys; tiers with an index answer without I/O.
        """
        hits = await self.lookup(keys)
        n = 0
        for hit in hits:
            if not hit:
                break
            n += 1
        return n

    @abc.abstractmethod
    async def remove(self, keys: Sequence[bytes]) -> TransferResult:
        """Delete the chunks stored under ``keys``; absent keys count as removed."""

    @abc.abstractmethod
    async def touch(self, keys: Sequence[bytes]) -> None:
        """Mark keys as recently used (they are evicted last)."""

    @abc.abstractmethod
    async def drain(self) -> None:
        """Wait until every call in progress (from any task) has finished."""

    @abc.abstractmethod
    def stats(self) -> TierStats:
        """A snapshot of the tier's counters."""

    async def __aenter__(self) -> SecondaryTierManager:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        spec: Any = getattr(self, "offloading_spec", None)
        ns = f" namespace={spec.namespace!r}" if spec is not None else ""
        return f"<{type(self).__name__} type={getattr(self, 'tier_type', '?')!r}{ns}>"
