"""What an fs chunk undoes when its call is cancelled before its I/O began.

The native engine takes such work back (:meth:`asynctier.engines.native_engine.NativeEngine.withdraw`):
a job not started by any worker, whole; of a group job a worker had begun, the files not begun
(their outcomes then say ``WITHDRAWN``); and a chunk that was to go on as a coroutine
(:class:`NotBegun`) is not run. None of their files was touched, so each chunk's plan is
undone as if it had never been made:

- a load's pin is dropped;
- a store's room is given back and the file made ahead for it closed (an unnamed file goes
  with its descriptor);
- the victims whose files a store was to take over (or delete) are indexed again, at the
  least recently used end where they were, their files still in place. Unless the store's
  room stayed taken (another call stores the same key, or stored it meanwhile): then the
  victims are deleted, as the store would have, so that the tier stays within its capacity.

The plans' shapes are :mod:`.fast`'s.
"""

from __future__ import annotations

import os
from functools import partial
from typing import TYPE_CHECKING, Any

from asynctier.core.jobs import Job
from asynctier.engines.fastpath import Continuation
from asynctier.errors import Withdrawn

if TYPE_CHECKING:
    from .native import NativeIO
    from .tier import FsTier

__all__ = ["NotBegun", "Undo", "not_begun", "undo_load", "undo_store"]

_RECYCLE = 1  # as .fast's: the store's slot was to take over its victim's file


class NotBegun(partial[Any]):
    """A chunk's continuation made when it was planned: none of its I/O has begun, and what it
    holds is in its arguments (:meth:`Undo.continuation`). ``io``: the tier's native I/O."""

    io: NativeIO


def not_begun(io: NativeIO, fn: Any, *args: Any, kind: type[NotBegun] = NotBegun) -> NotBegun:
    p = kind(fn, *args)
    p.io = io
    return p


class Undo:
    """Plans undone, gathered so that their victims go back in one step, in the order they
    were taken: :meth:`close` once done."""

    def __init__(self, io: NativeIO, tier: FsTier, restore: list[bytes] | None = None) -> None:
        """``restore``: where to put the victims to index again, for the caller to restore in
        one call later (see :meth:`close`)."""
        self.io, self.tier = io, tier
        self.chunks = 0
        self._later = restore is not None
        self._restore: list[bytes] = [] if restore is None else restore
        self._delete: list[bytes] = []

    def load(self, key: bytes, entry: object) -> Undo:
        self.chunks += 1
        self.tier.index.unpin(key, touch=False, entry=entry)
        return self

    def store(self, key: bytes, victims: list[bytes], plan: Any = None) -> Undo:
        """``key``'s room given back (and the file made for it, ``plan``'s); its ``victims``
        indexed again, or deleted where the room stays another writer's."""
        self.chunks += 1
        freed = self.tier.index.abort(key)
        if plan is not None:
            self.tier.protocol.release(plan)
        if victims:
            (self._restore if freed else self._delete).extend(victims)
        return self

    def step(self, key: bytes, step: tuple[Any, ...]) -> Undo:
        """A chunk planned for the workers (:class:`.fast.StorePath`'s step)."""
        kind, _, victims, plan, _ = step
        return self.store(key, victims, None if kind == _RECYCLE else plan)

    def continuation(self, fn: Continuation) -> None:
        """A :class:`NotBegun` not run: only a store that reserved room and chose victims to
        delete first holds anything (see :meth:`.fast.StorePath._plan_reserved`)."""
        self.chunks += 1
        if isinstance(fn, partial) and fn.func == self.tier._async_store_reserved:
            key, _, victims = fn.args[:3]
            self.chunks -= 1
            self.store(key, victims)

    def end(self) -> Continuation:
        """:meth:`close`, for one chunk whose outcome is then :class:`Withdrawn`: raised now,
        or by the continuation that deletes the victims that cannot go back."""
        rest = self.close()
        if rest is None:
            raise Withdrawn()

        async def then() -> None:
            await rest()
            raise Withdrawn()

        return then

    def close(self) -> Continuation | None:
        """Count the chunks withdrawn and put the victims back; a continuation that deletes
        those that cannot go back, if any."""
        engine = self.io.engine
        engine.withdrawn += self.chunks
        self.chunks = 0
        if self._restore and not self._later:
            self.tier.index.restore(self._restore, self.tier._chunk_size)
            self._restore = []
        if not self._delete:
            return None
        victims, self._delete = self._delete, []
        return partial(engine.blocking, _delete, self.tier, victims)


def _delete(tier: FsTier, victims: list[bytes]) -> None:
    """Evict ``victims`` as a store would have (on a slow-path thread)."""
    try:
        for v in victims:
            tier.threads.evict(v)
    finally:
        tier._removed(victims)


def undo_load(u: Undo, job: Job, plan: Any) -> None:
    """Unpin what a load job planned (``plan``: :class:`.loads.LoadPath`'s for ``job``)."""
    if not job.grouped:
        u.load(job.args[0], plan[0])
        return
    if len(plan) == 3:  # planned chunk by chunk: (outcomes, [(position, (entry, out, block))], continuations)
        keys = job.args[0]
        for i, step in plan[1]:
            u.load(keys[i], step[0])
        for _, fn in plan[2]:
            u.continuation(fn)  # (a load pins when it runs)
        return
    _, _, keys, entries = plan  # in bulk: (outcomes, positions, keys, entries)
    for key, entry in zip(keys, entries):
        u.load(key, entry)


def undo_store(u: Undo, job: Job, plan: Any) -> None:
    """Give back what a store job reserved (``plan``: :class:`.fast.StorePath`'s for ``job``)."""
    if not job.grouped:
        u.step(job.args[0], plan)
        return
    keys = job.args[0]
    for i, step in plan[1]:
        u.step(keys[i], step)
    for _, fn in plan[2]:
        u.continuation(fn)
    if len(plan) == 3:  # planned chunk by chunk
        return
    _, _, _, _, rkeys, rvictims, _, _, _, nkeys, fds = plan
    for key, victim in zip(rkeys, rvictims):  # each was to take over its victim's file
        u.store(key, [victim])
    for key in nkeys:  # each was to fill a new file
        u.store(key, [])
    for fd in fds:  # those made ahead (unnamed: they go with the descriptor)
        if fd >= 0:
            os.close(fd)
