"""The C twins of per-chunk Python helpers (``asynctier/_speedups.c``), bound once to the
``XXH3_64bits`` the native workers hash with: a file's name and header for the fs tier, a
run's headers, a read header's check and the journal's records for the nvme tier. Each has
its Python reference beside its caller, which serves where this gives None."""

from __future__ import annotations

from types import ModuleType

from .native import xxh3_address

__all__ = ["speedups"]

_SPEEDUPS: list[ModuleType | None] = []


def speedups() -> ModuleType | None:
    """:mod:`asynctier._speedups`, the C twins of per-chunk Python helpers, set to hash with
    the ``XXH3_64bits`` the workers use; None where it was not built or that is not loaded
    (then the Python twins serve)."""
    if not _SPEEDUPS:
        mod: ModuleType | None = None
        addr = xxh3_address()
        if addr is not None:
            try:
                from asynctier import _speedups
            except ImportError:  # pragma: no cover - installed without a C compiler
                pass
            else:
                _speedups.use_xxh3(addr)
                mod = _speedups
        _SPEEDUPS.append(mod)
    return _SPEEDUPS[0]
