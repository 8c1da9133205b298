"""What is left of an fs job when some of its chunks leave the fast path: their coroutines
(continuations), run one after another for a group job, and given back instead of run when
their call was cancelled before they began (:mod:`.withdrawal`)."""

from __future__ import annotations

from functools import partial
from typing import Any

import anyio

from asynctier.core.jobs import SKIPPED, Job, Outcomes
from asynctier.engines.fastpath import Continuation
from asynctier.errors import Withdrawn

from .withdrawal import NotBegun, Undo

__all__ = ["AfterRemoval", "group_end", "one_later", "run_later"]


def group_end(job: Job, out: Outcomes, later: list[tuple[int, Continuation]]) -> Continuation | None:
    """A group job over (its outcomes set), or the continuation of its chunks that go on."""
    if not later:
        job.result = out
        return None
    return partial(run_later, job, out, later)


class AfterRemoval(NotBegun):
    """A continuation that waits for the deletion of its key's old copy to be reported over."""


async def one_later(job: Job, fn: NotBegun) -> Any:
    """A chunk planned as a coroutine: run, unless its call was cancelled meanwhile."""
    if job.batch.cancelled:
        await _give_back(fn)
        raise Withdrawn()
    return await fn()


async def _give_back(fn: NotBegun) -> None:
    u = Undo(fn.io, fn.io.live_tier())
    u.continuation(fn)
    rest = u.close()
    if rest is not None:
        await rest()


async def run_later(job: Job, out: Outcomes, later: list[tuple[int, Continuation]]) -> Outcomes:
    """The continuations of a group job's chunks, one after another: each takes a job slot
    of its own while it runs, and the group holds the engine's place of one job. Those that
    wait for a deletion go last: the one that reports it over may be among the others (a
    store of the group whose victim it is, its recycling refused), and waited for behind them
    until the 30 s limit."""
    if any(type(fn) is AfterRemoval for _, fn in later):
        later = sorted(later, key=lambda p: type(p[1]) is AfterRemoval)  # (stable: the others keep their order)
    for i, fn in later:
        if job.batch.cancelled and isinstance(fn, NotBegun):  # its call cancelled: not begun, given back
            await _give_back(fn)
            out[i] = Withdrawn()
            continue
        try:
            if await fn() is SKIPPED:  # a key stored as it waited: stored already
                out[i] = SKIPPED
        except anyio.get_cancelled_exc_class() as e:
            # as the engine's own service coroutines: workers are not cancelled by callers
            out[i] = ConnectionAbortedError(f"chunk I/O cancelled inside the tier: {e!r}")
        except BaseException as e:  # that chunk's failure
            out[i] = e
    return out
