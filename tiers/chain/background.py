"""The chain's background writes: write-back, promotion, demotion.

Each item is one chunk in a staging slot the background owns, to be written into one or more
tiers. Each tier has a lane of its own (a queue and one writer task), so a slow or dead tier
holds up only its own lane: the fs lane goes on while the obj lane waits out its deadline.
A writer takes up to ``batch`` items at a time and writes them in one call. The slot goes
back to the pool when every lane it was queued on is done with it. Everything here is done
per batch, not per chunk: a call's batch is queued at once (one wake-up per lane), a lane
returns the slots of its batch at once.

A lane's task holds no reference to the chain: a chain dropped without ``aclose()`` is
collected, and its finalizer (:meth:`Backlog.abandon`, run on the event loop) ends the lanes
once what is queued is written, so its tiers are collected and their own workers end too.

A lane also refreshes its tier: a key a tier above served is touched here (:meth:`Backlog.refresh`),
so this tier's LRU sees the use and does not evict the hottest chunks first. Touches are
batched per lane (one ``touch`` call for whatever gathered while the lane was busy), run before
the lane's next write, and are bounded (:data:`_TOUCH_KEYS` per lane; beyond it, counted).

A remove must win over background work of the same key, whenever that work was queued: the
:class:`RemovalFence` stamps each removal, an item queued before a removal of its key is
dropped, and a removal waits for a write of its key already running before it deletes.

A load may be served from a staging slot still queued here (:meth:`Backlog.hold`): the first
tier can evict a chunk before its write-back reaches the tier below, and the chunk was
acknowledged as stored.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict, deque
from collections.abc import Sequence

import anyio

from asynctier.core.backend import spawn_service
from asynctier.untracked import untracked

from .member import Member
from .staging import StagingPool

__all__ = ["Backlog", "Item", "RemovalFence"]

log = logging.getLogger("asynctier.chain")

#: Keys waiting to be touched per lane at most; more are dropped (counted in ``touch_drops``).
_TOUCH_KEYS = 8192

#: Removal stamps kept per key; older ones are summarised by a floor (items older than it drop).
_FENCE_KEYS = 65536


class RemovalFence:
    """Removal stamps per key, and the background writes running per key."""

    def __init__(self) -> None:
        self.epoch = 0
        # (keys and ints: left out of the cycle collector, which read all of it at each full pass)
        self._removed_at: OrderedDict[bytes, int] = untracked(OrderedDict())
        self._floor = 0  # every removal older than this may have been forgotten
        self._running: dict[bytes, int] = {}  # key -> background writes of it running now
        self._waiters: dict[bytes, anyio.Event] = {}  # made only when a removal waits for a key

    def now(self) -> int:
        return self.epoch

    def stale(self, key: bytes, since: int) -> bool:
        """Whether ``key`` was (or may have been) removed after ``since``."""
        if self._floor > since:
            return True
        at = self._removed_at.get(key)
        return at is not None and at > since

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
        running = self._running
        for k in keys:
            running[k] = running.get(k, 0) + 1

    def end(self, keys: Sequence[bytes]) -> None:
        running = self._running
        for k in keys:
            n = running[k]
            if n == 1:
                del running[k]
                if self._waiters:
                    ev = self._waiters.pop(k, None)
                    if ev is not None:
                        ev.set()
            else:
                running[k] = n - 1

    async def wait_running(self, keys: Sequence[bytes]) -> None:
        """Until no background write of ``keys`` runs."""
        for k in keys:
            while k in self._running:
                ev = self._waiters.get(k)
                if ev is None:
                    ev = self._waiters[k] = anyio.Event()
                await ev.wait()


class Item:
    """One chunk in a background-owned staging slot, to be written into some tiers."""

    __slots__ = ("epoch", "key", "lanes", "reason", "slot")

    def __init__(self, key: bytes, slot: int, epoch: int, reason: str, lanes: int) -> None:
        self.key = key
        self.slot = slot
        self.epoch = epoch
        self.reason = reason  # "store" (write-back), "promote" or "demote"
        self.lanes = lanes  # lanes it is still queued on or being written by


_REASON_COUNTER = {"store": "written_back", "promote": "promotions", "demote": "demotions"}


class _Lane:
    """One tier's queue and the event its writer waits on (made on the event loop)."""

    __slots__ = ("ended", "member", "queue", "touches", "wake")

    def __init__(self, member: Member) -> None:
        self.member = member
        self.queue: deque[Item] = deque()
        self.touches: dict[bytes, None] = {}  # keys to touch, in order, once each
        self.wake = anyio.Event()
        self.ended = anyio.Event()


