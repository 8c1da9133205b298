"""What an fs job undoes when its call is cancelled before any worker started it.

The native engine takes such a job back from the workers' queue
(:meth:`asynctier.engines.native_engine.NativeEngine.withdraw`): none of its files was touched,
so each chunk's plan is undone as if the job had never been planned. A load's pins are
dropped; a store's room is given back, the file made ahead for it closed (an unnamed file goes
with its descriptor), and the victim whose file it was to take over is indexed again, at the
least recently used end where it was (its file is still in place). The plans' shapes are
:mod:`.fast`'s.
"""

from __future__ import annotations

import os
from functools import partial
from typing import TYPE_CHECKING, Any

from asynctier.core.jobs import Job

if TYPE_CHECKING:
    from .tier import FsTier

__all__ = ["undo_load", "undo_store"]

_RECYCLE = 1  # as .fast's: the store's slot was to take over its victim's file


def undo_load(tier: FsTier, job: Job, plan: Any) -> None:
    """Unpin what a load job planned (``plan``: :class:`.fast.LoadPath`'s for ``job``)."""
    index = tier.index
    if not job.grouped:
        index.unpin(job.args[0], touch=False, entry=plan[0])
        return
    if len(plan) == 3:  # planned chunk by chunk: (outcomes, [(position, (entry, out, block))], continuations)
        keys = job.args[0]
        for i, step in plan[1]:
            index.unpin(keys[i], touch=False, entry=step[0])
        return  # (its continuations hold nothing yet: a load pins when it runs)
    _, _, keys, entries = plan  # in bulk: (outcomes, positions, keys, entries)
    for key, entry in zip(keys, entries):
        index.unpin(key, touch=False, entry=entry)


def undo_store(tier: FsTier, job: Job, plan: Any) -> None:
    """Give back what a store job reserved (``plan``: :class:`.fast.StorePath`'s for ``job``)."""
    if not job.grouped:
        _undo_key(tier, job.args[0], plan)
        return
    keys = job.args[0]
    for i, step in plan[1]:
        _undo_key(tier, keys[i], step)
    for _, fn in plan[2]:
        _undo_continuation(tier, fn)
    if len(plan) == 3:  # planned chunk by chunk
        return
    _, _, _, _, rkeys, rvictims, _, _, _, nkeys, fds = plan
    size = tier._chunk_size
    for key, victim in zip(rkeys, rvictims):  # each was to take over its victim's file
        tier.index.abort(key)
        tier.index.restore([victim], size)
    for key in nkeys:  # each was to fill a new file
        tier.index.abort(key)
    for fd in fds:  # those made ahead (unnamed: they go with the descriptor)
        if fd >= 0:
            os.close(fd)


def _undo_key(tier: FsTier, key: bytes, step: tuple[Any, ...]) -> None:
    kind, _, victims, plan, _ = step
    tier.index.abort(key)
    if kind == _RECYCLE:
        tier.index.restore(victims, tier._chunk_size)
    else:
        tier.protocol.release(plan)


def _undo_continuation(tier: FsTier, fn: Any) -> None:
    """A chunk of the group that was to go on as a coroutine: only one that had reserved room
    and chosen victims to delete first holds anything (see :meth:`.fast.StorePath._plan_reserved`)."""
    if isinstance(fn, partial) and fn.func == tier._async_store_reserved:
        key, _, victims = fn.args[:3]
        tier.index.abort(key)
        tier.index.restore(victims, tier._chunk_size)
