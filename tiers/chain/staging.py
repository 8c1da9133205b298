"""The chain's staging pool: the only memory its tiers read from and write into.

Every tier of a chain is built over the chain's own staging buffer, never over the caller's
primary buffer: a store copies the caller's chunk into a staging slot, the tiers write it from
there (at once, and later in the background), and a load lands in a staging slot and is
copied into the caller's slot. So background work (write-back, promotion, demotion) reads
only slots the chain owns, and the caller may reuse its slots the moment a call returns.

The pool holds ``foreground + background`` slots. Calls hold at most ``foreground`` of them
(that is the chain's ``max_inflight``); waiting loads are served before waiting stores. The
background holds at most ``background`` (the backlog bound): a slot a call is done with is
handed to the background only while there is room, else its background work is dropped.

Slots come and go in batches (a call's batch hands its slots over at once; a lane returns the
slots of its batch at once), and a waiter is granted only once ``min_grant`` slots (or all it
wants) are free: granting each slot as it trickles back would cut calls into one-chunk batches,
each a tier call of its own.
"""

from __future__ import annotations

from collections import deque

import anyio

__all__ = ["StagingPool"]


class _Waiter:
    __slots__ = ("event", "granted", "want")

    def __init__(self, want: int) -> None:
        self.want = want
        self.event = anyio.Event()
        self.granted: list[int] = []


class StagingPool:
    """Slot numbers of the staging buffer, shared by calls (foreground) and background work."""

    def __init__(self, foreground: int, background: int) -> None:
        self.foreground = foreground
        self.background = background
        self.min_grant = max(1, foreground // 2)
        self._free: list[int] = list(range(foreground + background - 1, -1, -1))
        self.fg_used = 0
        self.bg_used = 0
        self.quarantined = 0  # slots a late tier call still holds (the chain stopped waiting for it)
        self.peak_fg = 0
        self.peak_bg = 0  # the most slots background work ever held at once (what became resident)
        self._settled: anyio.Event | None = None  # None: no late call holds a slot
        self._loads: deque[_Waiter] = deque()
        self._stores: deque[_Waiter] = deque()

    @property
    def size(self) -> int:
        return self.foreground + self.background

    def _take(self, n: int) -> list[int]:
        n = min(n, self.foreground - self.fg_used, len(self._free))
        slots = [self._free.pop() for _ in range(n)]
        self.fg_used += n
        self.peak_fg = max(self.peak_fg, self.fg_used)
        return slots

    async def acquire(self, want: int, *, load: bool, timeout_s: float | None = None) -> list[int]:
        """Up to ``want`` slots for a call, waiting until ``min(want, min_grant)`` are free
        (or, while late calls hold slots, any); loads first.

        With ``timeout_s``, returns ``[]`` when no slot came within it (a dropped store).
        """
        ahead = self._loads if load else (self._loads or self._stores)
        if not ahead and self._grantable(want):
            return self._take(want)
        w = _Waiter(want)
        (self._loads if load else self._stores).append(w)
        try:
            if timeout_s is None:
                await w.event.wait()
            else:
                with anyio.move_on_after(timeout_s):
                    await w.event.wait()
        except BaseException:
            self._withdraw(w, load)
            self.release(w.granted)
            raise
        self._withdraw(w, load)
        return w.granted

    def _withdraw(self, w: _Waiter, load: bool) -> None:
        queue = self._loads if load else self._stores
        if not w.event.is_set():
            queue.remove(w)

    def _grantable(self, want: int) -> bool:
        free = min(self.foreground - self.fg_used, len(self._free))
        # while late calls hold slots, the free count may stay low for long: take what there is
        return free >= min(want, self.min_grant) or (free > 0 and self.quarantined > 0)

    def _grant(self) -> None:
        while (self._loads or self._stores) and self._grantable((self._loads or self._stores)[0].want):
            w = (self._loads or self._stores).popleft()
            w.granted = self._take(w.want)
            w.event.set()

    def release(self, slots: list[int]) -> None:
        """A call is done with ``slots``."""
        if not slots:
            return
        self.fg_used -= len(slots)
        self._free.extend(slots)
        self._grant()

    def replacement(self, n: int) -> list[int]:
        """Up to ``n`` slots for a call at once, without waiting (none may be free)."""
        return self._take(n)

    def quarantine(self, slots: list[int]) -> None:
        """A call gives up ``slots`` that a late tier call still writes into: they stay out of
        use (and out of the call's in-flight count) until :meth:`end_quarantine`."""
        self.fg_used -= len(slots)
        self.quarantined += len(slots)
        if slots and self._settled is None:
            self._settled = anyio.Event()
        self._grant()

    def end_quarantine(self, slots: list[int]) -> None:
        """The late tier call holding ``slots`` ended."""
        self.quarantined -= len(slots)
        self._free.extend(slots)
        if self.quarantined == 0 and self._settled is not None:
            self._settled.set()
            self._settled = None
        self._grant()

    async def settled(self) -> None:
        """Until no late tier call holds a slot."""
        while self._settled is not None:
            await self._settled.wait()

    def to_background(self, n: int) -> int:
        """Hand ``n`` of a call's slots over to background work, as many as the backlog has
        room for; returns how many (the caller keeps and releases the others)."""
        n = min(n, self.background - self.bg_used)
        if n > 0:
            self.fg_used -= n
            self.bg_used += n
            self.peak_bg = max(self.peak_bg, self.bg_used)
            self._grant()
        return max(n, 0)

    def take_background(self) -> int | None:
        """A fresh slot for background work (demotion), or None when the backlog is full."""
        if self.bg_used >= self.background or not self._free:
            return None
        self.bg_used += 1
        self.peak_bg = max(self.peak_bg, self.bg_used)
        return self._free.pop()

    def release_background(self, slots: list[int]) -> None:
        """Background work is done with ``slots``."""
        if not slots:
            return
        self.bg_used -= len(slots)
        self._free.extend(slots)
        self._grant()
