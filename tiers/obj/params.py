"""Checks of the tier's numeric parameters (durations, counts), each refused with its accepted range."""

from __future__ import annotations

from dataclasses import dataclass

from asynctier.core.validation import MAX_SECONDS, integer, seconds

__all__ = ["MAX_SECONDS", "Deadlines", "integer", "seconds"]


@dataclass(frozen=True)
class Deadlines:
    """How long a request may take, and how it is retried (obstore's client and retry config).

    ``timeout_s`` bounds each HTTP request; ``connect_timeout_s`` its connect phase.
    Retryable errors are retried at most ``max_retries`` times with exponential backoff from
    ``retry_backoff_s`` to ``retry_max_backoff_s``, and not after ``retry_timeout_s`` since
    the first attempt.
    """

    timeout_s: float
    connect_timeout_s: float
    max_retries: int
    retry_timeout_s: float
    retry_backoff_s: float
    retry_max_backoff_s: float

    @classmethod
    def parse(
        cls,
        timeout_s: float,
        connect_timeout_s: object,
        max_retries: object,
        retry_timeout_s: object,
        retry_backoff_s: object,
        retry_max_backoff_s: object,
    ) -> Deadlines:
        """Check the values (``timeout_s`` was checked by the tier); fill the defaults."""
        return cls(
            timeout_s=timeout_s,
            connect_timeout_s=seconds(
                "connect_timeout_s",
                connect_timeout_s if connect_timeout_s is not None else min(5.0, timeout_s),
                zero_ok=False,
            ),
            max_retries=integer("max_retries", max_retries, minimum=0, maximum=1000),
            retry_timeout_s=seconds(
                "retry_timeout_s", timeout_s if retry_timeout_s is None else retry_timeout_s, zero_ok=True
            ),
            retry_backoff_s=seconds("retry_backoff_s", retry_backoff_s, zero_ok=False),
            retry_max_backoff_s=seconds("retry_max_backoff_s", retry_max_backoff_s, zero_ok=False),
        )

    @property
    def worst_request_s(self) -> float:
        """Longest a single chunk I/O can take (the exit hook's bound)."""
        return self.timeout_s + self.retry_timeout_s + self.retry_max_backoff_s + 1.0
