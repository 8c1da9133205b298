"""What the tests of the native workers share."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["native_workers"]


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
