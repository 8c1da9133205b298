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
    return StoreURL(raw=url, scheme=scheme, shown=redact_url(url))


def _check_file_url(url: str) -> None:
    """``file:///abs/dir``: an absolute directory (created by open() if missing), not the root.

    ``file://dir`` names a host, not a relative directory, and ``file://`` the root: both
    reached the client, which failed deep inside or wrote chunks under ``/``.
    """
    parts = urlsplit(url)
    example = "file:///path/to/dir"
    if parts.query or parts.fragment:
        raise TierConfigError(f"a file:// url takes no query or fragment ({example}); got {_shown(url)}")
    if parts.netloc or not parts.path.startswith("/"):
        raise TierConfigError(
            f"a file:// url needs an absolute directory after the two slashes ({example}); got {_shown(url)}"
        )
    if posixpath.normpath(unquote(parts.path)) in ("/", "//"):
        raise TierConfigError(f"a file:// url must not name the file system root; got {_shown(url)}")
