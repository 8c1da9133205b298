"""Engines run a tier's chunk jobs under its bound, loads first.

* :mod:`.threads` — OS threads for blocking primitives: the portable reference engine.
* :mod:`.tasks` — coroutine primitives, run in the caller's own task group.
* :mod:`.native` — C worker threads (``_nativeio.c``, job bodies in ``_nativeio_jobs.c``) that
  run whole chunk jobs without the GIL (the fs tier's, the nvme tier's loads); an accelerator
  with the threads engine as its fallback. Imported only by the tiers that use it.
* :mod:`.split` — the native engine for the operations with a fast path, the threads engine
  for the rest, under one bound (the nvme tier's).

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
