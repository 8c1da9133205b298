"""What a job does (:class:`Op`) and in which order jobs of different kinds get an I/O slot."""

from __future__ import annotations

import enum

__all__ = ["Op", "PRIO_LOAD", "PRIO_LOOKUP", "PRIO_REMOVE", "PRIO_STORE", "priority_of"]

#: Lower runs first: loads are on the caller's latency path and go ahead of queued stores.
PRIO_LOAD = 0
PRIO_LOOKUP = 1
PRIO_STORE = 2
PRIO_REMOVE = 3


class Op(str, enum.Enum):
    """The operations a tier's chunk protocol implements; the value is the name users see
    (``TransferResult.op``, stats)."""

    STORE = "offload"
    LOAD = "load"
    LOOKUP = "lookup"
    REMOVE = "remove"
    VERIFY = "verify"

    @property
    def priority(self) -> int:
        return _PRIORITY[self]


# by value too: an Op is a str, equal to (and hashed as) its value
_PRIORITY: dict[str, int] = {
    Op.LOAD: PRIO_LOAD,
    Op.LOOKUP: PRIO_LOOKUP,
    Op.STORE: PRIO_STORE,
    Op.REMOVE: PRIO_REMOVE,
    Op.VERIFY: PRIO_REMOVE,
}


def priority_of(op: str) -> int:
    """The priority of ``op``, an :class:`Op` or its value (without ``Op(value)``'s lookup,
    about 30 bytecodes, on a path that runs per call)."""
    return _PRIORITY[op]
