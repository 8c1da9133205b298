"""``obj``: chunks in an object store — S3 and S3-compatible, GCS, Azure, a local directory, memory.

``{"type": "obj", "url": "s3://bucket/prefix", ...}``; also ``gs://bucket/prefix``,
``az://container/prefix`` (and the other Azure spellings obstore accepts), ``file:///dir`` and
``memory://``. Built on `obstore <https://developmentseed.org/obstore/>`_, imported here only
(``import asynctier`` never imports it).

Configuration
    The standard environment works as it does for obstore: ``AWS_ENDPOINT``,
    ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``,
    ``AWS_ALLOW_HTTP``, ... and the ``GOOGLE_*`` / ``AZURE_*`` equivalents. Explicit options
    override it: ``endpoint``, ``region``, ``credentials`` (a dict of the store's credential
    keys, e.g. ``{"access_key_id": ..., "secret_access_key": ...}``), ``config`` (any other
    obstore store key), ``client_options`` (obstore ``ClientConfig``). obstore 0.12 replaces
    the client options it read from the environment (``AWS_ALLOW_HTTP``, ``AWS_TIMEOUT``, ...)
    with any ``client_options`` passed in; this tier always passes some (the deadline), so it
    first reads those variables itself and lets explicit options override them. Credentials
    never appear in reprs, logs or error messages (errors are rebuilt from a scrubbed text).

Object format
    One object per chunk at ``<url prefix>/<layout id>/<key token>``; the layout id is the
    :attr:`~asynctier.OffloadingSpec.layout_id` (namespace, chunk size, format version), the
    key token :func:`~asynctier.integrity.key_token`. The object body is a
    :class:`~asynctier.integrity.ChunkHeader` (format version, key, payload length, xxh3
    checksum, layout digest; itself checksummed) followed by the payload. A header in the body
    rather than in object metadata works the same on every store (obstore's local store has
    no metadata) and arrives in the same response as the payload. A load checks the object
    size, the header, the layout digest and (``verify=True``) the payload checksum; a bad
    object fails its key with :class:`~asynctier.IntegrityError` and is deleted.

Copies
    Uploads hand obstore ``[header, slice of the primary buffer]``: obstore turns each buffer
    into a zero-copy ``Bytes`` and sends them as one body, so no Python copy of the chunk is
    made (a ``memory://`` store concatenates them, which is its one copy as the medium).
    Chunks larger than ``part_size`` go up as a multipart upload of ``part_size`` parts,
    ``part_concurrency`` at a time (obstore slices the same buffers). Downloads land in one
    Rust-owned buffer per request; that buffer is copied once into the primary slice. Chunks
    larger than ``part_size`` are fetched as parallel range requests (``part_size`` each).

Concurrency, deadlines, retries, circuit breaker
    Chunk I/O runs on ``max_inflight`` worker threads through obstore's *synchronous* API
    (one chunk's parts may add ``part_concurrency`` HTTP requests). ``timeout_s`` (default
    30 s) is the deadline of each HTTP request (obstore client ``timeout``;
    ``connect_timeout_s`` for the connect phase). Retryable errors (5xx, dropped connections,
    timeouts of reads) are retried by obstore with exponential backoff and jitter: at most
    ``max_retries`` times and not after ``retry_timeout_s`` (default: ``timeout_s``) since the
    first attempt. After ``breaker_threshold`` consecutive connection failures (refused,
    reset, timed out, 5xx after retries) the circuit breaker opens: chunk I/O fails at once
    with :class:`~asynctier.TierUnavailableError` for ``breaker_cooldown_s``; then one request
    is let through as a probe, and its success closes the breaker.

Lookup
    ``lookup`` answers from a bounded cache (``lookup_cache_entries``) of positive answers
    (``lookup_ttl_s``) and negative ones (``lookup_negative_ttl_s``, shorter: another server
    may store the key meanwhile); the misses of a call go out as HEAD requests in parallel,
    under the same in-flight bound. The tier's own stores, removals and failed loads update
    the cache at once.

Capacity
    By default the tier does not limit what the bucket holds: expire old chunks with the
    bucket's lifecycle rules (for example delete objects under the prefix N days after
    creation, and abort incomplete multipart uploads after a day). With ``capacity_bytes``
    the tier evicts least recently used chunks by DELETE; it knows the chunks it found under
    its prefix at ``open()`` and those it stored or loaded since, so several servers sharing a
    prefix each enforce the bound on their own view (approximate, not a global bound). A
    chunk loaded that this view lacked joins it; the next store evicts to make up for it. A
    store of a key the view holds asks the store first (HEAD): another server, or a
    lifecycle rule, may have deleted it. A victim whose DELETE fails stays in the view (it
    is still in the bucket) and the store that needed its room fails with a capacity error
    (``eviction_failures`` in stats), rather than the bucket outgrowing the bound unseen.

Sharing
    Two tiers on one bucket and prefix (two servers) see each other's chunks: every load,
    lookup miss and store goes to the store itself.

Exit safety
    obstore 0.12's *async* API resolves Python futures from its Rust runtime's threads
    (``loop.call_soon_threadsafe``); when the interpreter finalizes while such a thread is in
    that call, the thread is killed with ``pthread_exit`` through Rust frames and the process
    aborts (SIGABRT, exit status 134; a gdb backtrace here showed exactly that). This tier
    never uses the async API: chunk I/O calls the synchronous API from the tier's own Python
    worker threads, so no Rust thread calls into Python to complete a request. As a second
    line, an ``atexit`` hook refuses new object-store requests and waits (at most 10 s) for
    those in progress, so none is mid-flight while the interpreter tears down.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import datetime
import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar
from urllib.parse import urlsplit

import obstore
from obstore.exceptions import NotFoundError
from obstore.store import LocalStore, MemoryStore, from_url

from asynctier import BlockingChunkTier, ChunkError, ChunkNotFoundError, IntegrityError, TierConfigError, engines
from asynctier.errors import CapacityError, ChunkTimeoutError, TierUnavailableError
from asynctier.integrity import ChunkHeader, checksum, key_token
from asynctier.lru import LRUIndex
from asynctier.stats import TierStats

if TYPE_CHECKING:
    from obstore.store import ClientConfig, ObjectStore, RetryConfig

__all__ = ["ObjTier", "ObjectStoreIOError"]

log = logging.getLogger(__name__)

_MIB = 1 << 20
#: Longest the exit hook waits for object-store calls in progress.
_EXIT_WAIT_CAP_S = 10.0
#: obstore ClientConfig keys that may also come from ``<PREFIX><KEY>`` environment variables.
_CLIENT_KEYS = (
    "allow_http",
    "allow_invalid_certificates",
    "connect_timeout",
    "default_content_type",
    "http1_only",
    "http2_keep_alive_interval",
    "http2_keep_alive_timeout",
    "http2_keep_alive_while_idle",
    "http2_only",
    "pool_idle_timeout",
    "pool_max_idle_per_host",
    "proxy_url",
    "proxy_ca_certificate",
    "proxy_excludes",
    "randomize_addresses",
    "timeout",
    "user_agent",
)
_ENV_PREFIX = {
    "s3": "AWS_",
    "s3a": "AWS_",
    "gs": "GOOGLE_",
    "az": "AZURE_",
    "adl": "AZURE_",
    "azure": "AZURE_",
    "abfs": "AZURE_",
    "abfss": "AZURE_",
}
#: Store config keys whose values are secrets (scrubbed from every message).
_SECRET_HINTS = ("secret", "token", "key", "password", "sas", "credential")


class ObjectStoreIOError(ChunkError, ConnectionError):
    """An object-store request failed (connection lost, server error); counted as ``io``."""

    kind = "io"


# -- exit safety -----------------------------------------------------------------------------
class _ExitGuard:
    """Counts obstore calls in progress; at interpreter exit, refuses new ones and waits.

    The tier's workers are daemon threads: without this hook one could still be inside
    obstore (holding views of the primary buffer, with Rust frames on its stack) while the
    interpreter tears down. A thread that re-enters a finalizing interpreter is ended with
    ``pthread_exit``, which must not unwind through Rust frames.
    """

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._calls = 0
        self._exiting = False
        self._last_abnormal = 0.0
        self.max_wait_s = 0.0

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        with self._cv:
            if self._exiting:
                raise TierUnavailableError("the interpreter is exiting; no new object-store requests")
            self._calls += 1
        ok = False
        try:
            yield
            ok = True
        finally:
            with self._cv:
                self._calls -= 1
                if not ok:
                    self._last_abnormal = time.monotonic()
                if self._calls == 0:
                    self._cv.notify_all()

    def quiesce(self) -> None:
        """Stop new calls; wait (bounded by the longest request deadline) for those running."""
        with self._cv:
            self._exiting = True
            deadline = time.monotonic() + self.max_wait_s
            while self._calls:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning("obj tier: %d object-store calls still running at exit", self._calls)
                    break
                self._cv.wait(left)
            recent = time.monotonic() - self._last_abnormal < 1.0
        if recent:
            # A request abandoned on error may leave its body (a view of our buffer) in the
            # HTTP client's connection task for a moment; let it be released before teardown.
            time.sleep(0.1)


_EXIT = _ExitGuard()
atexit.register(_EXIT.quiesce)


# -- circuit breaker -------------------------------------------------------------------------
class _Breaker:
    """Closed -> open after ``threshold`` consecutive connection failures -> half-open probe."""

    def __init__(self, threshold: int, cooldown_s: float) -> None:
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self._lock = threading.Lock()
        self._failures = 0
        self._open_until: float | None = None  # None: closed
        self._probing = False
        self.opened = 0
        self.fast_failed = 0

    @property
    def state(self) -> str:
        """``closed``, ``open`` or ``half-open``."""
        with self._lock:
            if self._open_until is None:
                return "closed"
            return "half-open" if self._probing or time.monotonic() >= self._open_until else "open"

    def before(self) -> bool:
        """Admit a request or raise :class:`TierUnavailableError`; True if it is the probe."""
        with self._lock:
            if self._open_until is None:
                return False
            if self._probing or time.monotonic() < self._open_until:
                self.fast_failed += 1
                raise TierUnavailableError(
                    f"object store unreachable: circuit breaker open after {self._failures} "
                    f"consecutive connection failures (retrying in at most {self.cooldown_s}s)"
                )
            self._probing = True
            return True

    def success(self, probe: bool) -> None:
        with self._lock:
            self._failures = 0
            if probe or self._open_until is not None:
                self._open_until = None
            if probe:
                self._probing = False

    def failure(self, probe: bool) -> None:
        with self._lock:
            self._failures += 1
            if probe:
                self._probing = False
            if probe or (self._open_until is None and self._failures >= self.threshold):
                if self._open_until is None:
                    self.opened += 1
                self._open_until = time.monotonic() + self.cooldown_s

    def neutral(self, probe: bool) -> None:
        """The request ended without telling whether the store is reachable."""
        if probe:
            with self._lock:
                self._probing = False


# -- lookup cache ----------------------------------------------------------------------------
class _LookupCache:
    """Bounded key -> (present, expiry) map, oldest entries dropped first; thread-safe."""

    def __init__(self, entries: int, ttl_s: float, negative_ttl_s: float) -> None:
        self.entries = entries
        self.ttl_s = ttl_s
        self.negative_ttl_s = negative_ttl_s
        self._lock = threading.Lock()
        self._map: collections.OrderedDict[bytes, tuple[bool, float]] = collections.OrderedDict()

    def get(self, key: bytes, now: float) -> bool | None:
        with self._lock:
            hit = self._map.get(key)
            if hit is None:
                return None
            if hit[1] <= now:
                del self._map[key]
                return None
            return hit[0]

    def put(self, key: bytes, present: bool) -> None:
        ttl = self.ttl_s if present else self.negative_ttl_s
        if ttl <= 0 or self.entries <= 0:
            return
        with self._lock:
            self._map[key] = (present, time.monotonic() + ttl)
            self._map.move_to_end(key)
            while len(self._map) > self.entries:
                self._map.popitem(last=False)

    def forget(self, key: bytes) -> None:
        with self._lock:
            self._map.pop(key, None)

    def __len__(self) -> int:
        return len(self._map)


# -- helpers ---------------------------------------------------------------------------------
def _redact_url(url: str) -> str:
    """The URL without user info or query (an Azure SAS token can hide in either)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


