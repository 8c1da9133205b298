"""Demotion: the first tier as a victim cache's front.

With ``demote=True`` a background task keeps the first tier ``demote_headroom_chunks`` below
its ``capacity_bytes``: after stores and promotions into it, it takes the least recently used
chunks, copies each into a background staging slot, writes it into the second tier, and only
then removes it from the first. A chunk therefore never leaves the first tier before the
second holds it, and the first tier's own eviction (which loses the chunk) happens only when
demotion falls behind (counted: ``evictions`` of the first tier). Staging slots come from the
same backlog bound as write-back; with none free, demotion waits for the next round.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio

from asynctier.core.backend import spawn_service
from asynctier.core.base import ChunkTier
from asynctier.errors import TierConfigError

if TYPE_CHECKING:
    from .background import RemovalFence
    from .member import Member
    from .staging import StagingPool

__all__ = ["Demoter"]

log = logging.getLogger("asynctier.chain")


class Demoter:
    """Moves the first tier's least recently used chunks into the second tier."""

    def __init__(self, members: list[Member], pool: StagingPool, fence: RemovalFence, chunk_bytes: int,
                 headroom_chunks: int) -> None:  # fmt: skip
        # never the chain itself: this task must not keep a chain dropped without aclose() alive
        top = members[0].tier
        if not isinstance(top, ChunkTier) or top.index is None or top.capacity_bytes is None:
            raise TierConfigError(
                "chain: demote=True needs a first tier that keeps an index and has capacity_bytes "
                f"(memory or fs with capacity_bytes); tiers[0] is {top.tier_type!r} "
                f"with capacity_bytes={getattr(top, 'capacity_bytes', None)!r}"
            )
        if headroom_chunks * top.stored_size() >= top.capacity_bytes:
            raise TierConfigError(
                f"chain: demote_headroom_chunks={headroom_chunks} ({headroom_chunks * top.stored_size()} bytes) "
                f"leaves no room in tiers[0], of capacity_bytes={top.capacity_bytes}: every chunk would be "
                "demoted as it is stored; use fewer headroom chunks than the first tier holds"
            )
        self.members = members
        self.pool = pool
        self.fence = fence
        self.chunk_bytes = chunk_bytes
        self.top = top
        self.headroom_chunks = headroom_chunks
        self._wake: anyio.Event | None = None  # made on the event loop, at start()
        self._idle: anyio.Event | None = None
        self._ended: anyio.Event | None = None
        self._stopping = False

    def start(self) -> None:
        self._wake = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
        self._ended = anyio.Event()
        spawn_service(self._run, name="asynctier-chain-demoter")

    def poke(self) -> None:
        """The first tier grew: demote if it is over its mark."""
        if self._over() and self._wake is not None and self._idle is not None:
            if self._idle.is_set():
                self._idle = anyio.Event()
            self._wake.set()

    def _limit(self) -> int:
        cap = self.top.capacity_bytes
        assert cap is not None
        return max(0, cap - self.headroom_chunks * self.top.stored_size())

    def _over(self) -> bool:
        idx = self.top.index
        return idx is not None and idx.used_bytes > self._limit()

    async def _run(self) -> None:
        assert self._wake is not None and self._idle is not None and self._ended is not None
        try:
            while not self._stopping:
                if not self._wake.is_set():
                    self._idle.set()
                    await self._wake.wait()
                self._wake = anyio.Event()
                if self._stopping:
                    break
                try:
                    await self._round()
                except Exception:
                    log.exception("chain: demotion round failed")
        finally:
            if self._idle is not None:
                self._idle.set()
            self._ended.set()

    async def _round(self) -> None:
        upper, lower = self.members[0], self.members[1]
        pool, fence = self.pool, self.fence
        idx = self.top.index
        assert idx is not None
        size = self.top.stored_size()
        while self._over() and not self._stopping:
            need = -(-(idx.used_bytes - self._limit()) // size)
            victims = idx.keys()[: max(need, 1)]
            if not victims:
                return
            epoch = fence.open()
            slots: list[int] = []
            try:
                present = await lower.lookup(victims)
                assert isinstance(present, list)
                copy = [v for v, p in zip(victims, present) if not p and lower.admits(v, "demote")]
                for _ in copy:
                    slot = pool.take_background()
                    if slot is None:
                        break
                    slots.append(slot)
                copy = copy[: len(slots)]
                moved = [v for v, p in zip(victims, present) if p]
                if copy:
                    got = await upper.call("load", copy, slots)
                    ok = set(got.succeeded)
                    live = [(v, s) for v, s in zip(copy, slots) if v in ok and not fence.stale(v, epoch)]
                    keys = [v for v, _ in live]
                    fence.begin(keys)
                    lower.background_in_flight += len(keys)
                    try:
                        wrote = await lower.call("offload", keys, [s for _, s in live])
                    finally:
                        lower.background_in_flight -= len(keys)
                        fence.end(keys)
                    lower.count("demotions", len(wrote.succeeded))
                    lower.count("bytes_in", wrote.bytes_transferred)
                    lower.count("drops", len(keys) - len(wrote.succeeded))
                    moved += wrote.succeeded
            finally:
                fence.close(epoch)
                pool.release_background(slots)
            if not moved:
                return  # nothing could move this round (backlog full, second tier failing)
            await upper.call("remove", moved, [])

    async def drain(self) -> None:
        while self._idle is not None and not self._idle.is_set():
            await self._idle.wait()

    def abandon(self) -> None:
        """End the task (on the event loop) after the round in progress."""
        self._stopping = True
        if self._wake is not None:
            self._wake.set()

    async def stop(self) -> None:
        self.abandon()
        if self._ended is not None:
            await self._ended.wait()
