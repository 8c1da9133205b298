"""The client's errors as per-chunk failures, and whether each one means the server answered
(the circuit breaker counts only the failures to reach it)."""

from __future__ import annotations

from valkey import exceptions as vx

from asynctier.errors import CapacityError, ChunkError, ChunkTimeoutError, IntegrityError, TierUnavailableError

__all__ = ["ValkeyIOError", "map_client_error", "refused"]


class ValkeyIOError(ChunkError):
    """The server refused a command (an error reply other than out-of-memory), or the client failed."""

    kind = "io"


#: Refused credentials or commands, as a cluster client's failure to read the layout says them
#: (it raises ValkeyClusterException with the cause in its text only)
_REFUSED = ("invalid username-password pair", "WRONGPASS", "NOAUTH", "NOPERM", "Authentication required")


def refused(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it came from, is the server refusing the credentials or a
    command: an answer (valkey-py makes AuthenticationError a ConnectionError)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, (vx.AuthenticationError, vx.AuthorizationError, vx.NoPermissionError)):
            return True
        if any(r in str(e) for r in _REFUSED):
            return True
        e = e.__cause__ or e.__context__
    return False


def map_client_error(exc: BaseException, key: bytes, text: str) -> tuple[ChunkError, bool]:
    """``exc`` (a client error, its message scrubbed as ``text``) as ``key``'s failure, and
    True if the server answered (it is reachable)."""
    if isinstance(exc, ChunkError):
        return exc, not isinstance(exc, (ChunkTimeoutError, TierUnavailableError))
    if isinstance(exc, vx.OutOfMemoryError):
        return CapacityError(
            f"the server is full (maxmemory reached, nothing its eviction policy may evict): {text}", key
        ), True
    if isinstance(exc, (vx.TimeoutError, TimeoutError)):
        return ChunkTimeoutError(f"the server did not answer in time: {text}", key), False
    if isinstance(exc, vx.BusyLoadingError):
        return TierUnavailableError(f"the server is loading its data set: {text}", key), False
    if refused(exc):  # (before the cluster client's "cannot be connected", which may say this)
        return ValkeyIOError(f"the server refused the credentials or the command: {text}", key), True
    if isinstance(exc, (vx.ConnectionError, OSError, vx.ClusterDownError, vx.ValkeyClusterException)):
        return TierUnavailableError(f"valkey server unreachable: {text}", key), False
    if isinstance(exc, vx.ResponseError) and str(exc).startswith("WRONGTYPE"):
        # a list, a hash, ... under a chunk's name: foreign data, dropped as a bad value is
        return IntegrityError("the key holds a value of another type, not a chunk", key), True
    if isinstance(exc, vx.ResponseError):
        return ValkeyIOError(f"the server refused the command: {text}", key), True
    return ValkeyIOError(f"valkey client error ({type(exc).__name__}): {text}", key), True
