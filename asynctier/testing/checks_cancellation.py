"""Checks of cancellation and deadlines: when control comes back to an interrupted caller, no
chunk I/O of its call touches its buffer any more, none starts later, and every key an
interrupted offload left behind is whole.

Interruptions are anyio's (a cancel scope, ``move_on_after``, ``fail_after``) on every
backend, plus asyncio's own ``task.cancel()`` on asyncio and uvloop.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable
from pathlib import Path

import anyio

from .backends import Backend
from .harness import Harness, new_keys
from .interrupts import How, Interrupted, interrupt_mid_call
from .suite import SuiteBase, asyncio_only

__all__ = ["CancellationChecks"]

# how long a check watches for I/O that goes on after the caller got control back
_AFTERMATH_S = 0.05

# attempts that wait for a chunk to move before interrupting; later ones interrupt as soon as
# chunk I/O is in flight (on a busy host a blocking tier's threads may end the whole call
# before the checking task runs again: the README's DirTier failed 2 runs in 18 that way)
_EAGER_AFTER = 10
# tries of a check before it says the interruption never landed (a call that finishes first is
# tried again at once: only a tier that leaves no window pays for them all)
_ATTEMPTS = 100

# why an interruption may never land, and what the test class can do about it
_NO_WINDOW = (
    "the interruption comes once the tier reports progress, so a tier that starts all of a call's "
    "chunks at once (as many batches as max_inflight) and ends them together leaves it no window: "
    "give the test class a config with more, smaller batches than max_inflight. An AsyncChunkTier "
    "whose primitives never suspend (no real await) runs a whole call without letting the loop go: "
    "await real I/O in them, or make the tier a BlockingChunkTier"
)


async def _assert_quiet_after(h: Harness, got: Interrupted, progress: Callable[[], int], what: str) -> None:
    """Nothing of the interrupted call was running at its return, and nothing ran later."""
    assert got.in_flight == 0, f"the {what} returned to its interrupted caller while chunk I/O was still running"
    assert got.queued == 0, f"the interrupted {what} left chunk I/O queued"
    await anyio.sleep(_AFTERMATH_S)
    assert progress() == got.progress, f"chunk I/O of the {what} started after the caller got control back"


def loaded(h: Harness) -> Callable[[], int]:
    """The tier's count of chunks loaded, as a check watches it."""
    return lambda: h.tier.stats().loaded


def stored(h: Harness) -> Callable[[], int]:
    """The tier's count of chunks stored."""
    return lambda: h.tier.stats().offloaded


