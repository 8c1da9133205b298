"""Checks of the call contract: what offload, load, lookup, remove and touch do, what they
refuse before any I/O, the lifecycle, and the stats they leave."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from .. import TierClosedError, TierNotOpenError
from ..errors import failure_kind
from .backends import Backend
from .harness import new_keys
from .suite import SuiteBase

__all__ = ["ContractChecks"]


#: Process-wide pools that outlive any one tier by design (asynctier's slow paths and the
#: chain's copies, anyio's and trio's worker threads): not a tier's threads.
_SHARED_POOLS = ("asynctier-blocking", "asynctier-chain-copy", "AnyIO worker thread", "Trio thread", "asyncio_")
#: How long a check waits for a closed tier's threads to end.
_THREADS_END_S = 5.0


class ContractChecks(SuiteBase):
    def test_round_trip(self, tmp_path: Path, backend: Backend) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                data = h.fill(1)
                keys = new_keys(self.num_chunks)
                ids = list(range(self.num_chunks))
                res = await h.tier.offload(keys, ids)
                assert res.ok, res.failed
                assert res.succeeded == keys
                assert res.bytes_transferred == self.num_chunks * self.chunk_bytes
                changed = [i for i in ids if h.chunk(i) != data[i]]
                assert not changed, f"an offload changed the caller's slots {changed[:8]} (the tier reads them only)"
                h.zero()
                perm = ids[:]
                random.Random(2).shuffle(perm)
                res = await h.tier.load(keys, perm)
                assert res.ok, res.failed
                for i, slot in enumerate(perm):
                    assert h.chunk(slot) == data[i], f"chunk {i} loaded into slot {slot} differs"

        self.run(backend, check)

    def test_offload_reports_keys_stored_already(self, tmp_path: Path, backend: Backend) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                h.fill(6)
                n = max(2, self.num_chunks // 2)
                keys = new_keys(2 * n, "skip")
                ids = list(range(2 * n))
                first = await h.tier.offload(keys[:n], ids[:n])
                assert first.ok and first.skipped == [], first.skipped
                before = h.tier.stats().skipped
                res = await h.tier.offload(keys, ids)  # the first half stored already
                assert res.ok, res.failed
                assert res.succeeded == keys
                skipped = h.tier.stats().skipped - before
                # a tier may write a chunk again (a store without an index does); what it
                # reports skipped is what it counts skipped, and moves no bytes
                assert len(res.skipped) == skipped, (res.skipped, skipped)
                assert set(res.skipped) <= set(keys[:n])
                assert res.bytes_transferred == (2 * n - skipped) * self.chunk_bytes
                if getattr(h.tier, "index", None) is not None:  # an indexed tier knows them: it writes none again
                    assert res.skipped == keys[:n]

        self.run(backend, check)

    def test_lookup_absent_and_partial_failure(self, tmp_path: Path, backend: Backend) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                data = h.fill(3)
                present = new_keys(4, "present")
                absent = new_keys(4, "absent")
                assert (await h.tier.offload(present, [0, 1, 2, 3])).ok
                assert await h.tier.lookup(present + absent) == [True] * 4 + [False] * 4
                assert await h.tier.lookup_prefix(present + absent) == 4
                assert await h.tier.lookup_prefix([*present[:2], absent[0], *present[2:]]) == 2
                assert await h.tier.lookup_prefix(absent + present) == 0
                assert await h.tier.lookup_prefix([]) == 0
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

        self.run(backend, check)

    def test_offload_existing_key_keeps_one_copy(self, tmp_path: Path, backend: Backend) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                data = h.fill(4)
                (k,) = new_keys(1)
                assert (await h.tier.offload([k], [0])).ok
                assert (await h.tier.offload([k], [0])).ok
                res = await h.tier.load([k], [5])
                assert res.ok and h.chunk(5) == data[0]

        self.run(backend, check)

    def test_bad_arguments_raise_before_any_io(self, tmp_path: Path, backend: Backend) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                t = h.tier
                k = new_keys(3)
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
                    (lambda: t.lookup_prefix([k[0], 7]), TypeError),  # type: ignore[list-item]
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

        self.run(backend, check)

    def test_lifecycle_open_close_idempotent(self, tmp_path: Path, backend: Backend) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            k = new_keys(1)
            with pytest.raises(TierNotOpenError):
                await h.tier.offload(k, [0])
            await h.tier.open()
            await h.tier.open()
            assert (await h.tier.offload(k, [0])).ok
            await h.tier.aclose()
            await h.tier.aclose()
            calls: list[Callable[[], Awaitable[Any]]] = [
                lambda: h.tier.offload(k, [0]),
                lambda: h.tier.load(k, [0]),
                lambda: h.tier.lookup(k),
                lambda: h.tier.remove(k),
                h.tier.open,
            ]
            for call in calls:
                with pytest.raises(TierClosedError):
                    await call()

        self.run(backend, check)

    def test_remove_and_touch(self, tmp_path: Path, backend: Backend) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                h.fill(12)
                keys = new_keys(4)
                assert (await h.tier.offload(keys, [0, 1, 2, 3])).ok
                assert (await h.tier.load(keys[:1], [8])).ok  # (a tier that caches what it read must forget it)
                await h.tier.touch(keys[:2])
                res = await h.tier.remove(keys[:2] + new_keys(1, "never"))
                assert res.ok, res.failed
                assert await h.tier.lookup(keys) == [False, False, True, True]
                lres = await h.tier.load(keys[:1], [9])
                assert set(lres.failed) == {keys[0]}
                assert failure_kind(lres.failed[keys[0]]) == "not_found"

        self.run(backend, check)

    def test_aclose_leaves_no_thread_of_the_tier_running(self, tmp_path: Path, backend: Backend) -> None:
        async def cycle(root: Path) -> None:
            h = self.make(root)
            n = min(8, self.num_chunks // 2)
            async with h.tier:
                h.fill(14)
                keys = new_keys(n)
                assert (await h.tier.offload(keys, list(range(n)))).ok
                assert (await h.tier.load(keys, list(range(n, 2 * n)))).ok

        async def check() -> None:
            # a first tier starts the pools a process keeps by design (the tier's library's,
            # the loop's executor): only threads a second tier leaves behind are its own
            (tmp_path / "first").mkdir()
            (tmp_path / "second").mkdir()
            await cycle(tmp_path / "first")
            shared = _SHARED_POOLS + tuple(self.shared_thread_prefixes)
            before = set(threading.enumerate())
            await cycle(tmp_path / "second")
            end = time.monotonic() + _THREADS_END_S
            while True:
                left = [
                    t for t in threading.enumerate()
                    if t not in before and t.is_alive() and not t.name.startswith(shared)
                ]  # fmt: skip
                if not left or time.monotonic() > end:
                    break
                await anyio.sleep(0.02)
            assert not left, (
                f"threads still running {_THREADS_END_S}s after aclose(): {[t.name for t in left]} (if they "
                "belong to a pool the process keeps by design, name it in the test class's shared_thread_prefixes)"
            )

        self.run(backend, check)

    def test_stats_count_what_happened(self, tmp_path: Path, backend: Backend) -> None:
        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                h.fill(13)
                keys = new_keys(8)
                assert (await h.tier.offload(keys, list(range(8)))).ok
                assert (await h.tier.load(keys[:5], list(range(10, 15)))).ok
                s = h.tier.stats()
                assert s.offloaded == 8 and s.bytes_written == 8 * self.chunk_bytes
                assert s.loaded == 5 and s.bytes_read == 5 * self.chunk_bytes
                assert s.failed == 0 and s.in_flight == 0 and s.queued == 0
                assert s.offload_latency.count == 8 and s.load_latency.count == 5
                assert 0 < s.load_latency.p50 <= s.load_latency.p99 <= s.load_latency.max
                # what the tier says it holds (a tier that cannot tell says None): exactly what was
                # stored, each chunk's bytes at least (a count of 10**6, or used_bytes 0, passed)
                if s.stored_chunks is not None:
                    assert s.stored_chunks == 8, f"stored_chunks is {s.stored_chunks} after 8 chunks were stored"
                if s.used_bytes is not None:
                    assert s.used_bytes >= 8 * self.chunk_bytes, f"used_bytes is {s.used_bytes} for 8 chunks"
                assert (await h.tier.remove(keys[:3])).ok
                s = h.tier.stats()
                if s.stored_chunks is not None:
                    assert s.stored_chunks == 5, f"stored_chunks is {s.stored_chunks} after 3 of 8 chunks were removed"

        self.run(backend, check)
