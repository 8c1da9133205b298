"""The obj tier's circuit breaker: the shared :class:`asynctier.core.breaker.Breaker`, built
from the tier's ``breaker_threshold`` and ``breaker_cooldown_s``."""

from __future__ import annotations

from asynctier.core.breaker import Breaker

from .params import integer, seconds

__all__ = ["Breaker", "configured_breaker"]


def configured_breaker(threshold: object, cooldown_s: object) -> Breaker:
    """A breaker from the tier's ``breaker_threshold`` and ``breaker_cooldown_s``, checked."""
    return Breaker(
        integer("breaker_threshold", threshold),
        seconds("breaker_cooldown_s", cooldown_s, zero_ok=True),
        what="object store",
    )
