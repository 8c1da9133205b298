"""The conformance suite every tier passes — built-in or out-of-tree.

Use it from a pytest module of your own::

    from asynctier.testing import TierConformance

    class TestMyTier(TierConformance):
        def tier_config(self, tmp_path):
            return {"type": "MyTier", "module_path": "mypackage.mytier", "root": str(tmp_path)}

Every check builds the tier through :class:`~asynctier.SecondaryTierFactory` from that
config (plus ``max_inflight`` and the knobs a check needs), and runs once on the stock
asyncio loop and once on uvloop (when installed). The checks need only pytest: they start
their own event loops, so they work with or without pytest-asyncio or anyio's plugin.

Override the class attributes to fit the medium (``chunk_bytes``, ``num_chunks``,
``max_inflight``).
"""

from __future__ import annotations

import asyncio
import mmap
import os
import random
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from .. import (
    BackpressureError,
    OffloadingSpec,
    SecondaryTierFactory,
    TierClosedError,
    TierNotOpenError,
)
from ..contract import SecondaryTierManager
from ..errors import failure_kind

__all__ = ["TierConformance", "loop_factories"]


def loop_factories() -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Event loops to run on: the stock asyncio loop, and uvloop when it is installed."""
    out: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a core dependency where it installs
        pass
    else:
        out["uvloop"] = uvloop.new_event_loop
    return out


class _Harness:
    """One tier, its spec and its primary buffer."""

    def __init__(self, tier: SecondaryTierManager, spec: OffloadingSpec, buf: bytearray | mmap.mmap) -> None:
        self.tier = tier
        self.spec = spec
        self.buf = buf
        self.view = memoryview(buf)

    def chunk(self, cid: int) -> bytes:
        c = self.spec.chunk_bytes
        return bytes(self.buf[cid * c : (cid + 1) * c])

    def fill(self, seed: int) -> dict[int, bytes]:
        rnd = random.Random(seed)
        c = self.spec.chunk_bytes
        out = {}
        for cid in range(self.spec.num_chunks):
            data = rnd.randbytes(c)
            self.buf[cid * c : (cid + 1) * c] = data
            out[cid] = data
        return out

    def zero(self) -> None:
        self.buf[:] = bytes(len(self.buf))


def _keys(n: int, tag: str = "k") -> list[bytes]:
    salt = os.urandom(4).hex()
    return [f"{tag}-{salt}-{i}".encode() for i in range(n)]


class TierConformance:
    """Subclass and implement :meth:`tier_config`; pytest collects the ``test_*`` checks."""

    chunk_bytes: ClassVar[int] = 64 * 1024
    num_chunks: ClassVar[int] = 64
    max_inflight: ClassVar[int] = 4
    namespace: ClassVar[str] = "conformance/test"
    #: Run with a page-aligned primary buffer (as pinned memory is) instead of a bytearray,
    #: so tiers that use O_DIRECT take their zero-copy path.
    page_aligned_buffer: ClassVar[bool] = False

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        """The factory config of the tier under test (``type`` plus its own parameters)."""
        raise NotImplementedError

    # -- machinery -------------------------------------------------------------------------
    @pytest.fixture(params=sorted(loop_factories()))
    def loop_factory(self, request: pytest.FixtureRequest) -> Iterator[Callable[[], asyncio.AbstractEventLoop]]:
        yield loop_factories()[request.param]

    def make(self, tmp_path: Path, **overrides: Any) -> _Harness:
        """Build (not open) the tier under test with ``overrides`` merged into its config."""
        spec = OffloadingSpec(self.chunk_bytes, self.num_chunks, namespace=self.namespace)
        buf: bytearray | mmap.mmap = (
            mmap.mmap(-1, spec.total_bytes) if self.page_aligned_buffer else bytearray(spec.total_bytes)
        )
        config = {**self.tier_config(tmp_path), "max_inflight": self.max_inflight, **overrides}
        tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(buf), spec)
        return _Harness(tier, spec, buf)

    def run(
        self,
        loop_factory: Callable[[], asyncio.AbstractEventLoop],
        check: Callable[..., Awaitable[None]],
        *args: Any,
    ) -> None:
        loop = loop_factory()
        try:
            loop.run_until_complete(asyncio.wait_for(check(*args), 60))
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    # -- checks ----------------------------------------------------------------------------
    def test_round_trip(self, tmp_path: Path, loop_factory: Any) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                data = h.fill(1)
                keys = _keys(self.num_chunks)
                ids = list(range(self.num_chunks))
                res = await h.tier.offload(keys, ids)
                assert res.ok, res.failed
                assert res.succeeded == keys
                assert res.bytes_transferred == self.num_chunks * self.chunk_bytes
                h.zero()
                perm = ids[:]
                random.Random(2).shuffle(perm)
                res = await h.tier.load(keys, perm)
                assert res.ok, res.failed
                for i, slot in enumerate(perm):
                    assert h.chunk(slot) == data[i], f"chunk {i} loaded into slot {slot} differs"

        self.run(loop_factory, check)

    def test_lookup_absent_and_partial_failure(self, tmp_path: Path, loop_factory: Any) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                data = h.fill(3)
                present = _keys(4, "present")
                absent = _keys(4, "absent")
                assert (await h.tier.offload(present, [0, 1, 2, 3])).ok
                assert await h.tier.lookup(present + absent) == [True] * 4 + [False] * 4
                h.zero()
                mixed = [present[0], absent[0], present[1], absent[1]]
                res = await h.tier.load(mixed, [10, 11, 12, 13])
                assert res.succeeded == [present[0], present[1]]
                assert set(res.failed) == {absent[0], absent[1]}
                for exc in res.failed.values():
                    assert failure_kind(exc) == "not_found", repr(exc)
                assert not res.ok
                assert h.chunk(10) == data[0] and h.chunk(12) == data[1]
                assert h.tier.stats().failures["not_found"] >= 2

        self.run(loop_factory, check)

    def test_offload_existing_key_keeps_one_copy(self, tmp_path: Path, loop_factory: Any) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                data = h.fill(4)
                (k,) = _keys(1)
                assert (await h.tier.offload([k], [0])).ok
                assert (await h.tier.offload([k], [0])).ok
                res = await h.tier.load([k], [5])
                assert res.ok and h.chunk(5) == data[0]

        self.run(loop_factory, check)

    def test_bad_arguments_raise_before_any_io(self, tmp_path: Path, loop_factory: Any) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                t = h.tier
                k = _keys(3)
                n = self.num_chunks
                bad_calls: list[tuple[Callable[[], Awaitable[Any]], type[BaseException]]] = [
                    (lambda: t.offload(k[:2], [0]), ValueError),
                    (lambda: t.offload(k[:1], [n]), IndexError),
                    (lambda: t.offload(k[:1], [-1]), IndexError),
                    (lambda: t.offload(k[:1], [1.0]), TypeError),  # type: ignore[list-item]
                    (lambda: t.offload(k[:1], [True]), TypeError),
                    (lambda: t.offload(["text"], [0]), TypeError),  # type: ignore[list-item]
                    (lambda: t.offload([bytearray(b"x")], [0]), TypeError),  # type: ignore[list-item]
                    (lambda: t.offload(k[0], [0]), TypeError),  # type: ignore[arg-type]
                    (lambda: t.offload([b""], [0]), ValueError),
                    (lambda: t.offload([k[0], k[0]], [0, 1]), ValueError),
                    (lambda: t.offload([k[0], k[1], k[2]], [0, 1, n]), IndexError),
                    (lambda: t.load(k[:2], [0, 0]), ValueError),
                    (lambda: t.load(k[:1], [n + 5]), IndexError),
                    (lambda: t.lookup([k[0], 7]), TypeError),  # type: ignore[list-item]
                    (lambda: t.remove(["x"]), TypeError),  # type: ignore[list-item]
                ]
                for i, (call, exc_type) in enumerate(bad_calls):
                    with pytest.raises(exc_type):
                        await call()
                    s = t.stats()
                    assert (s.offloaded, s.loaded, s.skipped, s.failed, s.in_flight, s.queued) == (0, 0, 0, 0, 0, 0), (
                        f"bad call #{i} did I/O"
                    )
                assert await t.lookup(k) == [False, False, False]

        self.run(loop_factory, check)

    def test_lifecycle_open_close_idempotent(self, tmp_path: Path, loop_factory: Any) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            k = _keys(1)
            with pytest.raises(TierNotOpenError):
                await h.tier.offload(k, [0])
            await h.tier.open()
            await h.tier.open()
            assert (await h.tier.offload(k, [0])).ok
            await h.tier.aclose()
            await h.tier.aclose()
            for call in (h.tier.offload(k, [0]), h.tier.load(k, [0]), h.tier.lookup(k), h.tier.remove(k)):
                with pytest.raises(TierClosedError):
                    await call
            with pytest.raises(TierClosedError):
                await h.tier.open()

        self.run(loop_factory, check)

    def test_inflight_bound_under_1000_concurrent_calls(self, tmp_path: Path, loop_factory: Any) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                data = h.fill(5)
                keys = _keys(1000)
                stores = [h.tier.offload([k], [i % self.num_chunks]) for i, k in enumerate(keys)]
                results = await asyncio.gather(*stores)
                assert all(r.ok for r in results), [r.failed for r in results if not r.ok][:3]
                loads = [h.tier.load([k], [i % self.num_chunks]) for i, k in enumerate(keys[:200])]
                results = await asyncio.gather(*loads)
                assert all(r.ok for r in results)
                s = h.tier.stats()
                assert s.peak_in_flight <= self.max_inflight, f"peak {s.peak_in_flight} > bound {self.max_inflight}"
                assert s.in_flight == 0 and s.queued == 0
                assert s.max_inflight == self.max_inflight
                for i in range(self.num_chunks):
                    assert h.chunk(i) == data[i]

        self.run(loop_factory, check)

    def test_loads_not_starved_by_store_flood(self, tmp_path: Path, loop_factory: Any) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                data = h.fill(7)
                (hot,) = _keys(1, "hot")
                assert (await h.tier.offload([hot], [0])).ok
                flood_keys = _keys(2000, "flood")
                n = self.num_chunks
                batches = [flood_keys[i : i + 50] for i in range(0, len(flood_keys), 50)]
                flood = [
                    asyncio.ensure_future(h.tier.offload(b, [(j + i) % n for i in range(len(b))]))
                    for j, b in enumerate(batches)
                ]
                await asyncio.sleep(0)  # every flood call has queued its stores
                queued = h.tier.stats().queued
                stored_before = h.tier.stats().offloaded
                res = await h.tier.load([hot], [1])
                stores_ahead = h.tier.stats().offloaded - stored_before
                assert res.ok and h.chunk(1) == data[0]
                results = await asyncio.gather(*flood)
                assert all(r.ok for r in results)
                s = h.tier.stats()
                assert queued >= 8 * self.max_inflight, (
                    f"the flood never backed up (queued={queued}): this check needs a slower medium"
                )
                # Without priority the load would finish behind every store queued ahead of it:
                # after (nearly) all of the flood, about as late as the latest store. Either
                # sign that it went ahead suffices: few stores finished before it (an
                # ordering; a medium's stall hits the stores alike), or its latency (a call's
                # start to its chunk's completion, so the loop's own delays do not enter) was
                # well under the slowest store's (where stores are quicker than the loop's
                # hand-off of the load, as in memory, the count above says little).
                few_ahead = stores_ahead < len(flood_keys) // 2
                quicker = s.load_latency.max * 2 < s.offload_latency.max
                assert few_ahead or quicker, (
                    f"{stores_ahead} of {len(flood_keys)} stores finished before the load, which took "
                    f"{s.load_latency.max:.4f}s behind {queued} queued stores (the slowest store "
                    f"{s.offload_latency.max:.4f}s): loads are not ahead of stores"
                )

        self.run(loop_factory, check)

    def test_cancelled_load_waits_for_inflight_io(self, tmp_path: Path, loop_factory: Any) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                h.fill(8)
                keys = _keys(self.num_chunks)
                ids = list(range(self.num_chunks))
                assert (await h.tier.offload(keys, ids)).ok
                landed = 0
                for _attempt in range(30):
                    h.zero()
                    before = h.tier.stats().loaded
                    task = asyncio.ensure_future(h.tier.load(keys, ids))
                    while h.tier.stats().loaded == before and not task.done():  # noqa: ASYNC110 - polls the tier
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
                    assert s.in_flight == 0, "CancelledError reached the caller while chunk I/O was still running"
                    assert s.queued == 0, "cancelled load left chunk I/O queued"
                    snapshot = bytes(h.buf)
                    loaded = s.loaded
                    await asyncio.sleep(0.05)
                    assert h.tier.stats().loaded == loaded, "chunk I/O started after the cancellation"
                    assert bytes(h.buf) == snapshot, "the primary buffer changed after the cancellation returned"
                    if landed >= 3:
                        break
                assert landed, "could not cancel a load mid-transfer in 30 attempts (tier too fast for this check?)"

        self.run(loop_factory, check)

    def test_cancelled_offload_leaves_each_key_whole_or_absent(self, tmp_path: Path, loop_factory: Any) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                data = h.fill(9)
                ids = list(range(self.num_chunks))
                for _attempt in range(10):
                    keys = _keys(self.num_chunks)
                    before = h.tier.stats().offloaded
                    task = asyncio.ensure_future(h.tier.offload(keys, ids))
                    while h.tier.stats().offloaded == before and not task.done():  # noqa: ASYNC110 - polls the tier
                        await asyncio.sleep(0)
                    task.cancel()
                    try:
                        await task
                    except asyncio.CancelledError:
                        pass
                    assert h.tier.stats().in_flight == 0
                    present = await h.tier.lookup(keys)
                    stored = [(k, i) for k, i, p in zip(keys, ids, present) if p]
                    spare = [s for s in range(self.num_chunks)][: len(stored)]
                    h.zero()
                    res = await h.tier.load([k for k, _ in stored], spare)
                    assert res.ok, res.failed
                    for (_, i), slot in zip(stored, spare):
                        assert h.chunk(slot) == data[i]
                    # refill for the next attempt
                    for cid, d in data.items():
                        c = self.chunk_bytes
                        h.buf[cid * c : (cid + 1) * c] = d

        self.run(loop_factory, check)

    def test_drain_and_close_finish_calls_in_progress(self, tmp_path: Path, loop_factory: Any) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            await h.tier.open()
            h.fill(10)
            keys = _keys(self.num_chunks)
            half = self.num_chunks // 2
            tasks = [asyncio.ensure_future(h.tier.offload([k], [i])) for i, k in enumerate(keys[:half])]
            await asyncio.sleep(0)
            await h.tier.drain()
            assert all(t.done() and t.result().ok for t in tasks)
            tasks = [asyncio.ensure_future(h.tier.offload([k], [half + i])) for i, k in enumerate(keys[half:])]
            await asyncio.sleep(0)
            await h.tier.aclose()
            assert all(t.done() and not t.cancelled() and t.result().ok for t in tasks), (
                "aclose() did not let calls in progress finish"
            )
            with pytest.raises(TierClosedError):
                await h.tier.offload(keys[:1], [0])

        self.run(loop_factory, check)

    def test_store_backpressure_drop(self, tmp_path: Path, loop_factory: Any) -> None:
        async def check() -> None:
            h = self.make(tmp_path, store_backpressure="drop", backpressure_timeout_s=0, max_inflight=1)
            async with h.tier:
                data = h.fill(11)
                dropped = 0
                # One slot and no wait: stores beyond what the slot drains before the drop
                # timer fires must fail. A fast medium may drain a small call first, so grow it.
                for n in (4 * self.num_chunks, 16 * self.num_chunks, 32 * self.num_chunks):
                    keys = _keys(n)
                    ids = [i % self.num_chunks for i in range(len(keys))]
                    res = await h.tier.offload(keys, ids)
                    assert all(isinstance(e, BackpressureError) for e in res.failed.values())
                    dropped += len(res.failed)
                    assert h.tier.stats().failures["backpressure"] == dropped
                    present = await h.tier.lookup(keys)
                    ok = set(res.succeeded)
                    assert all(p == (k in ok) for k, p in zip(keys, present)), "a dropped store is visible"
                    # loads are never dropped, even under the same policy
                    pos = {k: i for i, k in enumerate(keys)}
                    sel = [(k, ids[pos[k]]) for k in res.succeeded][: self.num_chunks]
                    h.zero()
                    lres = await h.tier.load([k for k, _ in sel], list(range(len(sel))))
                    assert lres.ok, lres.failed
                    for slot, (_, i) in enumerate(sel):
                        assert h.chunk(slot) == data[i]
                    for cid, d in data.items():  # refill for the next round
                        h.buf[cid * self.chunk_bytes : (cid + 1) * self.chunk_bytes] = d
                    assert (await h.tier.remove(res.succeeded)).ok
                    if dropped:
                        break
                assert dropped, "1 slot, no wait, thousands of stores: expected some to be dropped"

        self.run(loop_factory, check)

    def test_remove_and_touch(self, tmp_path: Path, loop_factory: Any) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                h.fill(12)
                keys = _keys(4)
                assert (await h.tier.offload(keys, [0, 1, 2, 3])).ok
                await h.tier.touch(keys[:2])
                res = await h.tier.remove(keys[:2] + _keys(1, "never"))
                assert res.ok, res.failed
                assert await h.tier.lookup(keys) == [False, False, True, True]
                lres = await h.tier.load(keys[:1], [9])
                assert set(lres.failed) == {keys[0]}
                assert failure_kind(lres.failed[keys[0]]) == "not_found"

        self.run(loop_factory, check)

    def test_stats_count_what_happened(self, tmp_path: Path, loop_factory: Any) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                h.fill(13)
                keys = _keys(8)
                assert (await h.tier.offload(keys, list(range(8)))).ok
                assert (await h.tier.load(keys[:5], list(range(10, 15)))).ok
                s = h.tier.stats()
                assert s.offloaded == 8 and s.bytes_written == 8 * self.chunk_bytes
                assert s.loaded == 5 and s.bytes_read == 5 * self.chunk_bytes
                assert s.failed == 0 and s.in_flight == 0 and s.queued == 0
                assert s.offload_latency.count == 8 and s.load_latency.count == 5
                assert 0 < s.load_latency.p50 <= s.load_latency.p99 <= s.load_latency.max
                if s.stored_chunks is not None:
                    assert s.stored_chunks >= 8

        self.run(loop_factory, check)
