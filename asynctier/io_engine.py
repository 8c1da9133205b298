"""The ``io_engine`` parameter: one vocabulary for every tier that moves bytes with system calls.

Two engines execute a tier's chunk protocol:

* ``"threads"`` — Python worker threads making the system calls (``preadv``/``pwritev`` release
  the GIL). Portable; the reference path and the fallback of the native engine.
* ``"native"`` — C worker threads running each chunk's whole job (open to close) without the
  GIL (:mod:`asynctier.engines.native`). Built when a C compiler was there at install time.

``"auto"`` (the default) takes ``"native"`` where the tier supports it and it is built, else
``"threads"``. Old values: ``"psync"`` (the nvme tier's former name for threads) still works
for one release with a :class:`DeprecationWarning`; ``"io_uring"`` was retired (the project's
own measurements: docs/benchmarks.md) and is refused with a message naming the current values.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Literal

from .errors import TierConfigError

__all__ = ["IO_ENGINES", "IoEngine", "check_io_engine", "runs_native"]

IoEngine = Literal["auto", "threads", "native"]
IO_ENGINES: tuple[IoEngine, ...] = ("auto", "threads", "native")

log = logging.getLogger("asynctier")

_DEPRECATED = {"psync": "threads"}
_RETIRED = ("io_uring", "ring", "uring")


def check_io_engine(tier_type: str, value: object, supported: tuple[IoEngine, ...] = IO_ENGINES) -> IoEngine:
    """``value`` as one of ``supported``; a deprecated name is mapped with a warning.

    Raises :class:`TierConfigError` naming the accepted values for anything else, the retired
    ``"io_uring"`` included.
    """
    accepted = ", ".join(map(repr, supported))
    if not isinstance(value, str):
        raise TierConfigError(f"io_engine must be a str, one of {accepted}; got {value!r}")
    if value in _DEPRECATED:
        new = _DEPRECATED[value]
        warnings.warn(
            f"{tier_type}: io_engine={value!r} is deprecated and will be refused in the next release; "
            f"use io_engine={new!r} (the same worker threads)",
            DeprecationWarning,
            stacklevel=4,
        )
        value = new
    if value in _RETIRED:
        raise TierConfigError(
            f"{tier_type}: io_engine={value!r} was retired (the native and threads engines measured faster); "
            f"accepted: {accepted}"
        )
    for engine in supported:
        if value == engine:
            return engine
    raise TierConfigError(f"{tier_type}: io_engine must be one of {accepted}; got {value!r}")


def runs_native(io_engine: IoEngine) -> bool:
    """Whether a tier configured with ``io_engine`` runs on the native workers here: ``"auto"``
    where they are available, ``"native"`` always (else :class:`TierConfigError` saying why
    they are not), ``"threads"`` never."""
    if io_engine == "threads":
        return False
    from .engines import native  # loads the workers' library: only when a tier opens

    why = native.problem()
    if io_engine == "native" and why is not None:
        raise TierConfigError(f"io_engine='native' but native I/O workers are unavailable here: {why}")
    if sys.platform.startswith("linux"):  # (elsewhere threads are the only engine: nothing to tell)
        _tell_missing_parts(why)
    return why is None


_told: set[str] = set()


def _tell_missing_parts(why: str | None) -> None:
    """Log, once a process, an optional C part that does not serve here: both are built at
    install time where a C compiler is, and a failed build leaves ``pip install`` silent."""
    if why is not None:
        if "workers" not in _told:
            _told.add("workers")
            log.warning(
                "asynctier: io_engine='auto' runs on Python threads here, not the native I/O workers: %s. "
                "Threads cost the event loop and the GIL more per chunk (docs/benchmarks.md); "
                "`asynctier info` lists what is built.",
                why,
            )
        return
    from .engines.speedups import speedups

    if speedups() is None and "twins" not in _told:
        _told.add("twins")
        log.warning(
            "asynctier: the C twins of per-chunk helpers (asynctier._speedups) do not serve here (not built, or "
            "no XXH3_64bits to hash with): their Python references do, at more event-loop CPU per chunk; "
            "`asynctier info` says which."
        )
