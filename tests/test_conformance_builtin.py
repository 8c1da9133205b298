"""The conformance suite, on asyncio, uvloop and trio, against the built-in memory tier and
the example out-of-tree tiers (which rely on the base class's integrity framing); its
cancellation and deadline checks also against slow test tiers, blocking and coroutine."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from asynctier import AsyncChunkTier, BlockingChunkTier, ChunkNotFoundError
from asynctier.integrity import key_token
from asynctier.testing import CancellationChecks, ConcurrencyChecks, Harness, TierConformance


class TestMemoryTier(TierConformance):
    """The memory tier stores the base class's framed records: the suite's default hooks
    damage them through its own primitives."""

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "memory"}


class TestMemoryTierWithCapacity(TierConformance):
    """Capacity generous enough for the checks; eviction itself is tested in test_memory.py.
    The event loops are covered by TestMemoryTier: one backend here."""

    backends = ("asyncio",)

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "memory", "capacity_bytes": 4096 * self.chunk_bytes}


class TestMemoryTierSmallPrimary(ConcurrencyChecks):
    """A primary region small beside the in-flight bound (legal class settings): the race
    check's readers loaded into slots past its end."""

    backends = ("asyncio",)
    num_chunks = 16
    max_inflight = 32

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "memory"}


class TestReadmeDirTier(TierConformance):
    """The README's custom tier, loaded out-of-tree by module_path; the suite's default
    integrity hooks rewrite its records through its own primitives."""

    backends = ("asyncio", "trio")  # uvloop: covered by the memory, native fs, nvme and chain classes

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "DirTier", "module_path": "dir_tier", "root": str(tmp_path / "kv")}

    def chunk_path(self, h: Harness, key: bytes) -> Path:
        return Path(h.tier.dir) / key_token(key)  # type: ignore[attr-defined]


class TestAsyncDictTier(TierConformance):
    """A tier with coroutine primitives, loaded out-of-tree by module_path."""

    backends = ("asyncio", "trio")  # uvloop: covered by the memory, native fs, nvme and chain classes

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "AsyncDictTier", "module_path": "async_dict_tier"}


# -- interrupted calls on a slow medium ----------------------------------------------------------
# On a fast medium the chunk I/O still running when an interruption lands ends within
# microseconds, before the caller could see it; these tiers take milliseconds per primitive, so
# a runtime that let the caller go before its I/O ended fails the checks below.
SLOW_IO_S = 0.002


class SlowDictTier(BlockingChunkTier):
    """Records in a dict; every read and write takes a few milliseconds on its worker thread."""

    frames_own_bytes = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._records: dict[bytes, bytes] = {}

    def write_chunk(self, key: bytes, data: memoryview) -> None:
        time.sleep(SLOW_IO_S)
        self._records[key] = bytes(data)

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        time.sleep(SLOW_IO_S)
        try:
            out[:] = self._records[key]
        except KeyError:
            raise ChunkNotFoundError("not stored", key) from None

    def chunk_exists(self, key: bytes) -> bool:
        return key in self._records

    def delete_chunk(self, key: bytes) -> bool:
        return self._records.pop(key, None) is not None


class SlowAsyncDictTier(AsyncChunkTier):
    """The coroutine counterpart: every read and write awaits a few milliseconds."""

    frames_own_bytes = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._records: dict[bytes, bytes] = {}

    async def write_chunk(self, key: bytes, data: memoryview) -> None:
        await anyio.sleep(SLOW_IO_S)
        self._records[key] = bytes(data)

    async def read_chunk(self, key: bytes, out: memoryview) -> None:
        await anyio.sleep(SLOW_IO_S)
        try:
            out[:] = self._records[key]
        except KeyError:
            raise ChunkNotFoundError("not stored", key) from None

    async def chunk_exists(self, key: bytes) -> bool:
        return key in self._records

    async def delete_chunk(self, key: bytes) -> bool:
        return self._records.pop(key, None) is not None


class TestSlowBlockingTierInterrupted(CancellationChecks):
    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "SlowDictTier", "module_path": __name__}


class TestSlowAsyncTierInterrupted(CancellationChecks):
    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "SlowAsyncDictTier", "module_path": __name__}


@pytest.mark.parametrize("backends", ["trio", ("tiro",), (), ["asyncio", "tiro"]])
def test_a_conformance_class_with_bad_backends_fails_loudly(backends: Any) -> None:
    """``backends = ("trio")`` (a str) or a typo was filtered away before it was checked:
    every check of the class skipped, and the suite passed."""

    class Typo(TierConformance):
        def tier_config(self, tmp_path: Path) -> dict[str, Any]:
            return {"type": "memory"}

    Typo.backends = backends

    class Metafunc:
        fixturenames = ("backend",)

        def function(self) -> None:
            pass

        def parametrize(self, *args: Any, **kwargs: Any) -> None:
            raise AssertionError("parametrized despite bad backends")

    with pytest.raises(ValueError, match=r"TierConformance.backends must be a non-empty tuple of 'asyncio'"):
        Typo().pytest_generate_tests(Metafunc())  # type: ignore[arg-type]


class SleepyDictTier(BlockingChunkTier):
    """Records in a dict, each write taking 5 ms (I/O in flight long enough to be seen)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._records: dict[bytes, bytes] = {}

    def write_chunk(self, key: bytes, data: memoryview) -> None:
        time.sleep(0.005)
        self._records[key] = bytes(data)

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        if key not in self._records:
            raise ChunkNotFoundError("not stored", key)
        out[:] = self._records[key]

    def chunk_exists(self, key: bytes) -> bool:
        return key in self._records

    def delete_chunk(self, key: bytes) -> bool:
        return self._records.pop(key, None) is not None


@pytest.mark.parametrize("eager", [False, True])
def test_an_eager_interruption_lands_once_chunk_io_is_in_flight(eager: bool) -> None:
    """The suite's interruptions wait for a chunk to move; on a busy host a blocking tier's
    threads could end the whole call first, 30 times over (the README's DirTier failed that
    way). Its later attempts interrupt as soon as I/O is in flight: here a counter that never
    moves, and only the eager attempt lands."""
    from asynctier import OffloadingSpec, SecondaryTierFactory
    from asynctier.testing.interrupts import interrupt_mid_call

    spec = OffloadingSpec(4096, 64, namespace="test/eager")
    buf = bytearray(spec.total_bytes)
    config = {"type": "SleepyDictTier", "module_path": __name__, "max_inflight": 2}
    tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(buf), spec)
    h = Harness(tier, spec, buf)

    async def check() -> None:
        async with tier:
            keys = [b"k%d" % i for i in range(64)]
            got = await interrupt_mid_call(h, lambda: tier.offload(keys, list(range(64))), lambda: 0, "cancel",
                                           eager=eager)  # fmt: skip
            assert got.landed == eager and got.in_flight == 0 and got.queued == 0

    anyio.run(check)
