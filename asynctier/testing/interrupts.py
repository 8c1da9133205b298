"""Interrupting a call mid-transfer, the anyio way, and what the caller sees when control
comes back.

The interruption lands once the call has moved at least one chunk (a counter of the tier's
stats changed), so it finds I/O in flight: either a cancellation (``CancelScope.cancel()``) or
a deadline that expires (``anyio.move_on_after`` / ``anyio.fail_after``, whose deadline is
brought forward to that moment, so no check depends on the medium's speed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

import anyio
import anyio.lowlevel

from ..stats import TransferResult
from .harness import Harness

__all__ = ["HOW", "Interrupted", "interrupt_mid_call"]

How = Literal["cancel", "move_on_after", "fail_after"]
HOW: tuple[How, ...] = ("cancel", "move_on_after", "fail_after")

# a deadline no check reaches by itself: the check brings it forward
_FAR_S = 3600.0


@dataclass
class Interrupted:
    """What the caller saw at the moment control came back to it."""

    #: The interruption ended the call (else the call finished before it landed).
    landed: bool
    #: What the call returned, when it finished first.
    result: TransferResult | None
    #: ``fail_after`` raised TimeoutError to the caller.
    timeout_raised: bool
    in_flight: int
    queued: int
    #: The counter the check watched (chunks loaded, or stored), at return.
    progress: int
    #: The primary buffer at return.
    buffer: bytes


@contextmanager
def _scope(how: How) -> Iterator[anyio.CancelScope]:
    if how == "cancel":
        with anyio.CancelScope() as scope:
            yield scope
    elif how == "move_on_after":
        with anyio.move_on_after(_FAR_S) as scope:
            yield scope
    else:
        with anyio.fail_after(_FAR_S) as scope:
            yield scope


async def interrupt_mid_call(
    h: Harness,
    call: Callable[[], Awaitable[TransferResult]],
    progress: Callable[[], int],
    how: How,
    on_return: Callable[[], None] = lambda: None,
    *,
    eager: bool = False,
) -> Interrupted:
    """Run ``call()`` in a task of its own; once ``progress()`` moves, interrupt it by ``how``.

    ``eager``: as soon as the tier has chunk I/O of the call in flight, moved or not (on a
    busy host a call of a blocking tier's threads may end whole before this task runs again
    once the first chunk moved). Right after the call gives control back, its task records
    what it sees and runs ``on_return()`` (a caller reusing its slots at once), before any
    other task runs.
    """
    before = progress()

    def started() -> bool:
        return progress() != before or (eager and h.tier.stats().in_flight > 0)

    scopes: list[anyio.CancelScope] = []
    seen: list[Interrupted] = []

    async def caller() -> None:
        result: TransferResult | None = None
        timed_out = False
        try:
            with _scope(how) as scope:
                scopes.append(scope)
                result = await call()
        except TimeoutError:
            timed_out = True
        s = h.tier.stats()
        landed = scopes[0].cancelled_caught
        seen.append(Interrupted(landed, result, timed_out, s.in_flight, s.queued, progress(), bytes(h.buf)))
        on_return()

    async with anyio.create_task_group() as tg:
        tg.start_soon(caller)
        while (not scopes or not started()) and not seen:  # the tier signals nothing: poll
            await anyio.lowlevel.checkpoint()
        if not seen:
            if how == "cancel":
                scopes[0].cancel()
            else:
                scopes[0].deadline = anyio.current_time()  # the deadline is reached now
    return seen[0]
