"""Building the obstore store from the tier's options, the environment and its deadlines.

obstore 0.12 replaces the client options it read from the environment (``AWS_ALLOW_HTTP``,
``AWS_TIMEOUT``, ...) with any ``client_options`` passed in. The tier always passes some (its
deadlines), so it reads those variables itself first and lets explicit options override them.
"""

from __future__ import annotations

import datetime
import os
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from obstore.store import AzureStore, GCSStore, HTTPStore, LocalStore, MemoryStore, S3Store, from_url

from asynctier.errors import TierConfigError

from .client_errors import is_client_panic
from .params import Deadlines
from .redact import CONTAINER_SCHEMES as _CONTAINER_SCHEMES
from .redact import is_secret_name, redact_url
from .store_keys import CLIENT_KEYS, check_client_options, check_store_options, check_str, store_kind
from .url import StoreURL

#: Store config keys that tell two stores of one bucket name apart (another server, account)
_PLACE_HINTS = ("endpoint", "account", "bucket", "container", "url", "host")


def _canonical(key: str) -> str:
    """A store config key as one spelling: ``AWS_ENDPOINT``, ``aws_endpoint`` and ``endpoint``
    alike (the environment's prefixes and case dropped)."""
    k = key.lower()
    for prefix in ("aws_", "google_", "azure_storage_", "azure_"):
        if k.startswith(prefix):
            return k[len(prefix) :]
    return k


if TYPE_CHECKING:
    from obstore.store import ClientConfig, ObjectStore, RetryConfig

__all__ = ["CLIENT_ENV_KEYS", "StoreOptions"]

#: obstore ClientConfig keys that may also come from ``<PREFIX><KEY>`` environment variables
#: (all of them but those obstore takes only as values: headers, certificates, read timeout).
CLIENT_ENV_KEYS = tuple(k for k in CLIENT_KEYS if k not in ("default_headers", "root_certificate", "read_timeout"))


_STORE_TYPES = (S3Store, GCSStore, AzureStore, HTTPStore, LocalStore, MemoryStore)


def _refuse_unused(url: StoreURL, given: bool, options: Mapping[str, object]) -> None:
    """Options a local store (or a store object handed in) cannot use are mistakes."""
    for name, value in options.items():
        if value is not None and value != {}:
            where = "a store= object" if given else f"a {url.scheme}:// store"
            raise TierConfigError(
                f"{name} does not apply to {where}, which takes no endpoint, region, credentials, config or "
                "client_options"
            )