class CancellationChecks(SuiteBase):
    async def _interrupt_loads(self, h: Harness, how: How, want: int) -> None:
        """Interrupt a load of every slot mid-transfer ``want`` times (up to ``_ATTEMPTS`` tries)."""
        h.fill(8)
        keys = new_keys(self.num_chunks)
        ids = list(range(self.num_chunks))
        assert (await h.tier.offload(keys, ids)).ok
        landed = 0
        for _attempt in range(_ATTEMPTS):
            h.zero()
            call = functools.partial(h.tier.load, keys, ids)
            got = await interrupt_mid_call(h, call, loaded(h), how, eager=_attempt >= _EAGER_AFTER)
            if not got.landed:  # finished before the interruption landed; try again
                assert got.result is not None and got.result.ok, got.result
                continue
            landed += 1
            assert got.timeout_raised == (how == "fail_after"), f"{how}: TimeoutError raised: {got.timeout_raised}"
            await _assert_quiet_after(h, got, loaded(h), "load")
            assert bytes(h.buf) == got.buffer, "the primary buffer changed after the interrupted load returned"
            if landed >= want:
                break
        assert landed, f"could not interrupt a load ({how}) mid-transfer in {_ATTEMPTS} attempts; {_NO_WINDOW}"

    async def _interrupt_offloads(self, h: Harness, how: How, want: int) -> None:
        """Interrupt an offload of every slot mid-transfer ``want`` times; the caller then
        overwrites its buffer at once, and every key stored must hold the bytes of the call."""
        data = h.fill(9)
        scribble = random.Random(90).randbytes(len(h.buf))
        ids = list(range(self.num_chunks))

        def reuse_slots() -> None:
            h.buf[:] = scribble

        landed = 0
        for _attempt in range(_ATTEMPTS):
            keys = new_keys(self.num_chunks)
            call = functools.partial(h.tier.offload, keys, ids)
            got = await interrupt_mid_call(h, call, stored(h), how, reuse_slots, eager=_attempt >= _EAGER_AFTER)
            if got.landed:
                landed += 1
                assert got.timeout_raised == (how == "fail_after"), f"{how}: TimeoutError raised: {got.timeout_raised}"
                await _assert_quiet_after(h, got, stored(h), "offload")
            else:
                assert got.result is not None and got.result.ok, got.result
            present = await h.tier.lookup(keys)
            kept = [(k, i) for k, i, p in zip(keys, ids, present) if p]
            h.zero()
            res = await h.tier.load([k for k, _ in kept], list(range(len(kept))))
            assert res.ok, res.failed
            for slot, (_, i) in enumerate(kept):
                assert h.chunk(slot) == data[i], (
                    f"chunk {i} was stored with bytes the caller wrote after the offload returned"
                    if h.chunk(slot) == scribble[i * self.chunk_bytes : (i + 1) * self.chunk_bytes]
                    else f"chunk {i} is not stored whole"
                )
            h.refill(data)  # for the next attempt
            if landed >= want:
                break
        assert landed, f"could not interrupt an offload ({how}) mid-transfer in {_ATTEMPTS} attempts; {_NO_WINDOW}"

    def test_cancelled_load_waits_for_inflight_io(self, tmp_path: Path, backend: Backend) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                await self._interrupt_loads(h, "cancel", want=3)

        self.run(backend, check)

    def test_cancelled_offload_leaves_each_key_whole_or_absent(self, tmp_path: Path, backend: Backend) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                await self._interrupt_offloads(h, "cancel", want=2)

        self.run(backend, check)

    def test_deadline_on_load_waits_for_inflight_io(self, tmp_path: Path, backend: Backend) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                await self._interrupt_loads(h, "move_on_after", want=1)
                await self._interrupt_loads(h, "fail_after", want=1)
                # a deadline already past when the call begins
                keys = new_keys(self.num_chunks)
                ids = list(range(self.num_chunks))
                assert (await h.tier.offload(keys, ids)).ok
                count = loaded(h)
                with anyio.move_on_after(0) as scope:
                    res = await h.tier.load(keys, ids)
                if scope.cancelled_caught:
                    s = h.tier.stats()
                    got = Interrupted(True, None, False, s.in_flight, s.queued, count(), bytes(h.buf))
                    await _assert_quiet_after(h, got, count, "load under an expired deadline")
                    assert bytes(h.buf) == got.buffer, "the primary buffer changed after the load returned"
                else:
                    assert res.ok, res.failed

        self.run(backend, check)

    def test_deadline_on_offload_leaves_each_key_whole_or_absent(self, tmp_path: Path, backend: Backend) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                await self._interrupt_offloads(h, "move_on_after", want=1)
                await self._interrupt_offloads(h, "fail_after", want=1)

        self.run(backend, check)

    @asyncio_only
    def test_asyncio_task_cancel_of_load_waits_for_inflight_io(self, tmp_path: Path, backend: Backend) -> None:
        """asyncio code cancels with ``task.cancel()`` (``wait_for``, ``asyncio.timeout``)."""

        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                h.fill(8)
                keys = new_keys(self.num_chunks)
                ids = list(range(self.num_chunks))
                assert (await h.tier.offload(keys, ids)).ok
                count = loaded(h)
                landed = 0
                for _attempt in range(_ATTEMPTS):
                    h.zero()
                    before = count()
                    task = asyncio.ensure_future(h.tier.load(keys, ids))
                    eager = _attempt >= _EAGER_AFTER  # (see interrupt_mid_call)
                    while count() == before and not task.done():  # polls the tier
                        if eager and h.tier.stats().in_flight:
                            break
                        await asyncio.sleep(0)
                    task.cancel()
                    try:
                        await task
                    except asyncio.CancelledError:
                        pass
                    else:
                        continue  # finished before the cancel landed; try again
                    landed += 1
                    s = h.tier.stats()
                    got = Interrupted(True, None, False, s.in_flight, s.queued, count(), bytes(h.buf))
                    await _assert_quiet_after(h, got, count, "load")
                    assert bytes(h.buf) == got.buffer, "the primary buffer changed after the cancellation returned"
                    if landed >= 3:
                        break
                assert landed, f"could not cancel a load mid-transfer in {_ATTEMPTS} attempts; {_NO_WINDOW}"

        self.run(backend, check)
