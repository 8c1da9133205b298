"""One object-store request at a time through the circuit breaker, the exit guard and the error
mapping: what every primitive wraps its obstore calls in."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from obstore.exceptions import NotFoundError

from asynctier.core.breaker import Breaker
from asynctier.errors import ChunkError, ChunkNotFoundError, IntegrityError

from .client_errors import ObjectStoreIOError, is_client_panic, map_client_error
from .exit_guard import EXIT
from .redact import Scrubber

__all__ = ["RequestGuard"]


class RequestGuard:
    """``with guard.request(key): obstore...``: admitted by the breaker (or failed at once),
    counted by the exit guard, and any obstore error turned into the key's failure, with the
    outcome reported to the breaker."""

    def __init__(self, breaker: Breaker, scrubber: Scrubber, timeout_s: float | None) -> None:
        self.breaker = breaker
        self.scrubber = scrubber
        self.timeout_s = timeout_s

    @contextlib.contextmanager
    def request(self, key: bytes) -> Iterator[None]:
        breaker = self.breaker
        probe = breaker.before()
        try:
            with EXIT.call():
                yield
        except (ChunkNotFoundError, NotFoundError, FileNotFoundError) as e:
            breaker.success(probe)
            if "<Code>NoSuchBucket</Code>" in str(e):  # not the chunk: the whole store
                raise ObjectStoreIOError(
                    f"the bucket does not exist (check the url): {self.scrubber.scrub(str(e))}", key
                ) from None
            raise ChunkNotFoundError(f"no chunk stored under key {key.hex()[:32]}", key) from None
        except IntegrityError:
            breaker.success(probe)  # the store answered; the object is bad
            raise
        except ChunkError:
            breaker.neutral(probe)
            raise
        except Exception as e:
            mapped, reachable = map_client_error(e, key, self.scrubber.scrub(str(e)), self.timeout_s)
            if reachable:
                breaker.success(probe)
            else:
                breaker.failure(probe)
            raise mapped from None
        except BaseException as e:
            # not an answer either way (an interrupt, a panic in the client): the probe's turn
            # must still end, or the breaker waits for it for good and refuses everything
            breaker.neutral(probe)
            if not is_client_panic(e):
                raise
            raise ObjectStoreIOError(f"the object-store client failed: {self.scrubber.scrub(str(e))}", key) from None
        else:
            breaker.success(probe)
