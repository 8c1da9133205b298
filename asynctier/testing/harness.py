"""What every check works with: the tier under test with its primary buffer, fresh keys, and
calls started side by side in a task group."""

from __future__ import annotations

import mmap
import os
import random
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import anyio.lowlevel
from anyio.abc import TaskGroup

from ..contract import SecondaryTierManager
from ..spec import OffloadingSpec

__all__ = ["Calls", "Harness", "new_keys"]

T = TypeVar("T")


class Harness:
    """One tier (built, not opened), its spec and its primary buffer."""

    def __init__(self, tier: SecondaryTierManager, spec: OffloadingSpec, buf: bytearray | mmap.mmap) -> None:
        self.tier = tier
        self.spec = spec
        self.buf = buf
        self.view = memoryview(buf)

    def chunk(self, cid: int) -> bytes:
        """A copy of primary slot ``cid``."""
        c = self.spec.chunk_bytes
        return bytes(self.buf[cid * c : (cid + 1) * c])

    def put(self, cid: int, data: bytes) -> None:
        """Write ``data`` into primary slot ``cid``."""
        c = self.spec.chunk_bytes
        self.buf[cid * c : (cid + 1) * c] = data

    def fill(self, seed: int) -> dict[int, bytes]:
        """Fill every slot with random bytes; returns slot -> bytes."""
        rnd = random.Random(seed)
        out = {}
        for cid in range(self.spec.num_chunks):
            out[cid] = rnd.randbytes(self.spec.chunk_bytes)
            self.put(cid, out[cid])
        return out

    def refill(self, data: dict[int, bytes]) -> None:
        """Put back what :meth:`fill` returned."""
        for cid, d in data.items():
            self.put(cid, d)

    def zero(self) -> None:
        self.buf[:] = bytes(len(self.buf))


def new_keys(n: int, tag: str = "k") -> list[bytes]:
    """``n`` keys no earlier check (or earlier run on the same medium) has used."""
    salt = os.urandom(4).hex()
    return [f"{tag}-{salt}-{i}".encode() for i in range(n)]


class Calls(Generic[T]):
    """Calls running side by side in a task group, their results kept in start order.

    ``await calls.all_begun()`` returns once every call started has entered the tier (run up
    to its first suspension), whatever order the event loop runs new tasks in (trio picks).
    """

    def __init__(self, tg: TaskGroup) -> None:
        self._tg = tg
        self.results: list[T | None] = []
        self._begun = 0

    def start(self, call: Callable[..., Awaitable[T]], *args: Any) -> None:
        """Start ``call(*args)``."""
        i = len(self.results)
        self.results.append(None)

        async def run() -> None:
            self._begun += 1
            self.results[i] = await call(*args)

        self._tg.start_soon(run)

    async def all_begun(self) -> None:
        while self._begun < len(self.results):  # the calls are not ours to signal: poll
            await anyio.lowlevel.checkpoint()

    def finished(self) -> list[T]:
        """Every result; fails if a call has not returned."""
        missing = [i for i, r in enumerate(self.results) if r is None]
        assert not missing, f"calls {missing[:5]} (of {len(self.results)}) have not returned"
        return [r for r in self.results if r is not None]