# (not "retry_timeout", which every retry error's debug dump contains)
_TIMEOUT_RE = re.compile(r"\bTimedOut\b|timed out|deadline has elapsed|kind: Timeout\b")
_CONNECT_RE = re.compile(r"kind: Connect\b|ConnectionRefused|tcp connect error|dns error", re.IGNORECASE)
_DROPPED_RE = re.compile(
    r"error sending request|connection (closed|reset|aborted)|ConnectionReset|BrokenPipe|IncompleteMessage|"
    r"unexpected EOF|error decoding response body|end of file before message length|body error",
    re.IGNORECASE,
)
_STATUS_RE = re.compile(r"status code: (\d{3})|status: (\d{3})")


_MAX_SECONDS = 86400.0  # durations beyond a day are mistakes (inf, ms taken for s), and the client refuses some


def _positive_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= _MAX_SECONDS:  # NaN too
        raise TierConfigError(f"{name} must be a number of seconds > 0 and <= {_MAX_SECONDS:g}; got {value!r}")
    return float(value)


def _non_negative_number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= _MAX_SECONDS:  # NaN too
        raise TierConfigError(f"{name} must be a number of seconds >= 0 and <= {_MAX_SECONDS:g}; got {value!r}")
    return float(value)


def _positive_integer(name: str, value: object, minimum: int = 1, maximum: int | None = None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < minimum
        or (maximum is not None and value > maximum)
    ):
        bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise TierConfigError(f"{name} must be an int {bound}; got {value!r}")
    return value