@dataclass(frozen=True)
class StoreOptions:
    """Everything that goes into building the store; :meth:`build` does it (no I/O)."""

    url: StoreURL
    deadlines: Deadlines
    endpoint: str | None = None
    region: str | None = None
    credentials: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)
    client_options: Mapping[str, Any] = field(default_factory=dict)
    given: ObjectStore | None = None

    @classmethod
    def checked(
        cls,
        url: StoreURL,
        deadlines: Deadlines,
        *,
        endpoint: object,
        region: object,
        credentials: object,
        config: object,
        client_options: object,
        given: object,
    ) -> StoreOptions:
        """The options, checked against what obstore documents (keys and value types) and
        what the store can use; refused here rather than when the store is built."""
        store: ObjectStore | None = None
        if given is not None:
            if not isinstance(given, _STORE_TYPES):
                names = ", ".join(t.__name__ for t in _STORE_TYPES)
                raise TierConfigError(f"store must be an obstore store ({names}) or None; got {type(given).__name__}")
            store = given
        # typed first: an empty dict or list compared equal to "not given" for a local store
        named = {n: None if v is None else check_str(n, v) for n, v in (("endpoint", endpoint), ("region", region))}
        if named["region"] == "":
            raise TierConfigError("region must be a non-empty str, or None (from the URL and the environment)")
        if named["endpoint"] is not None:
            parts = urllib.parse.urlsplit(named["endpoint"])
            if parts.scheme not in ("http", "https") or not parts.netloc:  # (obstore panics on anything else)
                # (the value is not shown: it may carry a password)
                raise TierConfigError(
                    "endpoint must be an absolute http:// or https:// URL such as 'http://127.0.0.1:9000', "
                    "or None (from the environment)"
                )
            if parts.query or parts.fragment or "?" in named["endpoint"] or "#" in named["endpoint"]:
                # (every request went to a wrong URL and failed as unavailable: the breaker opened)
                raise TierConfigError(
                    "endpoint takes no query string or fragment: the client adds the bucket and the object "
                    "to it (such as 'http://127.0.0.1:9000')"
                )
        dicts: dict[str, Mapping[object, object]] = {}
        for name, value in (("credentials", credentials), ("config", config), ("client_options", client_options)):
            if value is not None and not isinstance(value, Mapping):
                raise TierConfigError(f"{name} must be a dict; got {type(value).__name__}")
            dicts[name] = value or {}
        if store is not None or url.env_prefix is None:
            _refuse_unused(url, store is not None, {**named, **dicts})
            return cls(url, deadlines, given=store)
        endpoint, region = named["endpoint"], named["region"]
        kind = store_kind(url.scheme)
        return cls(
            url,
            deadlines,
            endpoint,
            region,
            check_store_options(kind, dicts["credentials"], "credentials"),
            check_store_options(kind, dicts["config"], "config"),
            check_client_options(dicts["client_options"]),
        )

    def client_config(self) -> dict[str, Any]:
        """Client options: environment (obstore drops it once any are passed), then the tier's
        deadlines (``timeout_s``, ``connect_timeout_s``: what its exit guard and errors assume),
        then ``client_options``."""
        opts: dict[str, Any] = {}
        prefix = self.url.env_prefix or ""
        for key in CLIENT_ENV_KEYS:
            value = os.environ.get(prefix + key.upper())
            if value is not None:
                opts[key] = value
        d = self.deadlines
        opts["timeout"] = datetime.timedelta(seconds=d.timeout_s)
        opts["connect_timeout"] = datetime.timedelta(seconds=d.connect_timeout_s)
        opts.update(self.client_options)
        return opts

    def retry_config(self) -> RetryConfig:
        d = self.deadlines
        return {
            "max_retries": d.max_retries,
            "retry_timeout": datetime.timedelta(seconds=d.retry_timeout_s),
            "backoff": {
                "init_backoff": datetime.timedelta(seconds=d.retry_backoff_s),
                "max_backoff": datetime.timedelta(seconds=d.retry_max_backoff_s),
                "base": 2,
            },
        }

    def store_config(self) -> dict[str, Any]:
        """Store config keys: ``endpoint`` and ``region``, then ``config``, then ``credentials``."""
        cfg: dict[str, Any] = {}
        if self.endpoint is not None:
            cfg["endpoint"] = self.endpoint
        if self.region is not None:
            cfg["region"] = self.region
        cfg.update(self.config)
        cfg.update(self.credentials)
        return cfg

    def place(self) -> tuple[str, ...]:
        """Where the objects live, as another tier given the same place names it (a chain
        refuses two tiers on one): a local directory resolved (I/O: asked by a chain only), or
        the bucket or container and prefix with the endpoint, account and bucket settings that
        tell two stores apart; none for a store of its own (``memory://``, a store given)."""
        url = self.url
        if self.given is not None or url.scheme == "memory":
            return ()
        parts = urllib.parse.urlsplit(url.raw)
        if url.scheme == "file":
            return (os.path.realpath(urllib.parse.unquote(parts.path)),)
        scheme = "s3" if url.scheme == "s3a" else url.scheme
        # the user info of an Azure URL is its container (container@account); others have none to keep
        host = parts.netloc if scheme in _CONTAINER_SCHEMES else parts.netloc.rsplit("@", 1)[-1]
        named = {_canonical(k): v for k, v in self.config.items() if isinstance(v, str) and not is_secret_name(k)}
        endpoint = self.endpoint or next((v for k, v in named.items() if "endpoint" in k), None)
        settings = [f"endpoint {redact_url(endpoint.rstrip('/'))}" if endpoint else "default endpoint"]
        settings += sorted(
            f"{k}={redact_url(v) if '://' in v else v}"
            for k, v in named.items()
            if "endpoint" not in k and any(h in k for h in _PLACE_HINTS)
        )
        return (f"{scheme}://{host}{urllib.parse.unquote(parts.path).rstrip('/')} ({', '.join(settings)})",)

    def build(self, scrub: Callable[[str], str]) -> ObjectStore:
        """The obstore store (no I/O); any failure of the client, a panic included, is a
        :class:`TierConfigError` whose text went through ``scrub``."""
        try:
            return self._build()
        except BaseException as e:
            if not (isinstance(e, Exception) or is_client_panic(e)):
                raise
            raise TierConfigError(f"obj tier {self.url.shown}: cannot build the store: {scrub(str(e))}") from None

    def _build(self) -> ObjectStore:
        if self.given is not None:
            return self.given
        if self.url.scheme == "memory":
            return MemoryStore()
        if self.url.scheme == "file":
            local: ObjectStore = LocalStore.from_url(self.url.raw, mkdir=True)
            return local
        cfg = self.store_config()
        client: ClientConfig = self.client_config()  # type: ignore[assignment]
        store: ObjectStore = from_url(
            self.url.raw,
            config=cfg or None,  # type: ignore[arg-type]
            client_options=client,
            retry_config=self.retry_config(),
        )
        return store
