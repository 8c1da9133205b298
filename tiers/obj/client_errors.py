"""obstore's exceptions turned into the runtime's per-chunk failures.

obstore raises a handful of exception types whose text tells what happened (connection
refused, timed out, an HTTP status); the tier needs a failure kind for stats and callers,
and to know whether the store answered at all (which feeds the circuit breaker).
"""

from __future__ import annotations

import re

from asynctier.errors import ChunkError, ChunkTimeoutError, TierUnavailableError

__all__ = ["ObjectStoreIOError", "is_client_panic", "map_client_error"]


class ObjectStoreIOError(ChunkError, ConnectionError):
    """An object-store request failed (connection lost, server error); counted as ``io``."""

    kind = "io"


def is_client_panic(exc: BaseException) -> bool:
    """A Rust panic inside obstore, raised by pyo3 as ``PanicException`` (a ``BaseException``
    that is no answer from the store: a bug or an unchecked input on the client's side)."""
    return type(exc).__name__ == "PanicException" and type(exc).__module__ == "pyo3_runtime"


# (not "retry_timeout", which every retry error's debug dump contains)
_TIMEOUT_RE = re.compile(r"\bTimedOut\b|timed out|deadline has elapsed|kind: Timeout\b")
_CONNECT_RE = re.compile(r"kind: Connect\b|ConnectionRefused|tcp connect error|dns error", re.IGNORECASE)
_DROPPED_RE = re.compile(
    r"error sending request|connection (closed|reset|aborted)|ConnectionReset|BrokenPipe|IncompleteMessage|"
    r"unexpected EOF|error decoding response body|end of file before message length|body error",
    re.IGNORECASE,
)
_STATUS_RE = re.compile(r"status code: (\d{3})|status: (\d{3})")


def map_client_error(exc: BaseException, key: bytes, shown: str, timeout_s: float | None) -> tuple[ChunkError, bool]:
    """Our exception for an obstore one, and whether the store answered at all.

    ``shown`` is the exception's text as it may be shown (secrets removed); the whole text is
    only matched against, never shown.
    """
    raw = str(exc)
    msg = f"{type(exc).__name__}: {shown}"
    status = _STATUS_RE.search(shown)
    code = int(status.group(1) or status.group(2)) if status else None
    if code is not None and code < 500 and code != 408:
        return ObjectStoreIOError(msg, key), True  # the store answered (permission, precondition)
    if _CONNECT_RE.search(raw):
        return TierUnavailableError(f"object store unreachable: {msg}", key), False
    if code is not None:
        return TierUnavailableError(f"object store answered {code}: {msg}", key), False
    if _TIMEOUT_RE.search(raw):
        return ChunkTimeoutError(f"object-store request exceeded timeout_s={timeout_s}: {msg}", key), False
    if _DROPPED_RE.search(raw):
        return ObjectStoreIOError(msg, key), False
    return ObjectStoreIOError(msg, key), True
