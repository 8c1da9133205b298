"""Checks of what stays on the medium: removal deletes there, capacity bounds it, the listing
is whole, chunks outlive a reopen, two layouts never mix, and a closed tier lets go of the
caller's buffer. Each looks past the call's own answer (the index, the TransferResult) at
what the tier holds, or at what a second instance sees."""

from __future__ import annotations

import gc
import mmap
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest

from .. import OffloadingSpec, SecondaryTierFactory, TierConfigError, TierStateError
from ..core.blocking import BlockingChunkTier
from ..core.coroutine import AsyncChunkTier
from .backends import Backend
from .harness import Harness, new_keys
from .suite import SuiteBase, once_per_class

__all__ = ["MediumChecks", "on_medium"]


async def on_medium(tier: object, key: bytes) -> bool | None:
    """The medium's own answer for ``key`` (``chunk_exists``, past any index); None for a
    tier not built on the two base classes (a chain), which has no such primitive."""
    if isinstance(tier, BlockingChunkTier):
        return await anyio.to_thread.run_sync(tier.chunk_exists, key)
    if isinstance(tier, AsyncChunkTier):
        return await tier.chunk_exists(key)
    return None


class MediumChecks(SuiteBase):
    def _build(self, config: dict[str, Any], namespace: str | None = None) -> Harness:
        """A tier from ``config`` (one config for the instances a check compares: a
        :meth:`tier_config` may name a fresh place at each call)."""
        spec = OffloadingSpec(self.chunk_bytes, self.num_chunks, namespace=namespace or self.namespace)
        buf: Any = mmap.mmap(-1, spec.total_bytes) if self.page_aligned_buffer else bytearray(spec.total_bytes)
        cfg = {**config, "max_inflight": self.max_inflight}
        return Harness(SecondaryTierFactory.create_secondary_tier(cfg, memoryview(buf), spec), spec, buf)

    @staticmethod
    async def _four_stored(h: Harness, tag: str, seed: int) -> tuple[list[bytes], dict[int, bytes]]:
        """Open ``h``'s tier (skipped where it is not persistent), store four keys, close."""
        if not getattr(h.tier, "persistent", True):
            pytest.skip("persistent = False: a new instance starts empty, two share nothing")
        keys = new_keys(4, tag)
        async with h.tier:
            data = h.fill(seed)
            assert (await h.tier.offload(keys, [0, 1, 2, 3])).ok
        return keys, data

    def test_remove_deletes_on_the_medium(self, tmp_path: Path, backend: Backend) -> None:
        """An indexed tier answers ``lookup`` from its index: a ``delete_chunk`` that reports
        done and deletes nothing passed every check that looks only through the calls."""

        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                h.fill(32)
                keys = new_keys(4, "rm")
                assert (await h.tier.offload(keys, [0, 1, 2, 3])).ok
                assert (await h.tier.remove(keys[:2])).ok
                found = [await on_medium(h.tier, k) for k in keys]
                if None in found:
                    pytest.skip("the tier has no chunk_exists primitive to ask the medium")
                assert found == [False, False, True, True], (
                    f"remove() reported the first two done; the medium says {found} for the four keys"
                )

        self.run(backend, check)

    @once_per_class
    def test_capacity_bounds_what_is_held(self, tmp_path: Path, backend: Backend) -> None:
        """With ``capacity_bytes`` for 8 chunks, 24 stored: at most 8 held (by ``lookup`` and
        on the medium), and those held are the newest and load whole."""
        limit = 8
        try:
            h = self.make(tmp_path, capacity_bytes=limit * (self.chunk_bytes + 4096))  # room for headers
        except TierConfigError as e:
            pytest.skip(f"the tier takes no capacity_bytes of {limit} chunks: {e}")

        async def check() -> None:
            async with h.tier:
                data = h.fill(33)
                keys = new_keys(3 * limit, "cap")
                for r in range(3):
                    part = keys[r * limit : (r + 1) * limit]
                    assert (await h.tier.offload(part, list(range(limit)))).ok
                hits = await h.tier.lookup(keys)
                held = [k for k, hit in zip(keys, hits) if hit]
                assert 0 < len(held) <= limit, f"{len(held)} of {len(keys)} chunks held under a capacity of {limit}"
                # (a medium that fits fewer than 8 drops some of the last call's too, in the
                # order its writes ended)
                assert set(held) <= set(keys[-limit:]), "the chunks held are not the newest"
                found = [await on_medium(h.tier, k) for k in keys]
                if None not in found:
                    assert sum(map(bool, found)) <= limit, f"{sum(map(bool, found))} chunks on the medium"
                used = h.tier.stats().used_bytes
                assert used is None or used <= limit * (self.chunk_bytes + 4096), f"used_bytes {used}"
                h.zero()
                assert (await h.tier.load(held, list(range(len(held))))).ok
                assert all(h.chunk(i) == data[keys.index(k) % limit] for i, k in enumerate(held))

        self.run(backend, check)

    @once_per_class
    def test_stored_keys_lists_every_chunk(self, tmp_path: Path, backend: Backend) -> None:
        """``stored_keys`` is what ``asynctier fsck`` checks: a listing that omits chunks
        leaves them unchecked."""

        async def check() -> None:
            h = self.make(tmp_path)
            async with h.tier:
                h.fill(35)
                keys = new_keys(self.num_chunks, "list")
                assert (await h.tier.offload(keys, list(range(self.num_chunks)))).ok
                try:
                    listed = set(await h.tier.stored_keys())  # type: ignore[attr-defined]
                except (NotImplementedError, AttributeError):
                    pytest.skip("the tier cannot list its chunks")
                missing = [k for k in keys if k not in listed]
                assert not missing, f"stored_keys() omits {len(missing)} of {len(keys)} stored chunks"
                half = keys[: len(keys) // 2]
                assert (await h.tier.remove(half)).ok
                assert not set(half) & set(await h.tier.stored_keys()), "stored_keys() lists removed chunks"  # type: ignore[attr-defined]

        self.run(backend, check)

    @once_per_class
    def test_a_persistent_tier_finds_its_chunks_after_reopen(self, tmp_path: Path, backend: Backend) -> None:
        """A tier that says it is persistent (``persistent = True``, the default), built again
        from the same config, serves what the first instance stored."""

        config = self.tier_config(tmp_path)

        async def check() -> None:
            keys, data = await self._four_stored(self._build(config), "persist", 37)
            again = self._build(config)
            async with again.tier:
                assert await again.tier.lookup(keys) == [True] * 4, "a reopened persistent tier lost its chunks"
                assert (await again.tier.load(keys, [4, 5, 6, 7])).ok
                assert all(again.chunk(4 + i) == data[i] for i in range(4))

        self.run(backend, check)

    @once_per_class
    def test_two_layouts_on_one_medium_never_mix(self, tmp_path: Path, backend: Backend) -> None:
        """The same config under two namespaces (two models on one medium): the second never
        sees the first's chunks as its own, and its loads leave them intact. Refusing to open
        a medium that holds another layout is fine too."""

        config = self.tier_config(tmp_path)

        def build(namespace: str) -> Harness:
            return self._build(config, namespace)

        async def check() -> None:
            keys, data = await self._four_stored(build(self.namespace + "/a"), "layout", 36)
            b = build(self.namespace + "/b")
            try:
                await b.tier.open()
            except (TierConfigError, TierStateError):
                pass  # refused: the medium holds another layout
            else:
                async with b.tier:
                    assert await b.tier.lookup(keys) == [False] * 4, "another layout's chunks are reported stored"
                    res = await b.tier.load(keys, [0, 1, 2, 3])
                    assert not res.succeeded, "another layout's chunks were loaded"
            a2 = build(self.namespace + "/a")
            async with a2.tier:
                res = await a2.tier.load(keys, [4, 5, 6, 7])
                assert res.ok, f"a load under another layout destroyed this layout's chunks: {res.failed}"
                assert all(a2.chunk(4 + i) == data[i] for i in range(4))

        self.run(backend, check)

    @once_per_class
    def test_a_closed_tier_holds_nothing_of_the_callers_buffer(self, tmp_path: Path, backend: Backend) -> None:
        """After ``aclose()`` no view of the primary buffer is left with the tier: the caller
        may free or resize it (an export left behind makes that raise BufferError)."""
        spec = OffloadingSpec(self.chunk_bytes, self.num_chunks, namespace=self.namespace)
        buf: Any = mmap.mmap(-1, spec.total_bytes) if self.page_aligned_buffer else bytearray(spec.total_bytes)
        view = memoryview(buf)
        cfg = {**self.tier_config(tmp_path), "max_inflight": self.max_inflight}
        tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)

        async def check() -> None:
            async with tier:
                keys = new_keys(4, "export")
                assert (await tier.offload(keys, [0, 1, 2, 3])).ok
                assert (await tier.load(keys, [4, 5, 6, 7])).ok

        self.run(backend, check)
        gc.collect()
        view.release()  # the caller's own view: theirs to release once the tier is closed
        try:
            buf.close() if isinstance(buf, mmap.mmap) else buf.append(0)
        except BufferError as e:
            pytest.fail(f"the closed tier still holds a view of the caller's primary buffer: {e}")
