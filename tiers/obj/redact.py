"""Keeping secrets out of every text the tier produces (errors, reprs, logs).

Credentials, secret-looking store config values, the matching environment variables and the
URL's user info and query string are collected once; any text shown is scrubbed of them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

__all__ = ["Scrubber", "redact_url"]

#: Store config keys whose values are secrets.
_SECRET_HINTS = ("secret", "token", "key", "password", "sas", "credential")
#: obstore appends a multi-line dump of the error's fields; the first lines say it all.
_DEBUG_DUMP = "\n\nDebug source:"
_MAX_SHOWN = 600


def redact_url(url: str) -> str:
    """The URL without user info or query (an Azure SAS token can hide in either)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


def _is_secret_name(name: str) -> bool:
    return any(h in name.lower() for h in _SECRET_HINTS)


class Scrubber:
    """Replaces every known secret in a text with ``***``."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    @classmethod
    def for_store(
        cls,
        url: str,
        credentials: Mapping[str, Any],
        config: Mapping[str, Any],
        env_prefix: str | None,
    ) -> Scrubber:
        out = [v for v in credentials.values() if isinstance(v, str)]
        out += [v for k, v in config.items() if isinstance(v, str) and _is_secret_name(k)]
        if env_prefix:
            out += [v for k, v in os.environ.items() if k.startswith(env_prefix) and _is_secret_name(k)]
        parts = urlsplit(url)
        out += [p for p in (parts.password, parts.username, parts.query) if p]
        return cls(out)

    def scrub(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "***")
        text = text.split(_DEBUG_DUMP, 1)[0].strip()
        return text[:_MAX_SHOWN]
