"""The lookup cache: recent answers to "is this key stored?", so repeated lookups cost no HEAD."""

from __future__ import annotations

import collections
import threading
import time

from .params import integer, seconds

__all__ = ["LookupCache"]


class LookupCache:
    """Bounded key -> (present, expiry) map, oldest entries dropped first; thread-safe.

    Negative answers get their own (shorter) TTL: another server may store the key meanwhile.
    A TTL of 0 turns that side off.
    """

    def __init__(self, entries: int, ttl_s: float, negative_ttl_s: float) -> None:
        self.entries = entries
        self.ttl_s = ttl_s
        self.negative_ttl_s = negative_ttl_s
        self._lock = threading.Lock()
        self._map: collections.OrderedDict[bytes, tuple[bool, float]] = collections.OrderedDict()
        # A request's answer lands only if no removal of its key began since the request did:
        # a load still streaming when a remove ended put "present" back for lookup_ttl_s.
        self._epoch = 0
        self._removed_at: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self._floor = 0  # the newest removal forgotten (bounded): answers older than it do not land

    @classmethod
    def configured(cls, entries: object, ttl_s: object, negative_ttl_s: object) -> LookupCache:
        """A cache from the tier's ``lookup_cache_entries``, ``lookup_ttl_s`` and
        ``lookup_negative_ttl_s``, checked."""
        return cls(
            integer("lookup_cache_entries", entries, minimum=0),
            seconds("lookup_ttl_s", ttl_s, zero_ok=True),
            seconds("lookup_negative_ttl_s", negative_ttl_s, zero_ok=True),
        )

    def get(self, key: bytes, now: float) -> bool | None:
        with self._lock:
            hit = self._map.get(key)
            if hit is None:
                return None
            if hit[1] <= now:
                del self._map[key]
                return None
            return hit[0]

    def begin(self) -> int:
        """A token to pass to :meth:`put` for the answer of a request that starts now."""
        return self._epoch

    def put(self, key: bytes, present: bool, since: int | None = None) -> None:
        """Cache an answer; ``since`` (:meth:`begin` at the request's start): a "present"
        that a removal begun meanwhile made stale is dropped."""
        if not present:  # found gone: answers of requests begun before are stale too
            self.forget(key)
        ttl = self.ttl_s if present else self.negative_ttl_s
        if ttl <= 0 or self.entries <= 0:
            return
        with self._lock:
            if present and since is not None and (since < self._floor or self._removed_at.get(key, -1) >= since):
                return
            self._map[key] = (present, time.monotonic() + ttl)
            self._map.move_to_end(key)
            while len(self._map) > self.entries:
                self._map.popitem(last=False)

    def forget(self, key: bytes) -> None:
        """Drop ``key``'s answer: it is being removed (or found gone)."""
        with self._lock:
            self._map.pop(key, None)
            self._removed_at[key] = self._epoch
            self._removed_at.move_to_end(key)
            self._epoch += 1
            while len(self._removed_at) > max(self.entries, 1024):
                _, at = self._removed_at.popitem(last=False)
                self._floor = max(self._floor, at + 1)

    def __len__(self) -> int:
        return len(self._map)
