"""What the tests of the native workers share."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from asynctier.engines import native as nativeio

__all__ = ["GroupSpy", "native_workers"]


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
