"""The tier's ``url``: scheme, one or several seed servers, database, credentials (from the URL
or the environment), and the form shown in reprs and errors (no credentials)."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

from asynctier.errors import TierConfigError

__all__ = ["ENV_PASSWORD", "ENV_USERNAME", "SCHEMES", "Target", "check_ca_file", "parse_url", "unusable_ca_file"]

#: Accepted schemes, and whether each uses TLS.
SCHEMES = {"redis": False, "valkey": False, "rediss": True, "valkeys": True}
#: Environment variables read when the URL carries no credentials.
ENV_USERNAME = "VALKEY_USERNAME"
ENV_PASSWORD = "VALKEY_PASSWORD"
_DEFAULT_PORT = 6379
_ACCEPTED = "redis://, rediss://, valkey:// or valkeys:// [user[:password]@]host[:port][,host[:port]...][/db]"


@dataclass(frozen=True)
class Target:
    """Where the tier connects; :attr:`shown` is the only form that is ever printed."""

    tls: bool
    seeds: tuple[tuple[str, int], ...]
    db: int
    cluster: bool
    shown: str
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    @property
    def secrets(self) -> list[str]:
        """The values no text may show: the password, decoded and percent-encoded."""
        pw = self.password
        return [pw, quote(pw, safe="")] if pw else []


def _host_port(item: str, url_shown: str) -> tuple[str, int]:
    if item.startswith("["):  # [IPv6]:port
        host, sep, rest = item[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise TierConfigError(f"url {url_shown!r}: bad IPv6 address {item!r}")
        port_text = rest[1:]
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise TierConfigError(f"url {url_shown!r}: a server has no host ({item!r}); accepted: {_ACCEPTED}")
    if any(c.isspace() or not c.isprintable() for c in host):
        raise TierConfigError(f"url {url_shown!r}: a host has whitespace or a control character ({item!r})")
    if not port_text:
        return host, _DEFAULT_PORT
    if not _digits(port_text) or not 0 < int(port_text) < 65536:
        raise TierConfigError(f"url {url_shown!r}: port {port_text!r} is not a number from 1 to 65535")
    return host, int(port_text)


def _digits(text: str) -> bool:
    """ASCII digits only (str.isdigit() takes '²' and other scripts' digits)."""
    return text.isascii() and text.isdigit()


def parse_url(url: object, *, cluster: object, environ: Mapping[str, str] | None = None) -> Target:
    """Check ``url`` and ``cluster``; several seeds imply a cluster. Credentials come from the
    URL's user info, else from ``VALKEY_USERNAME`` / ``VALKEY_PASSWORD``."""
    if not isinstance(cluster, bool):
        raise TierConfigError(f"cluster must be True or False; got {cluster!r}")
    if not isinstance(url, str) or not url:
        raise TierConfigError(f"url must be a non-empty str ({_ACCEPTED}); got {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        shown_scheme = scheme if sep else url.split(":", 1)[0]
        raise TierConfigError(f"url scheme {shown_scheme!r} is not supported; accepted: {_ACCEPTED}")
    scheme = scheme.lower()
    # the user info runs to the last "@" (a password may hold "/", "?" or "#" unencoded)
    userinfo, at, after = rest.rpartition("@")
    if not at:
        after = rest
    if "?" in after or "#" in after:
        raise TierConfigError(
            "url: query strings and fragments are not accepted (pass options as tier parameters); "
            f"accepted: {_ACCEPTED}"
        )
    hosts, _, path = after.partition("/")
    shown = f"{scheme}://{hosts}" + (f"/{path}" if path else "")
    seeds = tuple(_host_port(h, shown) for h in hosts.split(","))
    db = 0
    if path:
        if not _digits(path):
            raise TierConfigError(f"url {shown!r}: the path must be a database number (/0); got /{path}")
        db = int(path)
    if len(seeds) > 1:
        cluster = True
    if cluster and db != 0:
        raise TierConfigError(f"url {shown!r}: a cluster has database 0 only; got /{db}")
    env = os.environ if environ is None else environ
    username: str | None = None
    password: str | None = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon else None
        if password == "":  # it was read as no password at all, and VALKEY_PASSWORD ignored
            raise TierConfigError(
                f"url {shown!r}: the password after ':' is empty; give it, or leave out ':' and the password "
                f"(it then comes from {ENV_PASSWORD})"
            )
    if password is None:
        password = env.get(ENV_PASSWORD) or None
        if username is None:
            username = env.get(ENV_USERNAME) or None
    return Target(SCHEMES[scheme], seeds, db, cluster, shown, username, password)


def check_ca_file(value: object, tls: bool) -> str | None:
    """``tls_ca_file`` checked (no I/O: :func:`unusable_ca_file` reads it at open)."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)) or not str(value) or "\0" in str(value):
        raise TierConfigError(f"tls_ca_file must be a non-empty path (str or PathLike); got {value!r}")
    if not tls:  # after the type check: a wrong type is named as such first
        raise TierConfigError("tls_ca_file is for TLS urls (rediss://, valkeys://) only")
    return os.fspath(value)


def unusable_ca_file(path: str) -> str:
    """Why ``path`` cannot serve as a CA bundle ("" if it can): not a readable file, or no
    certificate the TLS library can load in it."""
    if not (os.path.isfile(path) and os.access(path, os.R_OK)):
        return "is not a file this process can read"
    try:
        ssl.create_default_context(cafile=path)
    except (ssl.SSLError, ValueError) as e:
        return f"holds no certificate the TLS library can load ({e.__class__.__name__}: {e})"
    return ""
