"""The event loops the conformance suite runs each check on, and how it starts them.

Every check starts its own loop with :func:`anyio.run`, so the suite needs no pytest plugin
(pytest-asyncio, anyio's or pytest-trio): ``"asyncio"`` is the stock loop, ``"uvloop"`` the
asyncio backend on uvloop, ``"trio"`` trio.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import anyio
import pytest

__all__ = ["BACKENDS", "Backend", "backend_params", "loop_factories", "run_on_backend"]

#: Every backend the suite knows, in the order the checks run on them.
BACKENDS: tuple[str, ...] = ("asyncio", "uvloop", "trio")

#: A backend name, or (kept for suites written before anyio) an asyncio loop factory.
Backend: TypeAlias = str | Callable[[], asyncio.AbstractEventLoop]

# the module each backend needs beyond anyio; a backend whose module is missing is skipped
_NEEDS = {"asyncio": None, "uvloop": "uvloop", "trio": "trio"}

#: The longest one check may run; a runtime that never returns control fails it, not the run.
CHECK_DEADLINE_S = 60.0


def loop_factories() -> dict[str, Callable[[], asyncio.AbstractEventLoop]]:
    """asyncio event loops (for pytest-asyncio and the benchmarks): the stock one, and uvloop
    when it is installed."""
    out: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {"asyncio": asyncio.new_event_loop}
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a core dependency where it installs
        pass
    else:
        out["uvloop"] = uvloop.new_event_loop
    return out


def backend_params(names: tuple[str, ...]) -> list[Any]:
    """``pytest.param`` per backend name (its id is the name); one not installed is skipped."""
    params = []
    for name in names:
        if name not in _NEEDS:
            raise ValueError(f"unknown backend {name!r} in TierConformance.backends; known: {', '.join(BACKENDS)}")
        module = _NEEDS[name]
        marks = []
        if module is not None and importlib.util.find_spec(module) is None:
            marks.append(pytest.mark.skip(reason=f"{module} is not installed"))
        params.append(pytest.param(name, id=name, marks=marks))
    return params


def run_on_backend(backend: Backend, check: Callable[..., Awaitable[None]], *args: Any) -> None:
    """Run ``check(*args)`` to its end on a fresh event loop of ``backend``."""

    async def bounded() -> None:
        with anyio.fail_after(CHECK_DEADLINE_S):
            await check(*args)

    if callable(backend):  # an asyncio loop factory, from a subclass's own loop_factory fixture
        anyio.run(bounded, backend="asyncio", backend_options={"loop_factory": backend})
    elif backend == "uvloop":
        anyio.run(bounded, backend="asyncio", backend_options={"use_uvloop": True})
    elif backend in ("asyncio", "trio"):
        anyio.run(bounded, backend=backend)
    else:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
