"""Keeping the password out of every text the tier produces (errors, logs): the known secrets
are masked wherever they appear, and any URL's user info is cut."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["Scrubber"]

_MASK = "***"
_MAX_SHOWN = 600
# scheme://userinfo@ inside free text: the user info is dropped
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]*@")


#: Secrets shorter than this are masked only where they stand alone: a password "1" turned
#: every 1 of a message (an errno, an address, a port) into ***.
_SHORT = 8


class Scrubber:
    """``scrub(text)``: ``text`` with every secret replaced by ``***`` and URLs without user info."""

    def __init__(self, secrets: Iterable[str]) -> None:
        given = {s for s in secrets if s}
        self._secrets = sorted((s for s in given if len(s) >= _SHORT), key=len, reverse=True)
        short = sorted((s for s in given if len(s) < _SHORT), key=len, reverse=True)
        alone = "|".join(re.escape(s) for s in short)
        self._short = re.compile(rf"(?<![A-Za-z0-9])(?:{alone})(?![A-Za-z0-9])") if short else None

    def scrub(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, _MASK)
        if self._short is not None:
            text = self._short.sub(_MASK, text)
        return _USERINFO.sub(lambda m: m["scheme"], text)[:_MAX_SHOWN]
