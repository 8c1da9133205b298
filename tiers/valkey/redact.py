"""Keeping the password out of every text the tier produces (errors, logs): the known secrets
are masked wherever they appear, and any URL's user info is cut."""

from __future__ import annotations

import re
from collections.abc import Iterable

from asynctier.core.redaction import SecretMask

__all__ = ["Scrubber"]

_MAX_SHOWN = 600
# scheme://userinfo@ inside free text: the user info is dropped
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]*@")


class Scrubber:
    """``scrub(text)``: ``text`` with every secret replaced by ``***`` and URLs without user info."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._mask = SecretMask(secrets)

    def scrub(self, text: str) -> str:
        return _USERINFO.sub(lambda m: m["scheme"], self._mask.mask(text))[:_MAX_SHOWN]
