"""The error hierarchy.

Two families, kept apart on purpose:

* **Programmer and configuration errors** are raised at once, before any I/O: bad
  configuration is a :class:`TierConfigError` (a ``ValueError``, as in vLLM's factory),
  bad call arguments are plain ``TypeError`` / ``ValueError`` / ``IndexError``, and using
  a tier that is not open or already closed is a :class:`TierStateError`.
* **Per-chunk failures** (:class:`ChunkError` and ``OSError``) are never raised by
  ``offload``/``load``: they are returned in :attr:`TransferResult.failed`, keyed by the
  chunk key, and counted in :class:`~asynctier.stats.TierStats` by :func:`failure_kind`.
"""

from __future__ import annotations

__all__ = [
    "AsyncTierError",
    "BackpressureError",
    "CapacityError",
    "ChunkError",
    "ChunkNotFoundError",
    "ChunkTimeoutError",
    "IntegrityError",
    "MediumDamagedError",
    "MediumMismatchError",
    "TierClosedError",
    "TierConfigError",
    "TierNotOpenError",
    "TierStateError",
    "TierUnavailableError",
    "failure_kind",
    "FAILURE_KINDS",
]


class AsyncTierError(Exception):
    """Base class of every error asynctier defines."""


class TierConfigError(AsyncTierError, ValueError):
    """A tier configuration is wrong: unknown type, unknown or missing parameter, bad value."""


class MediumMismatchError(TierConfigError):
    """The medium holds something other than what the config describes (another layout, not a
    slab at all), found as the tier opens; nothing was written. ``found`` says what, without
    the message's advice (``asynctier fsck``, which formats nothing, gives its own)."""

    def __init__(self, message: str, found: str) -> None:
        super().__init__(message)
        self.found = found


class TierStateError(AsyncTierError, RuntimeError):
    """The tier is in the wrong state for the call."""


class MediumDamagedError(TierStateError):
    """An open that may not repair (the nvme tier's ``create=False``, what ``asynctier fsck``
    opens with) found the medium damaged so that repairing it would lose chunks: a damaged
    or truncated slab, a lost index. Nothing was written."""


class TierNotOpenError(TierStateError):
    """The tier was used before ``await tier.open()`` (or ``async with tier``)."""


class TierClosedError(TierStateError):
    """The tier was used after ``await tier.aclose()``."""


class ChunkError(AsyncTierError):
    """A failure of one chunk's transfer; returned in ``TransferResult.failed``, never raised."""

    kind = "other"

    def __init__(self, message: str, key: bytes | None = None) -> None:
        super().__init__(message)
        self.key = key


class ChunkNotFoundError(ChunkError):
    """The tier holds no chunk under this key."""

    kind = "not_found"


class IntegrityError(ChunkError):
    """The stored chunk failed verification (checksum, header, length or layout digest).

    The bad copy has been removed when this is reported.
    """

    kind = "checksum"
    #: Where the tier found the bad copy (tier-specific, say a slot and its sequence
    #: number), so that removing it cannot take a good copy stored since; None: by key.
    copy: object = None


class BackpressureError(ChunkError):
    """A store was dropped because no I/O slot freed up in time (``store_backpressure="drop"``)."""

    kind = "backpressure"


class ChunkTimeoutError(ChunkError, TimeoutError):
    """The chunk's I/O did not finish within its deadline (``timeout_s``)."""

    kind = "timeout"


class CapacityError(ChunkError):
    """No room could be made for the chunk (everything evictable is in use)."""

    kind = "capacity"


class TierUnavailableError(ChunkError):
    """The medium is unreachable (for example a circuit breaker is open after repeated failures)."""

    kind = "unavailable"


class Withdrawn(Exception):
    """A chunk of a cancelled call left undone (its I/O never began, or it is not tried again),
    as a tier's booking notes it (the runtime's own: the call itself raises the cancellation;
    not counted as a failure)."""


FAILURE_KINDS = ("io", "checksum", "not_found", "backpressure", "timeout", "capacity", "unavailable", "other")


def failure_kind(exc: BaseException) -> str:
    """Classify a per-chunk failure into one of :data:`FAILURE_KINDS` for stats."""
    if isinstance(exc, ChunkError):
        return exc.kind if exc.kind in FAILURE_KINDS else "other"  # a tier's own kind: counted, not lost
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, FileNotFoundError):
        return "not_found"
    if isinstance(exc, OSError):
        return "io"
    return "other"
