"""The tier's ``url``: which kind of store it names, and how it may be shown."""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from asynctier.errors import TierConfigError

from .redact import redact_url

__all__ = ["ENV_PREFIX", "StoreURL", "parse_url"]

#: Cloud schemes, and the prefix of the environment variables obstore reads for each.
ENV_PREFIX = {
    "s3": "AWS_",
    "s3a": "AWS_",
    "gs": "GOOGLE_",
    "az": "AZURE_",
    "adl": "AZURE_",
    "azure": "AZURE_",
    "abfs": "AZURE_",
    "abfss": "AZURE_",
}


def _shown(value: object) -> str:
    return repr(redact_url(value) if isinstance(value, str) else value)[:80]


@dataclass(frozen=True)
class StoreURL:
    """A checked ``url``: ``raw`` goes to obstore only, ``shown`` everywhere else."""

    raw: str
    scheme: str
    shown: str

    @property
    def env_prefix(self) -> str | None:
        return ENV_PREFIX.get(self.scheme)

    @property
    def is_s3(self) -> bool:
        return self.scheme in ("s3", "s3a")


def parse_url(url: object, *, store_given: bool) -> StoreURL:
    """Check ``url``; with an obstore store object given (``store_given``) it is only a label."""
    if not isinstance(url, str) or "://" not in url:
        raise TierConfigError(f"url must be a store URL such as 's3://bucket/prefix'; got {_shown(url)}")
    if "\0" in url:
        raise TierConfigError(f"url must not contain NUL; got {_shown(url)}")
    scheme = urlsplit(url).scheme.lower()
    if not store_given and scheme not in (*ENV_PREFIX, "file", "memory"):
        raise TierConfigError(
            f"unsupported url scheme {scheme!r}; accepted: s3, gs, az (and Azure aliases), file, memory"
        )
    if scheme == "file" and not store_given:
        _check_file_url(url)
    elif scheme == "memory" and not store_given and url.lower() != "memory://":
        # (a bucket or prefix after it was ignored: each memory:// tier has its own store)
        raise TierConfigError(
            f"a memory:// url takes nothing after the scheme (each tier's store is its own); got {_shown(url)}"
        )
    elif scheme in ENV_PREFIX and not store_given:
        _check_cloud_url(url, scheme)
    return StoreURL(raw=url, scheme=scheme, shown=redact_url(url))


def _check_cloud_url(url: str, scheme: str) -> None:
    """``s3://bucket/prefix`` (gs, az alike): the client reads the bucket and the path and
    drops the rest without a word (the objects then went under another prefix, or nowhere the
    user meant), so what it would drop is refused here."""
    example = f"{scheme}://bucket/prefix"
    if any(c.isspace() or not c.isprintable() for c in url):
        raise TierConfigError(f"url must not contain whitespace or control characters; got {_shown(url)}")
    parts = urlsplit(url)
    # (the URL shown is redacted: user info and query left out, so the message names them)
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        what = "a fragment" if parts.fragment or url.endswith("#") else "a query"
        raise TierConfigError(
            f"a {scheme}:// url takes no query or fragment ({example}; options go in client_options); "
            f"got {_shown(url)} with {what}"
        )
    if not parts.netloc:
        raise TierConfigError(f"a {scheme}:// url needs a bucket or container ({example}); got {_shown(url)}")
    # abfs[s]://container@account.dfs.core.windows.net/path names its container as user info
    if scheme not in ("abfs", "abfss") and ("@" in parts.netloc or ":" in parts.netloc):
        what = "user info" if "@" in parts.netloc else "a port"
        raise TierConfigError(
            f"a {scheme}:// url names a bucket only, no user info or port ({example}; credentials and "
            f"endpoint go in their own keys); got {_shown(url)} with {what}"
        )
    if "//" in parts.path:
        raise TierConfigError(f"a {scheme}:// url's prefix has an empty segment ('//'); got {_shown(url)}")


def _check_file_url(url: str) -> None:
    """``file:///abs/dir``: an absolute directory (created by open() if missing), not the root.

    ``file://dir`` names a host, not a relative directory, and ``file://`` the root: both
    reached the client, which failed deep inside or wrote chunks under ``/``.
    """
    parts = urlsplit(url)
    example = "file:///path/to/dir"
    if parts.query or parts.fragment or "?" in url or "#" in url:  # ("dir?" parses as no query)
        raise TierConfigError(f"a file:// url takes no query or fragment ({example}); got {_shown(url)}")
    if parts.netloc or not parts.path.startswith("/"):
        raise TierConfigError(
            f"a file:// url needs an absolute directory after the two slashes ({example}); got {_shown(url)}"
        )
    if posixpath.normpath(unquote(parts.path)) in ("/", "//"):
        raise TierConfigError(f"a file:// url must not name the file system root; got {_shown(url)}")
