"""The obj tier's wiring: the runtime's primitives (write, read, exists, delete, list) on an
object store, with the breaker, the exit guard, the lookup cache and the capacity account."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import obstore
from obstore.store import LocalStore

from asynctier import BlockingChunkTier, ChunkError, ChunkNotFoundError, IntegrityError
from asynctier.core.backend import fork_generation
from asynctier.core.base import MAX_INFLIGHT
from asynctier.core.validation import check_keys
from asynctier.errors import CapacityError, TierConfigError, TierStateError, TierUnavailableError
from asynctier.integrity import ChunkHeader
from asynctier.lru import LRUIndex, sorted_in_pieces
from asynctier.stats import TierStats

from .breaker import configured_breaker
from .exit_guard import EXIT
from .format import (
    check_part_size,
    frame_header,
    header_probe_size,
    is_hashed_name,
    key_from_plain_name,
    object_name,
    object_size,
)
from .guard import RequestGuard
from .lookup_cache import LookupCache
from .params import Deadlines, integer, seconds
from .redact import Scrubber
from .store import StoreOptions
from .transfer import get_into, put_object, verify_payload
from .url import parse_url

if TYPE_CHECKING:
    from obstore.store import ObjectStore

__all__ = ["ObjTier"]

#: The fork generation (asynctier.core.backend) in which an obj tier first opened, if any.
_requests_since: int | None = None

log = logging.getLogger(__name__)

_MIB = 1 << 20


class ObjTier(BlockingChunkTier):
    """Chunks as objects in an object store, through obstore (docs/tiers/obj.md).

    Args:
        url: ``s3://bucket/prefix``, ``gs://bucket/prefix``, ``az://container/prefix``,
            ``file:///dir`` (an absolute directory other than ``/``, created by ``open()``)
            or ``memory://``.
        endpoint: store endpoint (S3-compatible servers, Azurite, ...).
        region: S3 region.
        credentials: store credential keys (``access_key_id``, ``secret_access_key``,
            ``session_token``; ``service_account_key``; ``account_key``, ...); never shown.
        config: further obstore store config keys (override the URL and the environment).
            Keys and value types of these three dicts are checked against obstore's
            documented ones at construction.
        client_options: obstore ``ClientConfig`` (override the environment and the defaults
            this tier sets: ``timeout``, ``connect_timeout``).
        store: an obstore store object to use instead of building one from ``url`` (for
            example one ``MemoryStore`` shared by two tiers); ``url`` is then a label.
        part_size: chunks larger than this go in parallel parts/ranges (default 8 MiB; at
            least the header of the longest key, 1084 bytes, and on S3 at least 5 MiB).
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
    handles_capacity = True  # its own LRU, by DELETE
    frames_own_bytes = True  # the header travels in front of the payload in each object

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
        timeout_s: float = 30.0,
        **kwargs: Any,
    ) -> None:
        # every request has a deadline (None or 0 had meant obstore's own, and the exit guard's
        # bound another one)
        timeout = seconds("timeout_s", timeout_s, zero_ok=False)
        super().__init__(timeout_s=timeout, **kwargs)
        where = parse_url(url, store_given=store is not None)
        self.url = where.shown
        if where.scheme == "memory" and store is None:
            self.persistent = False  # a MemoryStore of its own: a new instance starts empty
        self.part_size = check_part_size(part_size, s3=where.is_s3)
        self.part_concurrency = integer("part_concurrency", part_concurrency, 1, MAX_INFLIGHT)
        self.deadlines = Deadlines.parse(
            timeout, connect_timeout_s, max_retries, retry_timeout_s, retry_backoff_s, retry_max_backoff_s
        )
        self._options = StoreOptions.checked(
            where, self.deadlines, endpoint=endpoint, region=region, credentials=credentials, config=config,
            client_options=client_options, given=store,
        )  # fmt: skip
        self._breaker = configured_breaker(breaker_threshold, breaker_cooldown_s)
        self._cache = LookupCache.configured(lookup_cache_entries, lookup_ttl_s, lookup_negative_ttl_s)
        self._lru: LRUIndex | None = (
            LRUIndex(self.capacity_bytes, track_removals=True) if self.capacity_bytes is not None else None
        )
        # entries a load added for a key it found nowhere in the account, not yet confirmed by
        # an answer from the store (a load's or a HEAD's): one with no answer takes out only these
        self._unconfirmed: dict[bytes, object] = {}
        self._unconfirmed_lock = threading.Lock()
        o = self._options
        self._scrubber = Scrubber.for_store(
            (where.raw, endpoint), o.credentials, o.config, o.client_options, where.env_prefix
        )
        self._requests = RequestGuard(self._breaker, self._scrubber, self.timeout_s)
        self._store: ObjectStore | None = None
        self._local_root: str | None = None
        self._prefix = self.offloading_spec.layout_id + "/"
        EXIT.allow_for(self.deadlines.worst_request_s)

    def _places(self) -> tuple[str, ...]:
        """Where the objects live (a chain refuses two tiers on one): :meth:`.store.StoreOptions.place`."""
        return self._options.place()

    # -- representation (never credentials) -----------------------------------------------
    def __repr__(self) -> str:
        return f"<ObjTier type={self.tier_type!r} url={self.url!r} namespace={self.offloading_spec.namespace!r}>"

    def _scrub(self, text: str) -> str:
        return self._scrubber.scrub(text)

    # -- open and close --------------------------------------------------------------------
    def open_medium(self) -> None:
        global _requests_since
        if _requests_since is not None and _requests_since != fork_generation():
            # (its runtime's threads stayed in the parent: the first request would hang for ever)
            raise TierStateError(
                f"obj tier {self.url}: this process was forked after an obj tier ran in its parent, and "
                "obstore's runtime (tokio) does not survive a fork. Start worker processes with the 'spawn' or "
                "'forkserver' method, or use obj tiers only in processes forked before any did"
            )
        _requests_since = fork_generation()
        self._store = self._options.build(self._scrub)
        # a local store's directory: a load first checks the object there is a regular file
        prefix = self._store.prefix if isinstance(self._store, LocalStore) else None
        self._local_root = os.fspath(prefix) if prefix is not None else None
        if self._lru is not None:
            try:
                self._recover_index()
            except ChunkError as e:
                if "NoSuchBucket" in str(e) or "the bucket does not exist" in str(e):
                    # the store answered: a wrong url, not an outage
                    raise TierConfigError(f"obj tier {self.url}: the bucket does not exist: {e}") from None
                # a cache must come up even while its store is down; capacity then counts
                # only what this instance stores from now on
                log.warning("obj tier %s: could not list existing chunks for capacity accounting: %s", self.url, e)

    def _recover_index(self) -> None:
        """Account the chunks already under the prefix (oldest first) for capacity."""
        assert self._lru is not None
        # sorted in pieces: this runs on a thread while the loop serves, and one sort of a
        # million objects would hold the GIL for most of a second
        listed = ((meta["last_modified"].timestamp(), key, meta["size"]) for key, meta in self._listed_keys())
        for _, key, size in sorted_in_pieces(listed):
            self._lru.add(key, size)
        failed = self._evict_all(self._lru.evict_over_capacity())
        if failed:
            log.warning("obj tier %s: %d chunk(s) over capacity could not be deleted (%r); still counted",
                        self.url, len(failed), failed[0])  # fmt: skip

    def close_medium(self) -> None:
        self._store = None

    # -- every request: breaker, exit guard, error mapping --------------------------------
    def _guarded(self, key: bytes) -> contextlib.AbstractContextManager[None]:
        """Run one object-store operation: breaker, exit guard, error mapping."""
        return self._requests.request(key)

    def _path(self, key: bytes) -> str:
        return self._prefix + object_name(key)

    def _st(self) -> ObjectStore:
        st = self._store
        if st is None:
            raise TierUnavailableError("the object store is not open")
        return st

    # -- primitives ------------------------------------------------------------------------
    def write_chunk(self, key: bytes, data: memoryview) -> bool:
        lru = self._lru
        if lru is not None and not self._reserve_room(lru, key, data.nbytes):
            return False  # stored already: the call reports it skipped
        since = self._cache.begin()
        try:
            header = frame_header(key, data, self.offloading_spec.layout_digest)
            with self._guarded(key):
                if len(header) + data.nbytes > self.part_size:
                    self._stats.incr("multipart_uploads")
                put_object(self._st(), self._path(key), header, data, self.part_size, self.part_concurrency)
        except BaseException:
            if lru is not None:
                lru.abort(key)
            raise
        if lru is not None:
            lru.commit(key)
            self._confirmed(key)
        self._cache.put(key, True, since)
        return True

    def _reserve_room(self, lru: LRUIndex, key: bytes, nbytes: int) -> bool:
        """Reserve ``key``'s room in the capacity account, evicting by DELETE; False: the key
        is stored already (the write is skipped)."""
        size = object_size(len(key), nbytes)
        # an old copy's DELETE must not land after this PUT: wait it out
        victims = self._after_removal(lru.reserve, key, size)
        if victims is None:
            # The account says stored; the store says so too, or it is stored again: another
            # server on the prefix, or a lifecycle rule, may have deleted it since.
            if self.chunk_exists(key):
                self._confirmed(key)
                self._stats.incr("skipped_known_stored")
                return False
            lru.discard(key)
            victims = self._after_removal(lru.reserve, key, size)
            if victims is None:  # stored here meanwhile
                self._stats.incr("skipped_known_stored")
                return False
        failed = self._evict_all(victims)
        if failed:
            lru.abort(key)
            raise CapacityError(
                f"no room within capacity_bytes: deleting {len(failed)} least recently used chunk(s) "
                f"failed: {failed[0]}",
                key,
            ) from failed[0]
        return True

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        lru = self._lru
        # Pinned before the GET, and taken into the account if absent (another server stored
        # it): a removal or a write of the key here meanwhile is seen. None: it is being
        # removed or written here now; read it, but leave the account to them.
        got = lru.adopt_pinned_new(key, object_size(len(key), out.nbytes)) if lru is not None else None
        entry, added = got if got is not None else (None, False)
        if added:
            with self._unconfirmed_lock:
                self._unconfirmed[key] = entry
        ok = False
        since = self._cache.begin()
        try:
            self._get_into(key, out)
            ok = True
        except ChunkNotFoundError:
            self._cache.forget(key)
            if lru is not None and entry is not None:
                self._confirmed(key)
                lru.discard(key, entry=entry)
            raise
        except IntegrityError:
            # the object is still there: it leaves the account when it is deleted (a load
            # deletes it; a verification without remove_bad keeps it)
            self._confirmed(key)
            self._cache.forget(key)
            raise
        except BaseException:
            # no answer (timeout, unreachable, breaker open): an entry added for this key and
            # confirmed by no answer since may stand for nothing, and was later "evicted" in
            # place of real chunks (one another load found the object for stays)
            if lru is not None and entry is not None:
                with self._unconfirmed_lock:
                    if self._unconfirmed.get(key) is entry:
                        del self._unconfirmed[key]
                        lru.discard(key, entry=entry)
            raise
        finally:
            if lru is not None and entry is not None:
                lru.unpin(key, touch=ok, entry=entry)
        if entry is not None:
            self._confirmed(key)
        self._cache.put(key, True, since)

    def _confirmed(self, key: bytes) -> None:
        """The store answered for ``key``: its entry is no longer one a load only guessed."""
        if self._unconfirmed:
            with self._unconfirmed_lock:
                self._unconfirmed.pop(key, None)

    def _get_into(self, key: bytes, out: memoryview) -> None:
        """GET the object into ``out`` and verify it; a bad copy's IntegrityError names its
        ETag (``copy``), so that deleting it cannot take a copy stored since."""
        etag: list[str | None] = [None]
        self._refuse_non_regular(key)
        try:
            with self._guarded(key):
                if object_size(len(key), out.nbytes) > self.part_size:
                    self._stats.incr("ranged_downloads")
                header = get_into(
                    self._st(), self._path(key), key, out, self.part_size, self.offloading_spec.layout_digest, etag
                )
            if self.verify:
                verify_payload(out, header, key)
        except IntegrityError as e:
            if e.copy is None and etag[0] is not None:
                e.copy = ("etag", etag[0])
            raise

    def _refuse_non_regular(self, key: bytes) -> None:
        """On a local store, fail a key whose object's path holds a FIFO, a directory or a
        device: the client opens it without O_NONBLOCK, and a FIFO's open blocks its worker
        until a writer comes. Counted in ``not_regular_files``."""
        if self._local_root is None:
            return
        try:
            mode = os.lstat(os.path.join(self._local_root, self._path(key))).st_mode
        except OSError:
            return  # absent (the GET says not found) or unreadable (the GET says why)
        if not stat.S_ISREG(mode):
            self._stats.incr("not_regular_files")
            raise OSError(errno.ENXIO, f"the object of this key is not a regular file ({stat.filemode(mode)})")

    def delete_bad_copy(self, key: bytes, exc: BaseException) -> None:
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
        since = self._cache.begin()
        try:
            with self._guarded(key):
                obstore.head(self._st(), self._path(key))
        except ChunkNotFoundError:
            self._cache.put(key, False)
            return False
        self._cache.put(key, True, since)
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
            back = [(0, v, object_size(len(v), self.offloading_spec.chunk_bytes)) for v, _ in failed]
            lru.merge_older(back, set())
        return [e for _, e in failed]

    # -- listing ---------------------------------------------------------------------------
    def list_chunks(self) -> list[bytes]:
        return [key for key, _ in self._listed_keys()]

    def _listed_keys(self) -> Iterator[tuple[bytes, Any]]:
        """(key, object metadata) of every chunk object under the prefix."""
        with self._guarded(b"list"):
            pages = list(obstore.list(self._st(), self._prefix, chunk_size=1000))
        seen: set[bytes] = set()
        for page in pages:
            for meta in page:
                parent, _, name = meta["path"].rpartition("/")
                if parent + "/" != self._prefix:  # (a listing is recursive: not one of ours)
                    continue
                key = self._key_from_name(name, meta["size"])
                if key is not None and key not in seen:
                    seen.add(key)
                    yield key, meta

    def _key_from_name(self, name: str, size: int) -> bytes | None:
        """The key an object name stands for (reads the header of hashed names)."""
        key = key_from_plain_name(name)
        if key is not None or not is_hashed_name(name):
            return key
        try:
            with self._guarded(b"list"):
                head = obstore.get_range(self._st(), self._prefix + name, start=0, length=header_probe_size(size))
            key = ChunkHeader.unpack(memoryview(head)).key
        except Exception as e:
            log.warning("obj tier %s: skipping unreadable object %s: %s", self.url, name, self._scrub(str(e)))
            return None
        # a copy of a chunk under another hashed name is not that chunk's object
        return key if object_name(key) == name else None

    # -- lookup: cache, then HEADs in parallel ----------------------------------------------
    async def lookup(self, keys: Sequence[bytes]) -> list[bool]:
        """Whether each key is stored: cached answers, then one HEAD per miss, in parallel."""
        ks = check_keys(keys)
        self._check_open()
        now = time.monotonic()
        answers: list[bool | None] = [self._cache.get(k, now) for k in ks]
        misses = [k for k, a in zip(ks, answers) if a is None]
        self._stats.incr("lookup_cache_hits", len(ks) - len(misses))
        if misses:
            self._stats.incr("lookup_cache_misses", len(misses))
            found = iter(await super().lookup(misses))  # HEADs as lookup jobs, under the in-flight bound
            answers = [a if a is not None else next(found) for a in answers]
        return [bool(a) for a in answers]

    async def touch(self, keys: Sequence[bytes]) -> None:
        ks = check_keys(keys)
        self._check_open()
        if self._lru is not None:
            self._lru.touch(ks)

    # -- stats -----------------------------------------------------------------------------
    def stored_chunk_count(self) -> int | None:
        return len(self._lru) if self._lru is not None else None

    def used_byte_count(self) -> int | None:
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
