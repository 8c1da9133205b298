"""Keeping secrets out of every text the tier produces (errors, reprs, logs).

Two layers. Every URL in a text loses its user info and its query string (an endpoint's
password, an Azure SAS token); the URL the tier was given is shown the same way. And the
values known to be secret — credentials, secret-looking store config values, the matching
environment variables, the passwords and query values of the URLs given — are replaced
wherever they appear, in whatever form the client printed them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from asynctier.core.redaction import SecretMask

__all__ = ["Scrubber", "redact_text", "redact_url"]

#: Store config keys (and HTTP header names) whose values are secrets.
_SECRET_HINTS = ("secret", "token", "key", "password", "sas", "credential", "authorization", "cookie")
#: Schemes whose URL user info names a container, not a user (abfs://container@account...).
CONTAINER_SCHEMES = ("abfs", "abfss", "az", "azure", "adl")
#: obstore appends a multi-line dump of the error's fields; the first lines say it all.
_DEBUG_DUMP = "\n\nDebug source:"
_MAX_SHOWN = 600
# scheme://[userinfo@]rest[?query][#fragment] inside free text; the user info runs to the
# last "@" before the path, as a URL parser reads it
_URL_IN_TEXT = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s?#]*@)?(?P<rest>[^\s?#\"'<>]*)"
    r"(?P<query>\?[^\s#\"'<>)]*)?(?P<fragment>#[^\s\"'<>)]*)?"
)


def redact_url(url: str) -> str:
    """``url`` without user info, query string or fragment (with or without ``//``). User
    info with a ":" runs to the last "@" (a password may hold "/", "?", "#" or "@" unencoded),
    before the query is cut: else a part of the password was shown."""
    scheme, sep, rest = url.partition(":")
    if not sep:
        return re.split(r"[?#]", url, maxsplit=1)[0]
    slashes = len(rest) - len(rest.lstrip("/"))
    rest = rest[slashes:]
    info, at, after = rest.rpartition("@")
    if at and ":" in info.split("/", 1)[0]:  # user:password@host
        rest = after
    rest = re.split(r"[?#]", rest, maxsplit=1)[0]
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = authority.rsplit("@", 1)[1]
    return f"{scheme}:{'/' * slashes}{authority}{slash}{path}"


def redact_text(text: str) -> str:
    """``text`` with every ``scheme://`` URL in it redacted as :func:`redact_url` does."""
    return _URL_IN_TEXT.sub(lambda m: m["scheme"] + m["rest"], text)


def is_secret_name(name: str) -> bool:
    return any(h in name.lower() for h in _SECRET_HINTS)


def _url_secrets(value: str) -> list[str]:
    """The password and query values of a URL-like ``value``, as given, decoded and encoded."""
    parts = urlsplit(value)
    out = [p for p in (parts.password, parts.query, parts.fragment) if p]
    if "@" in value and parts.password is None and parts.username and parts.scheme not in CONTAINER_SCHEMES:
        out.append(parts.username)  # "user@host": the whole user info
    out += [v for _, v in parse_qsl(parts.query or value.partition("?")[2], keep_blank_values=False)]
    return [form for s in out for form in (s, unquote(s), quote(s, safe=""))]


class Scrubber:
    """Replaces every known secret in a text with ``***`` and redacts the URLs in it."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._mask = SecretMask(secrets)

    @classmethod
    def for_store(
        cls,
        urls: Iterable[str | None],
        credentials: Mapping[str, Any],
        config: Mapping[str, Any],
        client_options: Mapping[str, Any],
        env_prefix: str | None,
    ) -> Scrubber:
        """The secrets of a store's options: ``urls`` (the tier's url, the endpoint),
        credentials, secret-looking config values and environment variables, and the URLs
        among the config and client options (a proxy URL may hold a password)."""
        out = [v for v in credentials.values() if isinstance(v, str)]
        out += [v for k, v in config.items() if isinstance(v, str) and is_secret_name(k)]
        if env_prefix:
            out += [v for k, v in os.environ.items() if k.startswith(env_prefix) and is_secret_name(k)]
        headers = client_options.get("default_headers")
        if isinstance(headers, Mapping):  # (an API key sent as a header comes back in a gateway's error body)
            values = [
                v.decode("latin-1") if isinstance(v, bytes) else v
                for k, v in headers.items()
                if isinstance(v, (str, bytes)) and is_secret_name(str(k))
            ]
            # "Bearer <token>": a gateway may echo the token alone
            out += values + [parts[1] for v in values if len(parts := v.split(None, 1)) == 2]
        given = [u for u in urls if isinstance(u, str)]
        given += [v for v in (*config.values(), *client_options.values()) if isinstance(v, str) and ":" in v]
        for u in given:
            out += _url_secrets(u)
        return cls(out)

    def scrub(self, text: str) -> str:
        return redact_text(self._mask.mask(text.split(_DEBUG_DUMP, 1)[0].strip()))[:_MAX_SHOWN]
