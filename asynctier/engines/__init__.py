"""Engines run a tier's chunk jobs under its bound, loads first.

* :mod:`.threads` — OS threads for blocking primitives: the portable reference engine.
* :mod:`.tasks` — coroutine primitives, run in the caller's own task group.
* :mod:`.native` — C worker threads (``_nativeio.c``) that run the fs tier's whole chunk jobs
  without the GIL; an accelerator with the threads engine as its fallback. Imported only by
  the tiers that use it.

:class:`~.base.Engine` is what the runtime needs from each.
"""

from __future__ import annotations

from .base import DropHandler, Engine, EngineCounters
from .tasks import TaskEngine
from .threads import EngineStoppedError, ThreadEngine

__all__ = [
    "DropHandler",
    "Engine",
    "EngineCounters",
    "EngineStoppedError",
    "PrioritySlots",
    "TaskEngine",
    "ThreadEngine",
]
