"""What the tests of the native workers share."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from asynctier.engines import native as nativeio

__all__ = ["GroupSpy", "HeldToken", "native_workers"]


class HeldToken:
    """A slow path (a thread inside ``pool.hold()``) holding one of ``pool``'s I/O tokens from
    entry until :meth:`let_go` (or exit)."""

    def __init__(self, pool: nativeio.NativePool) -> None:
        self._holding, self._let_go = threading.Event(), threading.Event()

        def slow_path() -> None:
            self._holding.set()
            self._let_go.wait(60)

        self._thread = threading.Thread(target=pool.hold, args=(slow_path,))

    async def __aenter__(self) -> HeldToken:
        self._thread.start()
        assert await asyncio.to_thread(self._holding.wait, 60)
        return self

    def let_go(self) -> None:
        self._let_go.set()

    async def __aexit__(self, *exc: object) -> None:
        self.let_go()
        await asyncio.to_thread(self._thread.join)


class GroupSpy:
    """Counts the group jobs the pool is given, and their sizes (the real pool packs and runs
    them)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        real = nativeio.NativePool.packed_group  # (group() packs, then calls it)

        def packed_group(pool: nativeio.NativePool, slot: int, prio: int, n: int) -> Any:
            self.sizes.append(n)
            return real(pool, slot, prio, n)

        monkeypatch.setattr(nativeio.NativePool, "packed_group", packed_group)


def native_workers() -> dict[int, int]:
    """tid -> nice value of this process's native I/O workers (they name themselves)."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == "asynctier-nio":
                out[int(task.name)] = os.getpriority(os.PRIO_PROCESS, int(task.name))
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return out
