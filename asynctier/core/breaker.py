"""A circuit breaker for a medium that keeps failing: after repeated failures, requests fail at
once instead of waiting on it, and one probe at a time finds out when it is back.

Shared by the obj tier (per object store), the valkey tier (per node) and the chain tier (per
tier of the chain).
"""

from __future__ import annotations

import threading
import time

from ..errors import TierUnavailableError

__all__ = ["Breaker"]


class Breaker:
    """Closed -> open after ``threshold`` consecutive failures -> half-open probe.

    While open, every request fails at once with :class:`TierUnavailableError`; after
    ``cooldown_s`` one request goes through as the probe, and its success closes the breaker
    (its failure opens it for another ``cooldown_s``). ``what`` names the medium in the error.
    Thread-safe: outcomes may be reported from worker threads.
    """

    def __init__(self, threshold: int, cooldown_s: float, what: str = "medium") -> None:
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.what = what
        self._lock = threading.Lock()
        self._failures = 0
        self._open_until: float | None = None  # None: closed
        self._probing = False
        self.opened = 0
        self.fast_failed = 0

    @property
    def state(self) -> str:
        """``closed``, ``open`` or ``half-open``."""
        with self._lock:
            if self._open_until is None:
                return "closed"
            return "half-open" if self._probing or time.monotonic() >= self._open_until else "open"

    def before(self) -> bool:
        """Admit a request or raise :class:`TierUnavailableError`; True if it is the probe."""
        with self._lock:
            if self._open_until is None:
                return False
            if self._probing or time.monotonic() < self._open_until:
                self.fast_failed += 1
                raise TierUnavailableError(
                    f"{self.what} unreachable: circuit breaker open after {self._failures} "
                    f"consecutive failures (retrying in at most {self.cooldown_s}s)"
                )
            self._probing = True
            return True

    def success(self, probe: bool) -> None:
        """The request got an answer: the medium is reachable."""
        with self._lock:
            self._failures = 0
            if probe or self._open_until is not None:
                self._open_until = None
            if probe:  # (one still out after another answer closed the breaker stays the one probe)
                self._probing = False

    def failure(self, probe: bool) -> None:
        """The request failed in a way that says the medium is not reachable."""
        with self._lock:
            self._failures += 1
            if probe:
                self._probing = False
                # closed meanwhile by another request's answer: an ordinary failure, counted
                probe = self._open_until is not None
            if probe or (self._open_until is None and self._failures >= self.threshold):
                if self._open_until is None:
                    self.opened += 1
                self._open_until = time.monotonic() + self.cooldown_s

    def neutral(self, probe: bool) -> None:
        """The request ended without telling whether the medium is reachable."""
        if probe:
            with self._lock:
                self._probing = False
