"""Checks of concurrency: the in-flight bound under many callers, loads ahead of a flood of
stores, back-pressure by dropping, drain/close letting calls in progress finish, and loads
racing stores of the same keys."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from .. import BackpressureError, TierClosedError
from ..errors import failure_kind
from ..stats import TransferResult
from .backends import Backend
from .harness import Calls, new_keys
from .suite import SuiteBase, once_per_class

__all__ = ["ConcurrencyChecks"]


class ConcurrencyChecks(SuiteBase):
    @once_per_class
    def test_a_load_racing_a_store_of_its_key_gets_it_whole_or_not_at_all(
        self, tmp_path: Path, backend: Backend
    ) -> None:
        """Stores of a few keys, again and again (a tier without an index writes them again),
        while readers load the same keys: each load gets the whole chunk or not_found. A tier
        that writes in place let readers see half a chunk, which failed its checksum and was
        then deleted as a bad copy (a good chunk lost)."""

        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                data = h.fill(31)
                n = 8
                keys = new_keys(n, "race")
                problems: list[str] = []
                bad_before = h.tier.stats().failures["checksum"]
                stop = anyio.Event()

                async def reader(slot: int) -> None:
                    while not stop.is_set():
                        for i, k in enumerate(keys):
                            res = await h.tier.load([k], [slot])
                            if k in res.succeeded and h.chunk(slot) != data[i]:
                                problems.append(f"key {i}: other bytes")
                            elif k in res.failed and failure_kind(res.failed[k]) != "not_found":
                                problems.append(f"key {i}: {res.failed[k]!r}")

                readers = min(max(1, self.max_inflight // 2), self.num_chunks - n)  # (slots left for the stores)
                if readers < 1:
                    pytest.skip(f"num_chunks={self.num_chunks} leaves no slot for a reader beside {n} stored")
                async with anyio.create_task_group() as tg:
                    for r in range(readers):
                        tg.start_soon(reader, n + r)
                    for _ in range(10):
                        assert (await h.tier.offload(keys, list(range(n)))).ok
                    stop.set()
                assert not problems, f"a load raced a store of its key: {problems[:5]}"
                assert h.tier.stats().failures["checksum"] == bad_before

        self.run(backend, check)

    def test_inflight_bound_under_1000_concurrent_calls(self, tmp_path: Path, backend: Backend) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                data = h.fill(5)
                keys = new_keys(1000)
                n = self.num_chunks
                async with anyio.create_task_group() as tg:
                    stores: Calls[TransferResult] = Calls(tg)
                    for i, k in enumerate(keys):
                        stores.start(h.tier.offload, [k], [i % n])
                results = stores.finished()
                assert all(r.ok for r in results), [r.failed for r in results if not r.ok][:3]
                async with anyio.create_task_group() as tg:
                    loads: Calls[TransferResult] = Calls(tg)
                    for i, k in enumerate(keys[:200]):
                        loads.start(h.tier.load, [k], [i % n])
                assert all(r.ok for r in loads.finished())
                s = h.tier.stats()
                assert s.peak_in_flight <= self.max_inflight, f"peak {s.peak_in_flight} > bound {self.max_inflight}"
                assert s.in_flight == 0 and s.queued == 0
                assert s.max_inflight == self.max_inflight
                for i in range(self.num_chunks):
                    assert h.chunk(i) == data[i]

        self.run(backend, check)

    def test_loads_not_starved_by_store_flood(self, tmp_path: Path, backend: Backend) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                data = h.fill(7)
                (hot,) = new_keys(1, "hot")
                assert (await h.tier.offload([hot], [0])).ok
                flood_keys = new_keys(2000, "flood")
                n = self.num_chunks
                batches = [flood_keys[i : i + 50] for i in range(0, len(flood_keys), 50)]
                async with anyio.create_task_group() as tg:
                    flood: Calls[TransferResult] = Calls(tg)
                    for j, b in enumerate(batches):
                        flood.start(h.tier.offload, b, [(j + i) % n for i in range(len(b))])
                    await flood.all_begun()  # every flood call has queued its stores
                    queued = h.tier.stats().queued
                    stored_before = h.tier.stats().offloaded
                    res = await h.tier.load([hot], [1])
                    stores_ahead = h.tier.stats().offloaded - stored_before
                    assert res.ok and h.chunk(1) == data[0]
                assert all(r.ok for r in flood.finished())
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

        self.run(backend, check)

    def test_drain_and_close_finish_calls_in_progress(self, tmp_path: Path, backend: Backend) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            await h.tier.open()
            h.fill(10)
            keys = new_keys(self.num_chunks)
            half = self.num_chunks // 2
            async with anyio.create_task_group() as tg:
                first: Calls[TransferResult] = Calls(tg)
                for i, k in enumerate(keys[:half]):
                    first.start(h.tier.offload, [k], [i])
                await first.all_begun()
                await h.tier.drain()
                assert all(r.ok for r in first.finished()), "drain() returned before the calls in progress"
                second: Calls[TransferResult] = Calls(tg)
                for i, k in enumerate(keys[half:]):
                    second.start(h.tier.offload, [k], [half + i])
                await second.all_begun()
                await h.tier.aclose()
                assert all(r.ok for r in second.finished()), "aclose() did not let calls in progress finish"
            with pytest.raises(TierClosedError):
                await h.tier.offload(keys[:1], [0])

        self.run(backend, check)

    def test_store_backpressure_drop(self, tmp_path: Path, backend: Backend) -> None:
        async def check() -> None:
            h = self.make(tmp_path, store_backpressure="drop", backpressure_timeout_s=0, max_inflight=1)
            async with h.tier:
                data = h.fill(11)
                dropped = 0
                # One slot and no wait: stores beyond what the slot drains before the drop
                # timer fires must fail. A fast medium may drain a small call first, so grow it.
                for n in (4 * self.num_chunks, 16 * self.num_chunks, 32 * self.num_chunks):
                    keys = new_keys(n)
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
                    h.refill(data)  # for the next round
                    assert (await h.tier.remove(res.succeeded)).ok
                    if dropped:
                        break
                assert dropped, "1 slot, no wait, thousands of stores: expected some to be dropped"

        self.run(backend, check)