class ObjTier(BlockingChunkTier):
    """Chunks as objects in an object store, through obstore (see the module docstring).

    Args:
        url: ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix``,
            ``file:///dir`` or ``memory://``.
        endpoint: store endpoint (S3-compatible servers, Azurite, ...).
        region: S3 region.
        credentials: store credential keys (``access_key_id``, ``secret_access_key``,
            ``session_token``; ``service_account_key``; ``account_key``, ...); never shown.
        config: further obstore store config keys (override the URL and the environment).
        client_options: obstore ``ClientConfig`` (override the environment and the defaults
            this tier sets: ``timeout``, ``connect_timeout``).
        store: an obstore store object to use instead of building one from ``url`` (for
            example one ``MemoryStore`` shared by two tiers); ``url`` is then a label.
        part_size: chunks larger than this go in parallel parts/ranges (default 8 MiB;
            S3 needs parts of at least 5 MiB).
        part_concurrency: parts of one chunk in flight at once (default 8).
        max_retries, retry_timeout_s, retry_backoff_s, retry_max_backoff_s: obstore retry
            configuration (defaults 3, ``timeout_s``, 0.05, 2.0).
        connect_timeout_s: deadline of the connect phase (default ``min(5, timeout_s)``).
        breaker_threshold, breaker_cooldown_s: circuit breaker (defaults 5, 5.0).
        lookup_ttl_s, lookup_negative_ttl_s, lookup_cache_entries: lookup cache (defaults
            10.0, 1.0, 100_000; a TTL of 0 turns that side off).
        **kwargs: the common knobs of :class:`~asynctier.ChunkTier` (``max_inflight``,
            ``capacity_bytes``, ``timeout_s``, ``verify``, ...).
    """

    default_type = "obj"
    supported_durability: ClassVar[tuple[str, ...]] = ("none",)
    # The store is the authority (other servers write to it); an index is kept only for
    # capacity, as self._lru.
    uses_index = False
    handles_capacity = True  # its own LRU, by DELETE (below)

    def __init__(
        self,
        *,
        url: str,
        endpoint: str | None = None,
        region: str | None = None,
        credentials: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
        client_options: Mapping[str, Any] | None = None,
        store: ObjectStore | None = None,
        part_size: int = 8 * _MIB,
        part_concurrency: int = 8,
        max_retries: int = 3,
        retry_timeout_s: float | None = None,
        retry_backoff_s: float = 0.05,
        retry_max_backoff_s: float = 2.0,
        connect_timeout_s: float | None = None,
        breaker_threshold: int = 5,
        breaker_cooldown_s: float = 5.0,
        lookup_ttl_s: float = 10.0,
        lookup_negative_ttl_s: float = 1.0,
        lookup_cache_entries: int = 100_000,
        timeout_s: float | None = 30.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(timeout_s=timeout_s, **kwargs)
        if not isinstance(url, str) or "://" not in url:
            raise TierConfigError(f"url must be a store URL such as 's3://bucket/prefix'; got {url!r:.80}")
        self.url = _redact_url(url)
        self._raw_url = url
        self._scheme = urlsplit(url).scheme.lower()
        if store is None and self._scheme not in (*_ENV_PREFIX, "file", "memory"):
            raise TierConfigError(
                f"unsupported url scheme {self._scheme!r}; accepted: s3, gs, az (and Azure aliases), file, memory"
            )
        for name, value in (("credentials", credentials), ("config", config), ("client_options", client_options)):
            if value is not None and not isinstance(value, Mapping):
                raise TierConfigError(f"{name} must be a dict; got {type(value).__name__}")
        self._endpoint = endpoint
        self._region = region
        self._credentials = dict(credentials or {})
        self._config = dict(config or {})
        self._client_options = dict(client_options or {})
        self._given_store = store
        self.part_size = _positive_integer("part_size", part_size)
        if self._scheme in ("s3", "s3a") and self.part_size < 5 * _MIB:
            raise TierConfigError(
                f"part_size must be at least 5 MiB on S3 (its smallest multipart part); got {part_size}"
            )
        self.part_concurrency = _positive_integer("part_concurrency", part_concurrency)
        self.max_retries = _positive_integer("max_retries", max_retries, minimum=0, maximum=1000)
        default_rt = self.timeout_s if self.timeout_s else 30.0
        self.retry_timeout_s = _non_negative_number(
            "retry_timeout_s", default_rt if retry_timeout_s is None else retry_timeout_s
        )
        self.retry_backoff_s = _positive_number("retry_backoff_s", retry_backoff_s)
        self.retry_max_backoff_s = _positive_number("retry_max_backoff_s", retry_max_backoff_s)
        self.connect_timeout_s = _positive_number(
            "connect_timeout_s",
            connect_timeout_s if connect_timeout_s is not None else min(5.0, self.timeout_s or 5.0),
        )
        self._breaker = _Breaker(
            _positive_integer("breaker_threshold", breaker_threshold),
            _non_negative_number("breaker_cooldown_s", breaker_cooldown_s),
        )
        self._cache = _LookupCache(
            _positive_integer("lookup_cache_entries", lookup_cache_entries, minimum=0),
            _non_negative_number("lookup_ttl_s", lookup_ttl_s),
            _non_negative_number("lookup_negative_ttl_s", lookup_negative_ttl_s),
        )
        self._lru: LRUIndex | None = (
            LRUIndex(self.capacity_bytes, track_removals=True) if self.capacity_bytes is not None else None
        )
        self._secrets = self._collect_secrets()
        self._store: ObjectStore | None = None
        self._prefix = self.offloading_spec.layout_id + "/"
        # Longest time a single chunk I/O can take, for the exit hook's bound.
        # (capped: a stalled store must not hold up the exit for minutes)
        worst = (self.timeout_s or 30.0) + self.retry_timeout_s + self.retry_max_backoff_s + 1.0
        _EXIT.max_wait_s = min(_EXIT_WAIT_CAP_S, max(_EXIT.max_wait_s, worst))

    # -- representation (never credentials) -----------------------------------------------
    def __repr__(self) -> str:
        return f"<ObjTier type={self.tier_type!r} url={self.url!r} namespace={self.offloading_spec.namespace!r}>"

    def _collect_secrets(self) -> list[str]:
        out = [v for v in self._credentials.values() if isinstance(v, str) and v]
        for k, v in self._config.items():
            if isinstance(v, str) and v and any(h in k.lower() for h in _SECRET_HINTS):
                out.append(v)
        prefix = _ENV_PREFIX.get(self._scheme)
        if prefix:
            for k, v in os.environ.items():
                if k.startswith(prefix) and v and any(h in k.lower() for h in _SECRET_HINTS):
                    out.append(v)
        parts = urlsplit(self._raw_url)
        for piece in (parts.password, parts.username, parts.query):
            if piece:
                out.append(piece)
        return sorted(set(out), key=len, reverse=True)

    def _scrub(self, text: str) -> str:
        for s in self._secrets:
            text = text.replace(s, "***")
        # obstore appends a multi-line "Debug source:" dump; the first lines say it all
        text = text.split("\n\nDebug source:", 1)[0].strip()
        return text[:600]

    # -- store construction ----------------------------------------------------------------
    def _client_config(self) -> dict[str, Any]:
        """Client options: environment (obstore drops it once any are passed), defaults, explicit."""
        opts: dict[str, Any] = {}
        prefix = _ENV_PREFIX.get(self._scheme, "")
        for key in _CLIENT_KEYS:
            value = os.environ.get(prefix + key.upper())
            if value is not None:
                opts[key] = value
        if self.timeout_s:
            opts.setdefault("timeout", datetime.timedelta(seconds=self.timeout_s))
        opts.setdefault("connect_timeout", datetime.timedelta(seconds=self.connect_timeout_s))
        opts.update(self._client_options)
        return opts

    def _retry_config(self) -> RetryConfig:
        return {
            "max_retries": self.max_retries,
            "retry_timeout": datetime.timedelta(seconds=self.retry_timeout_s),
            "backoff": {
                "init_backoff": datetime.timedelta(seconds=self.retry_backoff_s),
                "max_backoff": datetime.timedelta(seconds=self.retry_max_backoff_s),
                "base": 2,
            },
        }

    def _build_store(self) -> ObjectStore:
        if self._given_store is not None:
            return self._given_store
        if self._scheme == "memory":
            return MemoryStore()
        if self._scheme == "file":
            local: ObjectStore = LocalStore.from_url(self._raw_url, mkdir=True)
            return local
        cfg: dict[str, Any] = {}
        if self._endpoint is not None:
            cfg["endpoint"] = self._endpoint
        if self._region is not None:
            cfg["region"] = self._region
        cfg.update(self._config)
        cfg.update(self._credentials)
        client: ClientConfig = self._client_config()  # type: ignore[assignment]
        store: ObjectStore = from_url(
            self._raw_url,
            config=cfg or None,  # type: ignore[arg-type]
            client_options=client,
            retry_config=self._retry_config(),
        )
        return store

    def open_medium(self) -> None:
        try:
            self._store = self._build_store()
        except Exception as e:
            raise TierConfigError(f"obj tier {self.url}: cannot build the store: {self._scrub(str(e))}") from None
        if self._lru is not None:
            try:
                self._recover_index()
            except ChunkError as e:
                # a cache must come up even while its store is down; capacity then counts
                # only what this instance stores from now on
                log.warning("obj tier %s: could not list existing chunks for capacity accounting: %s", self.url, e)

    def _recover_index(self) -> None:
        """Account the chunks already under the prefix (oldest first) for capacity."""
        assert self._lru is not None
        found: list[tuple[float, bytes, int]] = []
        for name, meta in self._list_objects():
            key = self._key_from_name(name, meta["size"])
            if key is not None:
                found.append((meta["last_modified"].timestamp(), key, meta["size"]))
        found.sort()
        for _, key, size in found:
            self._lru.add(key, size)
        failed = self._evict_all(self._lru.evict_over_capacity())
        if failed:
            log.warning("obj tier %s: %d chunk(s) over capacity could not be deleted (%r); still counted",
                        self.url, len(failed), failed[0])  # fmt: skip

    def close_medium(self) -> None:
        self._store = None

    # -- error mapping ---------------------------------------------------------------------
    @contextlib.contextmanager
    def _guarded(self, key: bytes) -> Iterator[None]:
        """Run one object-store operation: breaker, exit guard, error mapping."""
        probe = self._breaker.before()
        try:
            with _EXIT.call():
                yield
        except (ChunkNotFoundError, NotFoundError, FileNotFoundError):
            self._breaker.success(probe)
            raise ChunkNotFoundError(f"no chunk stored under key {key.hex()[:32]}", key) from None
        except IntegrityError:
            self._breaker.success(probe)  # the store answered; the object is bad
            raise
        except ChunkError:
            self._breaker.neutral(probe)
            raise
        except Exception as e:
            mapped, reachable = self._map_error(e, key)
            if reachable:
                self._breaker.success(probe)
            else:
                self._breaker.failure(probe)
            raise mapped from None
        except BaseException:
            # not an answer either way (a pyo3 PanicException, an interrupt): the probe's turn
            # must still end, or the breaker waits for it for good and refuses everything
            self._breaker.neutral(probe)
            raise
        else:
            self._breaker.success(probe)

    def _map_error(self, exc: Exception, key: bytes) -> tuple[ChunkError, bool]:
        """Our exception for an obstore one, and whether the store answered at all."""
        text = self._scrub(str(exc))
        name = type(exc).__name__
        msg = f"{name}: {text}"
        status = _STATUS_RE.search(text)
        code = int(status.group(1) or status.group(2)) if status else None
        if code is not None and code < 500 and code != 408:
            return ObjectStoreIOError(msg, key), True  # the store answered (permission, precondition)
        if _CONNECT_RE.search(str(exc)):
            return TierUnavailableError(f"object store unreachable: {msg}", key), False
        if code is not None:
            return TierUnavailableError(f"object store answered {code}: {msg}", key), False
        if _TIMEOUT_RE.search(str(exc)):
            return ChunkTimeoutError(f"object-store request exceeded timeout_s={self.timeout_s}: {msg}", key), False
        if _DROPPED_RE.search(str(exc)):
            return ObjectStoreIOError(msg, key), False
        return ObjectStoreIOError(msg, key), True

    # -- primitives ------------------------------------------------------------------------
    def _path(self, key: bytes) -> str:
        return self._prefix + key_token(key)

    def _st(self) -> ObjectStore:
        st = self._store
        if st is None:
            raise TierUnavailableError("the object store is not open")
        return st

    def write_chunk(self, key: bytes, data: memoryview) -> None:
        lru = self._lru
        if lru is not None:
            size = ChunkHeader.packed_size(len(key)) + data.nbytes
            # an old copy's DELETE must not land after this PUT: wait it out
            victims = self._after_removal(lru.reserve, key, size)
            if victims is None:
                # The account says stored; the store says so too, or it is stored again: another
                # server on the prefix, or a lifecycle rule, may have deleted it since.
                if self.chunk_exists(key):
                    self._stats.incr("skipped_known_stored")
                    return
                lru.discard(key)
                victims = self._after_removal(lru.reserve, key, size)
                if victims is None:  # stored here meanwhile
                    self._stats.incr("skipped_known_stored")
                    return
            failed = self._evict_all(victims)
            if failed:
                lru.abort(key)
                raise CapacityError(
                    f"no room within capacity_bytes: deleting {len(failed)} least recently used chunk(s) "
                    f"failed: {failed[0]}",
                    key,
                ) from failed[0]
        try:
            self._put(key, data)
        except BaseException:
            if lru is not None:
                lru.abort(key)
            raise
        if lru is not None:
            lru.commit(key)
        self._cache.put(key, True)

    def _put(self, key: bytes, data: memoryview) -> None:
        header = ChunkHeader(key, data.nbytes, checksum(data), self.offloading_spec.layout_digest).pack()
        total = len(header) + data.nbytes
        st = self._st()
        with self._guarded(key):
            if total <= self.part_size:
                # one request; obstore wraps both buffers zero-copy and sends them as one body
                obstore.put(st, self._path(key), [header, data], use_multipart=False)
            else:
                self._stats.incr("multipart_uploads")
                obstore.put(
                    st,
                    self._path(key),
                    [header, data],
                    use_multipart=True,
                    chunk_size=self.part_size,
                    max_concurrency=self.part_concurrency,
                )

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        lru = self._lru
        # Pinned before the GET, and taken into the account if absent (another server stored
        # it): a removal or a write of the key here meanwhile is seen. None: it is being
        # removed or written here now; read it, but leave the account to them.
        entry = lru.adopt_pinned_entry(key, ChunkHeader.packed_size(len(key)) + out.nbytes) if lru is not None else None
        ok = False
        try:
            self._get_into(key, out)
            ok = True
        except ChunkNotFoundError:
            self._cache.forget(key)
            if lru is not None and entry is not None:
                lru.discard(key, entry=entry)
            raise
        except IntegrityError:
            # the object is still there: it leaves the account when it is deleted (a load
            # deletes it; a verification without remove_bad keeps it)
            self._cache.forget(key)
            raise
        finally:
            if lru is not None and entry is not None:
                lru.unpin(key, touch=ok, entry=entry)
        self._cache.put(key, True)

    def _get_into(self, key: bytes, out: memoryview) -> None:
        """GET the object into ``out`` and verify it; a bad copy's IntegrityError names its
        ETag (``copy``), so that deleting it cannot take a copy stored since."""
        etag: list[str | None] = [None]
        try:
            self._get_verified(key, out, etag)
        except IntegrityError as e:
            if e.copy is None and etag[0] is not None:
                e.copy = ("etag", etag[0])
            raise

    def _get_verified(self, key: bytes, out: memoryview, etag: list[str | None]) -> None:
        hsize = ChunkHeader.packed_size(len(key))
        n = out.nbytes
        total = hsize + n
        st = self._st()
        path = self._path(key)
        with self._guarded(key):
            if total <= self.part_size:
                res = obstore.get(st, path)
                etag[0] = res.meta.get("e_tag")
                size = res.meta["size"]
                if size != total:
                    raise IntegrityError(f"object is {size} bytes, expected {total} (truncated or foreign)", key)
                body = memoryview(res.bytes())
                if body.nbytes != total:
                    raise IntegrityError(f"object body is {body.nbytes} bytes, expected {total}", key)
                header = ChunkHeader.unpack(body[:hsize], key=key)
                self._check_header(header, key, n)
                out[:] = body[hsize:]  # the one copy: Rust-owned response buffer -> primary slot
                del body, res
            else:
                self._stats.incr("ranged_downloads")
                # the first part alone first: its answer tells the object's size, and a range
                # past the end of a short object makes obstore 0.12 panic, not fail
                res = obstore.get(st, path, options={"range": (0, self.part_size)})
                etag[0] = res.meta.get("e_tag")
                size = res.meta["size"]
                if size != total:
                    raise IntegrityError(f"object is {size} bytes, expected {total} (truncated or foreign)", key)
                first = memoryview(res.bytes())
                if first.nbytes != self.part_size:
                    raise IntegrityError(f"first part is {first.nbytes} bytes, expected {self.part_size}", key)
                header = ChunkHeader.unpack(first[:hsize], key=key)
                self._check_header(header, key, n)
                out[: self.part_size - hsize] = first[hsize:]
                del first, res
                starts = list(range(self.part_size, total, self.part_size))
                lengths = [min(self.part_size, total - s) for s in starts]
                parts = obstore.get_ranges(st, path, starts=starts, lengths=lengths, coalesce=0)
                if sum(len(p) for p in parts) != total - self.part_size:
                    raise IntegrityError(f"object parts add up to {self.part_size + sum(len(p) for p in parts)} "
                                         f"bytes, expected {total}", key)  # fmt: skip
                pos = self.part_size - hsize
                for p in parts:
                    mv = memoryview(p)
                    out[pos : pos + mv.nbytes] = mv
                    pos += mv.nbytes
                del parts
        if self.verify and checksum(out) != header.checksum:
            raise IntegrityError("chunk payload checksum mismatch", key)

    def _check_header(self, header: ChunkHeader, key: bytes, n: int) -> None:
        header.verify(b"", layout_digest=self.offloading_spec.layout_digest, payload_len=n, check_data=False)

    def _delete_bad_copy(self, key: bytes, exc: BaseException) -> None:
        """Delete the object that failed verification, unless another was stored under its
        name since (this server or another): its ETag is compared first. A copy stored
        between that HEAD and the DELETE can still be taken (S3 has no conditional DELETE)."""
        copy = getattr(exc, "copy", None)
        if isinstance(copy, tuple) and copy[0] == "etag":
            self._stats.incr("head_requests")
            try:
                with self._guarded(key):
                    now = obstore.head(self._st(), self._path(key)).get("e_tag")
            except ChunkNotFoundError:
                return  # gone already
            if now != copy[1]:
                self._stats.incr("bad_copy_replaced")
                return  # a copy stored since: not ours to delete
        self.delete_chunk(key)

    def chunk_exists(self, key: bytes) -> bool:
        self._stats.incr("head_requests")
        try:
            with self._guarded(key):
                obstore.head(self._st(), self._path(key))
        except ChunkNotFoundError:
            self._cache.put(key, False)
            return False
        self._cache.put(key, True)
        return True

    def delete_chunk(self, key: bytes) -> bool:
        lru = self._lru
        if lru is not None and not self._after_removal(lru.begin_remove, key):
            return False  # a write of the key runs: it wins, as if this came first
        try:
            return self._delete_object(key)
        finally:
            if lru is not None:
                lru.removed([key])

    def _delete_object(self, key: bytes) -> bool:
        self._cache.forget(key)
        try:
            with self._guarded(key):
                obstore.delete(self._st(), self._path(key))
        except ChunkNotFoundError:
            return False
        self._cache.put(key, False)
        return True

    def _evict_all(self, victims: list[bytes]) -> list[Exception]:
        """Delete the objects of ``victims`` (handed out by the account, held as being removed
        till now). One whose DELETE fails is still in the bucket: it goes back into the
        account as least recently used (tried first next time), never silently dropped from
        it; the failures are returned."""
        lru = self._lru
        assert lru is not None
        failed: list[tuple[bytes, Exception]] = []
        try:
            for v in victims:
                try:
                    self._delete_object(v)
                except Exception as e:
                    failed.append((v, e))
                else:
                    self._evicted(v, None)
        finally:
            lru.removed(victims)
        if failed:
            self._stats.incr("eviction_failures", len(failed))
            back = [(0, v, ChunkHeader.packed_size(len(v)) + self.offloading_spec.chunk_bytes) for v, _ in failed]
            lru.merge_older(back, set())
        return [e for _, e in failed]

    def list_chunks(self) -> list[bytes]:
        out = []
        for name, meta in self._list_objects():
            key = self._key_from_name(name, meta["size"])
            if key is not None:
                out.append(key)
        return out

    def _list_objects(self) -> Iterator[tuple[str, Any]]:
        with self._guarded(b"list"):
            pages = list(obstore.list(self._st(), self._prefix, chunk_size=1000))
        for page in pages:
            for meta in page:
                name = meta["path"].rsplit("/", 1)[-1]
                yield name, meta

    def _key_from_name(self, name: str, size: int) -> bytes | None:
        """The key an object name stands for (reads the header of hashed names)."""
        import base64

        if not (name.startswith("h") and len(name) == 65):  # 65 is never a base32 length
            try:
                return base64.b32decode(name.upper() + "=" * (-len(name) % 8))
            except ValueError:
                return None
        probe = min(size, ChunkHeader.packed_size(1024))
        try:
            with self._guarded(b"list"):
                head = obstore.get_range(self._st(), self._prefix + name, start=0, length=probe)
            return ChunkHeader.unpack(memoryview(head)).key
        except Exception as e:
            log.warning("obj tier %s: skipping unreadable object %s: %s", self.url, name, self._scrub(str(e)))
            return None

    # -- lookup: cache, then HEADs in parallel ----------------------------------------------
    async def lookup(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key is stored: cached answers, then one HEAD per miss, in parallel."""
        ks = self._check_keys(keys)
        self._check_open()
        now = time.monotonic()
        answers: list[bool | None] = [self._cache.get(k, now) for k in ks]
        misses = [k for k, a in zip(ks, answers) if a is None]
        self._stats.incr("lookup_cache_hits", len(ks) - len(misses))
        if misses:
            self._stats.incr("lookup_cache_misses", len(misses))
            res = await self._run("lookup", engines.PRIO_LOOKUP, misses, [0] * len(misses))
            found = set(res.succeeded)
            it = iter(misses)
            answers = [a if a is not None else next(it) in found for a in answers]
        return [bool(a) for a in answers]

    async def touch(self, keys: Sequence[bytes]) -> None:
        ks = self._check_keys(keys)
        self._check_open()
        if self._lru is not None:
            self._lru.touch(ks)

    # -- stats -----------------------------------------------------------------------------
    def _stored_chunks(self) -> int | None:
        return len(self._lru) if self._lru is not None else None

    def _used_bytes(self) -> int | None:
        return self._lru.used_bytes if self._lru is not None else None

    def stats(self) -> TierStats:
        s = super().stats()
        s.extra["breaker_opened"] = self._breaker.opened
        s.extra["breaker_fast_failed"] = self._breaker.fast_failed
        s.extra["lookup_cache_entries"] = len(self._cache)
        return s

    @property
    def breaker_state(self) -> str:
        """The circuit breaker: ``closed``, ``open`` or ``half-open``."""
        return self._breaker.state
