"""Masking known secrets in a text (an error, a log line): what the remote tiers' scrubbers
share. Each secret becomes ``***`` wherever it appears; one shorter than
:data:`SHORT_SECRET` only where it stands alone, so that a message stays readable (a password
"1" masked every 1 of an errno, an address and a port)."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["MASK", "SHORT_SECRET", "SecretMask"]

MASK = "***"
SHORT_SECRET = 8


class SecretMask:
    """``mask(text)``: ``text`` with each of ``secrets`` replaced by :data:`MASK`."""

    def __init__(self, secrets: Iterable[str]) -> None:
        given = {s for s in secrets if s}
        self._long = sorted((s for s in given if len(s) >= SHORT_SECRET), key=len, reverse=True)
        short = sorted((s for s in given if len(s) < SHORT_SECRET), key=len, reverse=True)
        alone = "|".join(re.escape(s) for s in short)
        self._short = re.compile(rf"(?<![A-Za-z0-9])(?:{alone})(?![A-Za-z0-9])") if short else None

    def mask(self, text: str) -> str:
        for s in self._long:
            text = text.replace(s, MASK)
        return text if self._short is None else self._short.sub(MASK, text)
