"""The machinery under every check: what a test class configures, how a check builds its
tier, on which backends it runs, and the hooks a tier's test class may override."""

from __future__ import annotations

import mmap
import os
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest

from .. import OffloadingSpec, SecondaryTierFactory
from .backends import BACKENDS, Backend, backend_params, run_on_backend
from .harness import Harness
from .records import corrupt_record, swap_records

__all__ = ["SuiteBase", "asyncio_only", "once_per_class"]

F = TypeVar("F", bound=Callable[..., Any])

#: Backends a check marked :func:`asyncio_only` may run on.
_ASYNCIO_BACKENDS = ("asyncio", "uvloop")


def asyncio_only(check: F) -> F:
    """Mark a check that tests asyncio's own API (``task.cancel()``): it runs on asyncio and
    uvloop only, whatever the class's ``backends`` say."""
    check._conformance_backends = _ASYNCIO_BACKENDS  # type: ignore[attr-defined]
    return check


def once_per_class(check: F) -> F:
    """Mark a check about the tier rather than the event loop: it runs once per class, on
    asyncio if the class's ``backends`` have it, else on the first of them."""
    check._conformance_once = True  # type: ignore[attr-defined]
    return check


class SuiteBase:
    """Configuration and machinery of :class:`~asynctier.testing.TierConformance`."""

    chunk_bytes: ClassVar[int] = 64 * 1024
    num_chunks: ClassVar[int] = 64
    max_inflight: ClassVar[int] = 4
    namespace: ClassVar[str] = "conformance/test"
    #: Run with a page-aligned primary buffer (as pinned memory is) instead of a bytearray,
    #: so tiers that use O_DIRECT take their zero-copy path.
    page_aligned_buffer: ClassVar[bool] = False
    #: The event loops every check runs on: any of "asyncio", "uvloop", "trio".
    backends: ClassVar[tuple[str, ...]] = BACKENDS
    #: Parameters the wrong-type check leaves out, each with the reason (a parameter that
    #: takes any object by design, for example).
    skip_parameters: ClassVar[Mapping[str, str]] = {}
    #: Name prefixes of threads that outlive a tier by design (a process-wide pool of its
    #: client library): the check that a closed tier leaves no thread running passes them over.
    shared_thread_prefixes: ClassVar[tuple[str, ...]] = ()

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        """The factory config of the tier under test (``type`` plus its own parameters)."""
        raise NotImplementedError

    # -- hooks a test class may override --------------------------------------------------
    async def corrupt_stored(self, h: Harness, key: bytes, how: str) -> None:
        """Damage the chunk stored under ``key`` on the medium: ``how`` is ``"flip"`` (change
        one byte of the payload) or ``"truncate"`` (leave it shorter).

        The default goes through the tier's own primitives, for tiers that let the base class
        frame their chunks (``frames_own_bytes = False``); any other tier must override this.
        """
        await corrupt_record(h.tier, key, how)

    async def swap_stored(self, h: Harness, key_a: bytes, key_b: bytes) -> None:
        """Leave under each key the bytes stored under the other (a misdirected write).

        Default: through the primitives, as :meth:`corrupt_stored`.
        """
        await swap_records(h.tier, key_a, key_b)

    def chunk_path(self, h: Harness, key: bytes) -> str | os.PathLike[str] | None:
        """The file a chunk stored under ``key`` lives in, for a tier that keeps chunks under
        file names (called on a worker thread). The non-regular-file check puts a FIFO there.
        Default: the tier keeps no such names, and that check is skipped."""
        return None

    def credential(self, tmp_path: Path) -> tuple[dict[str, Any], str] | None:
        """Config overrides carrying a credential, and the secret text in them that no repr,
        error, stats or log may show. Default: the tier takes no credential (check skipped)."""
        return None

    # -- machinery -------------------------------------------------------------------------
    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Parametrize each check's ``backend`` by :attr:`backends` (the test ids name it)."""
        if "backend" not in metafunc.fixturenames or self._loop_factory_overridden():
            return
        backends = self.backends
        # checked before narrowing: a typo, or ("trio") for ("trio",), had skipped every check
        if not isinstance(backends, (tuple, list)) or not backends or any(b not in BACKENDS for b in backends):
            raise ValueError(
                f"TierConformance.backends must be a non-empty tuple of {', '.join(map(repr, BACKENDS))}; "
                f"got {backends!r}"
            )
        allowed = getattr(metafunc.function, "_conformance_backends", BACKENDS)
        names = tuple(b for b in backends if b in allowed)
        if getattr(metafunc.function, "_conformance_once", False):
            names = ("asyncio",) if "asyncio" in names else names[:1]
        if not names:  # an asyncio-only check, in a class narrowed to trio
            reason = f"runs on {' and '.join(allowed)} only; this class's backends are {self.backends}"
            metafunc.parametrize("backend", [pytest.param(None, id="skipped", marks=pytest.mark.skip(reason=reason))])
            return
        metafunc.parametrize("backend", backend_params(names))

    @classmethod
    def _loop_factory_overridden(cls) -> bool:
        # a suite written before anyio picks its asyncio loops by overriding this fixture
        owner = next(k for k in cls.__mro__ if "loop_factory" in k.__dict__)
        return owner is not SuiteBase

    @pytest.fixture
    def loop_factory(self) -> None:
        """Superseded by :attr:`backends`: a subclass that still overrides this fixture (with
        asyncio loop factories as params) runs every check on those loops instead."""
        return None

    @pytest.fixture
    def backend(self, loop_factory: Backend) -> Backend:
        # reached only where a subclass overrides loop_factory; else `backend` is parametrized
        return loop_factory

    def make(self, tmp_path: Path, **overrides: Any) -> Harness:
        """Build (not open) the tier under test with ``overrides`` merged into its config."""
        spec = OffloadingSpec(self.chunk_bytes, self.num_chunks, namespace=self.namespace)
        buf: bytearray | mmap.mmap = (
            mmap.mmap(-1, spec.total_bytes) if self.page_aligned_buffer else bytearray(spec.total_bytes)
        )
        config = {**self.tier_config(tmp_path), "max_inflight": self.max_inflight, **overrides}
        tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(buf), spec)
        return Harness(tier, spec, buf)

    def run(self, backend: Backend, check: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run ``check(*args)`` on a fresh event loop of ``backend``."""
        run_on_backend(backend, check, *args)