class Backlog:
    """Per-tier lanes of background writes, bounded by the pool's background slots."""

    def __init__(self, pool: StagingPool, fence: RemovalFence, members: list[Member], batch: int, chunk: int) -> None:
        self.pool = pool
        self.fence = fence
        self.members = members
        self.batch = batch
        self.chunk = chunk
        self._lanes: dict[int, _Lane] = {}  # made on the event loop, at start()
        self._stopping = False
        self._idle: anyio.Event | None = None
        self._items = 0  # items not yet finished
        self._touching = 0  # lanes with touches waiting or running
        self._newest: dict[bytes, Item] = {}  # each key's latest item not yet finished
        #: loads served from a slot still queued here (:meth:`hold`)
        self.hits = 0

    @property
    def depth(self) -> int:
        """Chunks held by background work now (queued or being written)."""
        return self._items

    def start(self) -> None:
        self._idle = anyio.Event()
        self._idle.set()
        for m in self.members:
            lane = self._lanes[m.index] = _Lane(m)
            spawn_service(lambda lane=lane: self._run(lane), name=f"asynctier-chain-{m.name}-writer")  # type: ignore[misc]

    def submit(self, entries: Sequence[tuple[bytes, int, list[Member]]], epoch: int, reason: str) -> None:
        """Queue background-owned slots: each ``(key, slot, targets)`` holds ``key`` for the
        tiers ``targets`` (none: the slot is freed now). One wake-up per lane for them all."""
        freed: list[int] = []
        woken: set[int] = set()
        for key, slot, targets in entries:
            if not targets or self._stopping:
                for m in targets:
                    m.count("drops")
                freed.append(slot)
                continue
            item = Item(key, slot, epoch, reason, len(targets))
            self._newest[key] = item
            self._items += 1
            for m in targets:
                m.backlog += 1
                self._lanes[m.index].queue.append(item)
                woken.add(m.index)
        self._busy()
        for i in woken:
            self._lanes[i].wake.set()
        self.pool.release_background(freed)

    def refresh(self, keys: Sequence[bytes], targets: Sequence[Member]) -> None:
        """Touch ``keys`` in the tiers ``targets``, in the background (a tier above served
        them: the tiers below should see the use too). Never waits."""
        if self._stopping or not keys:
            return
        for m in targets:
            lane = self._lanes[m.index]
            touches = lane.touches
            if not touches and not lane.member.touching:
                self._touching += 1
                lane.member.touching = True
            room = _TOUCH_KEYS - len(touches)
            if room < len(keys):
                m.count("touch_drops", len(keys) - max(room, 0))
                keys_in = keys[: max(room, 0)]
            else:
                keys_in = keys
            touches.update(dict.fromkeys(keys_in))
            lane.wake.set()
        self._busy()

    def _busy(self) -> None:
        if (self._items or self._touching) and self._idle is not None and self._idle.is_set():
            self._idle = anyio.Event()

    def _settle(self) -> None:
        if self._items == 0 and self._touching == 0 and self._idle is not None:
            self._idle.set()

    def has(self, key: bytes) -> bool:
        """Whether a load of ``key`` would find it here (:meth:`hold`), without holding it."""
        it = self._newest.get(key)
        return it is not None and not self.fence.stale(key, it.epoch)

    def hold(self, key: bytes) -> Item | None:
        """The latest queued (or running) item of ``key`` not removed since it was queued, its
        slot held until :meth:`release` (a load copies from it); None if there is none."""
        it = self._newest.get(key)
        if it is None or self.fence.stale(key, it.epoch):
            return None
        it.lanes += 1  # the slot is freed when the last holder, lane or load, is done with it
        return it

    def release(self, items: list[Item]) -> None:
        """Give back what :meth:`hold` returned."""
        self._done(items)

    def _done(self, items: list[Item]) -> None:
        """A lane (or a load) is done with ``items``: the slots nothing else needs go back."""
        freed = []
        for it in items:
            it.lanes -= 1
            if it.lanes == 0:
                freed.append(it.slot)
                if self._newest.get(it.key) is it:
                    del self._newest[it.key]
        if freed:
            self._items -= len(freed)
            self.pool.release_background(freed)
            self._settle()

    async def _run(self, lane: _Lane) -> None:
        m, queue = lane.member, lane.queue
        try:
            while True:
                if lane.touches:  # cheap, and it is what keeps the tier's LRU right: first
                    keys = list(lane.touches)
                    lane.touches.clear()
                    await self._touch(m, keys)
                    if not lane.touches:
                        m.touching = False
                        self._touching -= 1
                        self._settle()
                    continue
                if not queue:
                    if self._stopping:
                        break
                    lane.wake = anyio.Event()
                    await lane.wake.wait()
                    continue
                batch = [queue.popleft() for _ in range(min(self.batch, len(queue)))]
                m.backlog -= len(batch)
                await self._write(m, batch)
        except Exception:  # never: a lane that ended would strand its items' slots
            log.exception("chain: background writer of tier %r failed", m.name)
        finally:
            lane.ended.set()

    async def _touch(self, m: Member, keys: list[bytes]) -> None:
        """One ``touch`` call on ``m`` (a hint: a tier that is down or fails it misses nothing else)."""
        if not m.available:
            m.count("touch_drops", len(keys))
            return
        with (
            anyio.CancelScope(shield=True),
            anyio.move_on_after(m.deadline_s if m.deadline_s is not None else math.inf) as scope,
        ):
            try:
                await m.tier.touch(keys)
            except Exception:
                log.debug("chain: touching %d keys in tier %r failed", len(keys), m.name, exc_info=True)
                m.count("touch_drops", len(keys))
                return
        if scope.cancelled_caught:
            m.count("touch_drops", len(keys))
        else:
            m.count("touched", len(keys))

    async def _write(self, m: Member, batch: list[Item]) -> None:
        stale = self.fence.stale
        live: list[Item] = []
        dead: list[Item] = []
        up = m.available
        newest = {it.key: it for it in batch}  # a key stored twice meanwhile: its latest copy
        superseded: list[Item] = []  # an older copy of a key written now: not a drop
        for it in batch:
            if newest[it.key] is not it:
                superseded.append(it)
            else:
                (live if up and not stale(it.key, it.epoch) else dead).append(it)
        if dead:
            m.count("drops", len(dead))
        if dead or superseded:
            self._done(dead + superseded)
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
        failed, counts = res.failed, m.counts
        for it in live:
            if it.key in failed:
                counts["drops"] += 1
            else:
                counts[_REASON_COUNTER[it.reason]] += 1
                counts["bytes_in"] += self.chunk
        self._done(live)

    async def drain(self) -> None:
        """Until every chunk queued so far is written (or dropped)."""
        while self._idle is not None and not self._idle.is_set():
            await self._idle.wait()

    def abandon(self) -> None:
        """The chain was dropped without ``aclose()``: end the lanes once what is queued is
        written (on the event loop; the lanes then let go of the tiers)."""
        self._stopping = True
        for lane in self._lanes.values():
            lane.wake.set()

    async def stop(self) -> None:
        """Write what is queued, then end the lanes."""
        self.abandon()
        for lane in self._lanes.values():
            await lane.ended.wait()
