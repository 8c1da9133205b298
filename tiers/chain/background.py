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

A remove must win over background work of the same key, whenever that work was prepared: a
removal marks the items of its keys queued here dead (:meth:`Backlog.removing`), work prepared
while it ran or before it is not queued (:class:`RemovalFence`), and a removal waits for a
write of its key already running before it deletes.

A load may be served from a staging slot still queued here (:meth:`Backlog.hold`): the first
tier can evict a chunk before its write-back reaches the tier below, and the chunk was
acknowledged as stored.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence

import anyio

from asynctier.core.backend import spawn_service
from asynctier.untracked import untracked

from .member import Member
from .staging import StagingPool

__all__ = ["Backlog", "Item", "RemovalFence"]

log = logging.getLogger("asynctier.chain")

#: Keys waiting to be touched per lane at most; more are dropped (counted in ``touch_drops``).
_TOUCH_KEYS = 8192

#: Removal stamps kept at least; beyond it, those no open window is older than are forgotten.
_FENCE_KEYS = 65536


class RemovalFence:
    """Removals of keys, against the background writes of the same keys they must win over;
    and the background writes running per key.

    Background work of a key (a write-back, a promotion, a demotion) is prepared in a *window*:
    :meth:`open` before it reads or stores anything, :meth:`stale` before its write is queued or
    started, :meth:`close` after. A removal's keys are stale to every window while it runs
    (:meth:`removing` to :meth:`removed`), and to every window opened before it ended once it
    has (its stamp). Work already queued is not asked: the removal marks it dead
    (:meth:`Backlog.removing`). Stamps are forgotten only when no open window is older than
    them, so no key is ever taken for removed when it was not (a summary of forgotten stamps
    dropped every older item, and with it write-backs of keys never removed)."""

    def __init__(self) -> None:
        self.epoch = 0
        # (keys and ints: left out of the cycle collector, which read all of it at each full pass)
        self._removed_at: OrderedDict[bytes, int] = untracked(OrderedDict())
        self._removing: dict[bytes, int] = {}  # key -> removals of it running now
        self._open: dict[int, int] = {}  # epoch -> windows opened at it and not closed
        self._running: dict[bytes, int] = {}  # key -> background writes of it running now
        self._waiters: dict[bytes, anyio.Event] = {}  # made only when a removal waits for a key

    def open(self) -> int:
        """Open a window: the epoch to pass to :meth:`stale` and :meth:`close`."""
        e = self.epoch
        self._open[e] = self._open.get(e, 0) + 1
        return e

    def close(self, since: int) -> None:
        n = self._open[since]
        if n == 1:
            del self._open[since]
            self._forget()
        else:
            self._open[since] = n - 1

    def stale(self, key: bytes, since: int) -> bool:
        """Whether ``key`` is being removed, or was removed after the window ``since`` opened."""
        if key in self._removing:
            return True
        at = self._removed_at.get(key)
        return at is not None and at > since

    def removing(self, keys: Sequence[bytes]) -> None:
        """A removal of ``keys`` starts (before it deletes anything)."""
        removing = self._removing
        for k in keys:
            removing[k] = removing.get(k, 0) + 1

    def removed(self, keys: Sequence[bytes]) -> None:
        """The removal of ``keys`` :meth:`removing` announced is over (done, failed or cancelled)."""
        removing = self._removing
        self.epoch += 1
        for k in keys:
            n = removing[k]
            if n == 1:
                del removing[k]
            else:
                removing[k] = n - 1
            self._removed_at[k] = self.epoch
            self._removed_at.move_to_end(k)
        self._forget()

    def _forget(self) -> None:
        """Drop the oldest stamps beyond :data:`_FENCE_KEYS` that no open window can need (a
        stamp makes a key stale only to windows opened before it)."""
        stamps = self._removed_at
        over = len(stamps) - _FENCE_KEYS
        if over <= 0:
            return
        oldest = min(self._open) if self._open else self.epoch
        for _ in range(over):
            at = stamps[next(iter(stamps))]
            if at > oldest:
                return
            stamps.popitem(last=False)

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

    __slots__ = ("dead", "key", "lanes", "reason", "slot")

    def __init__(self, key: bytes, slot: int, reason: str, lanes: int) -> None:
        self.key = key
        self.slot = slot
        self.reason = reason  # "store" (write-back), "promote" or "demote"
        self.lanes = lanes  # lanes it is still queued on or being written by
        self.dead = False  # its key was removed after it was queued: written nowhere


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
        self._pending: dict[bytes, list[Item]] = {}  # each key's items not yet finished, oldest first
        #: loads served from a slot still queued here (:meth:`hold`)
        self.hits = 0
        #: called after a lane wrote into the first tier (promotions): the demoter's poke
        self.after_top_write: Callable[[], None] | None = None

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
        tiers ``targets`` (none: the slot is freed now), prepared in the fence's window
        ``epoch`` (a key removed since, or being removed, is not queued). One wake-up per lane
        for them all."""
        freed: list[int] = []
        woken: set[int] = set()
        stale, pending = self.fence.stale, self._pending
        for key, slot, targets in entries:
            if not targets or self._stopping or stale(key, epoch):
                for m in targets:
                    m.count("drops")
                freed.append(slot)
                continue
            item = Item(key, slot, reason, len(targets))
            items = pending.get(key)
            if items is None:
                pending[key] = [item]
            else:
                items.append(item)
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

    def removing(self, keys: Sequence[bytes]) -> None:
        """A removal of ``keys`` starts: their items queued here are written nowhere, and no
        work of them prepared before it ends is queued (call :meth:`RemovalFence.removed`
        once it is over)."""
        self.fence.removing(keys)
        pending = self._pending
        for k in keys:
            for it in pending.get(k, ()):
                it.dead = True

    def writing_back(self, key: bytes) -> bool:
        """Whether a write-back of ``key`` (a store's, to the tiers below the one that took it)
        is queued or running, not removed since."""
        return any(it.reason == "store" and not it.dead for it in self._pending.get(key, ()))

    def has(self, key: bytes) -> bool:
        """Whether a load of ``key`` would find it here (:meth:`hold`), without holding it."""
        items = self._pending.get(key)
        return items is not None and not items[-1].dead

    def hold(self, key: bytes) -> Item | None:
        """The latest queued (or running) item of ``key`` not removed since it was queued, its
        slot held until :meth:`release` (a load copies from it); None if there is none."""
        items = self._pending.get(key)
        if items is None or items[-1].dead:
            return None
        it = items[-1]
        it.lanes += 1  # the slot is freed when the last holder, lane or load, is done with it
        return it

    def release(self, items: list[Item]) -> None:
        """Give back what :meth:`hold` returned."""
        self._done(items)

    def _done(self, items: list[Item]) -> None:
        """A lane (or a load) is done with ``items``: the slots nothing else needs go back."""
        freed = []
        pending = self._pending
        for it in items:
            it.lanes -= 1
            if it.lanes == 0:
                freed.append(it.slot)
                same = pending[it.key]
                if len(same) == 1:
                    del pending[it.key]
                else:
                    same.remove(it)
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
        live: list[Item] = []
        dead: list[Item] = []
        up = m.available
        newest = {it.key: it for it in batch}  # a key stored twice meanwhile: its latest copy
        superseded: list[Item] = []  # an older copy of a key written now: not a drop
        for it in batch:
            if newest[it.key] is not it:
                superseded.append(it)
            else:
                (live if up and not it.dead else dead).append(it)
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
        if m.index == 0 and self.after_top_write is not None:  # (else the first tier evicts what only it holds)
            self.after_top_write()

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
