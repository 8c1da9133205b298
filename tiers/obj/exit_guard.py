"""Exit safety: no object-store request is mid-flight while the interpreter tears down.

obstore's *async* API resolves Python futures from its Rust runtime's threads; a thread that
calls into a finalizing interpreter is ended with ``pthread_exit``, which must not unwind
through Rust frames (the process aborts). The tier therefore never uses the async API: chunk
I/O calls the synchronous API from the tier's own worker threads. Those are daemon threads,
so as a second line an ``atexit`` hook refuses new requests and waits, bounded, for those in
progress.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
from collections.abc import Iterator

from asynctier.errors import TierUnavailableError

__all__ = ["EXIT", "EXIT_WAIT_CAP_S", "ExitGuard"]

log = logging.getLogger(__name__)

#: Longest the exit hook waits for object-store calls in progress: a stalled store must not
#: hold up the exit for minutes.
EXIT_WAIT_CAP_S = 10.0


class ExitGuard:
    """Counts obstore calls in progress; at interpreter exit, refuses new ones and waits."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._calls = 0
        self._exiting = False
        self._last_abnormal = 0.0
        self.max_wait_s = 0.0

    def allow_for(self, request_s: float) -> None:
        """Let the exit wait up to ``request_s`` (one request's worst case), within the cap."""
        self.max_wait_s = min(EXIT_WAIT_CAP_S, max(self.max_wait_s, request_s))

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        with self._cv:
            if self._exiting:
                raise TierUnavailableError("the interpreter is exiting; no new object-store requests")
            self._calls += 1
        ok = False
        try:
            yield
            ok = True
        finally:
            with self._cv:
                self._calls -= 1
                if not ok:
                    self._last_abnormal = time.monotonic()
                if self._calls == 0:
                    self._cv.notify_all()

    def quiesce(self) -> None:
        """Stop new calls; wait (bounded by the longest request deadline) for those running."""
        with self._cv:
            self._exiting = True
            deadline = time.monotonic() + self.max_wait_s
            while self._calls:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("obj tier: %d object-store calls still running at exit", self._calls)
                    break
                self._cv.wait(left)
            recent = time.monotonic() - self._last_abnormal < 1.0
        if recent:
            # A request abandoned on error may leave its body (a view of our buffer) in the
            # HTTP client's connection task for a moment; let it be released before teardown.
            time.sleep(0.1)


EXIT = ExitGuard()
atexit.register(EXIT.quiesce)
