"""The chain's background writes: write-back, promotion, demotion.

Each item is one chunk in a staging slot the background owns, to be written into one or more
tiers. Each tier has a lane of its own (a queue and one writer task), so a slow or dead tier
holds up only its own lane: the fs lane goes on while the obj lane waits out its deadline.
A writer takes up to ``batch`` items at a time and writes them in one call. The slot goes
back to the pool when every lane it was queued on is done with it.

A remove must win over background work of the same key, whenever that work was queued: the
:class:`RemovalFence` stamps each removal, an item queued before a removal of its key is
dropped, and a removal waits for a write of its key already running before it deletes.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import anyio

from asynctier.core.backend import spawn_service

from .member import Member
from .staging import StagingPool

__all__ = ["Backlog", "Item", "RemovalFence"]

log = logging.getLogger("asynctier.chain")

#: Removal stamps kept per key; older ones are summarised by a floor (items older than it drop).
_FENCE_KEYS = 65536


class RemovalFence:
    """Removal stamps per key, and the background writes running per key."""

    def __init__(self) -> None:
        self.epoch = 0
        self._removed_at: OrderedDict[bytes, int] = OrderedDict()
        self._floor = 0  # every removal older than this may have been forgotten
        self._running: dict[bytes, tuple[int, anyio.Event]] = {}

    def now(self) -> int:
        return self.epoch

    def stale(self, key: bytes, since: int) -> bool:
        """Whether ``key`` was (or may have been) removed after ``since``."""
        at = self._removed_at.get(key)
        return (at is not None and at > since) or self._floor > since

    def removing(self, keys: Sequence[bytes]) -> None:
        """Stamp a removal of ``keys`` (before it deletes anything)."""
        self.epoch += 1
        for k in keys:
            self._removed_at[k] = self.epoch
            self._removed_at.move_to_end(k)
        while len(self._removed_at) > _FENCE_KEYS:
            _, at = self._removed_at.popitem(last=False)
            self._floor = max(self._floor, at)

    def begin(self, keys: Sequence[bytes]) -> None:
        for k in keys:
            n, ev = self._running.get(k, (0, anyio.Event()))
            self._running[k] = (n + 1, ev)

    def end(self, keys: Sequence[bytes]) -> None:
        for k in keys:
            n, ev = self._running[k]
            if n == 1:
                del self._running[k]
                ev.set()
            else:
                self._running[k] = (n - 1, ev)

    async def wait_running(self, keys: Sequence[bytes]) -> None:
        """Until no background write of ``keys`` runs."""
        for k in keys:
            got = self._running.get(k)
            if got is not None:
                await got[1].wait()


@dataclass(eq=False)
class Item:
    """One chunk in a background-owned staging slot, to be written into some tiers."""

    key: bytes
    slot: int
    epoch: int
    reason: str  # "store" (write-back), "promote" or "demote"
    lanes: int = 0  # lanes it is still queued on or being written by
    #: called once on the loop when every lane is done: the tiers that stored it
    after: Callable[[list[Member]], None] | None = None
    stored_in: list[Member] = field(default_factory=list)


_REASON_COUNTER = {"store": "written_back", "promote": "promotions", "demote": "demotions"}


class Backlog:
    """Per-tier lanes of background writes, bounded by the pool's background slots."""

    def __init__(self, pool: StagingPool, fence: RemovalFence, members: list[Member], batch: int, chunk: int) -> None:
        self.pool = pool
        self.fence = fence
        self.members = members
        self.batch = batch
        self.chunk = chunk
        self._queues: dict[int, deque[Item]] = {m.index: deque() for m in members}
        # events are made on the event loop, at start()
        self._wake: dict[int, anyio.Event] = {}
        self._stopping = False
        self._ended: dict[int, anyio.Event] = {}
        self._idle: anyio.Event | None = None
        self._items = 0  # items not yet finished

    @property
    def depth(self) -> int:
        """Chunks held by background work now (queued or being written)."""
        return self._items

    def start(self) -> None:
        self._idle = anyio.Event()
        self._idle.set()
        for m in self.members:
            self._wake[m.index] = anyio.Event()
            self._ended[m.index] = anyio.Event()
            spawn_service(lambda m=m: self._lane(m), name=f"asynctier-chain-{m.name}-writer")  # type: ignore[misc]

    def submit(self, key: bytes, slot: int, epoch: int, reason: str, targets: list[Member],
               after: Callable[[list[Member]], None] | None = None) -> None:  # fmt: skip
        """Queue a background-owned ``slot`` holding ``key`` for ``targets`` (none: freed now)."""
        item = Item(key, slot, epoch, reason, after=after)
        if not targets or self._stopping:
            for m in targets:
                m.count("drops")
            self._finish(item, counted=False)
            return
        self._items += 1
        if self._idle is None or self._idle.is_set():
            self._idle = anyio.Event()
        for m in targets:
            item.lanes += 1
            m.backlog += 1
            self._queues[m.index].append(item)
            self._wake[m.index].set()

    def _finish(self, item: Item, counted: bool = True) -> None:
        self.pool.release_background(item.slot)
        if counted:
            self._items -= 1
            if self._items == 0 and self._idle is not None:
                self._idle.set()
        if item.after is not None:
            try:
                item.after(item.stored_in)
            except Exception:
                log.exception("chain: background completion of key %s failed", item.key.hex()[:32])

    def _done_on_lane(self, item: Item) -> None:
        item.lanes -= 1
        if item.lanes == 0:
            self._finish(item)

    async def _lane(self, m: Member) -> None:
        queue = self._queues[m.index]
        try:
            while True:
                if not queue:
                    if self._stopping:
                        break
                    self._wake[m.index] = anyio.Event()
                    await self._wake[m.index].wait()
                    continue
                batch = [queue.popleft() for _ in range(min(self.batch, len(queue)))]
                m.backlog -= len(batch)
                await self._write(m, batch)
        except Exception:  # never: a lane that ended would strand its items' slots
            log.exception("chain: background writer of tier %r failed", m.name)
        finally:
            self._ended[m.index].set()

    async def _write(self, m: Member, batch: list[Item]) -> None:
        live: list[Item] = []
        for it in batch:
            if self.fence.stale(it.key, it.epoch) or not m.available:
                m.count("drops")
                self._done_on_lane(it)
            else:
                live.append(it)
        if not live:
            return
        keys = [it.key for it in live]
        self.fence.begin(keys)
        m.background_in_flight += len(live)
        try:
            with anyio.CancelScope(shield=True):  # a write once started ends (the tier's deadline bounds it)
                res = await m.call("offload", keys, [it.slot for it in live])
        finally:
            m.background_in_flight -= len(live)
            self.fence.end(keys)
        ok = set(res.succeeded)
        for it in live:
            if it.key in ok:
                it.stored_in.append(m)
                m.count(_REASON_COUNTER[it.reason])
                m.count("bytes_in", self.chunk)
            else:
                m.count("drops")
            self._done_on_lane(it)

    async def drain(self) -> None:
        """Until every chunk queued so far is written (or dropped)."""
        while self._idle is not None and not self._idle.is_set():
            await self._idle.wait()

    async def stop(self) -> None:
        """Write what is queued, then end the lanes."""
        self._stopping = True
        for ev in self._wake.values():
            ev.set()
        for ev in self._ended.values():
            await ev.wait()
