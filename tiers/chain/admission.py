"""Admission: which chunks a tier of a chain takes.

Every write the chain makes into one of its tiers (a store, a background write-back, a
promotion, a demotion) asks that tier's policy first. A policy is any object with
``observe(key)`` (the chain saw the key: stored, looked up or loaded) and
``admit(key, reason) -> bool`` (``reason``: ``"store"``, ``"promote"`` or ``"demote"``);
a plain callable ``fn(key, reason) -> bool`` is one too. Built in:

* ``"all"`` (the default): every chunk.
* ``{"policy": "second_hit", "window": 65536, "window_s": None}``: a key is admitted once it
  has been seen at least twice among the last ``window`` distinct keys seen (and, with
  ``window_s``, within that many seconds of its first sighting): the SSD gate of Dynamo and
  LMCache, which keeps one-off prefixes off a slow or wearing medium.
* ``{"policy": "filter", "namespaces": ["llama-*"], "max_chunk_bytes": N,
  "min_chunk_bytes": N, "key_prefixes": ["sys:"]}``: a static filter on the spec's namespace
  (shell-style patterns), its chunk size, and the key's leading bytes; every field optional.
"""

from __future__ import annotations

import fnmatch
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from asynctier.errors import ChunkError, TierConfigError
from asynctier.spec import OffloadingSpec

__all__ = [
    "AdmissionPolicy",
    "AdmitAll",
    "CallablePolicy",
    "FilterPolicy",
    "NotAdmittedError",
    "SecondHit",
    "make_policy",
]

REASONS = ("store", "promote", "demote")


@runtime_checkable
class AdmissionPolicy(Protocol):
    """What a tier of a chain asks before the chain writes a chunk into it."""

    def observe(self, key: bytes) -> None:
        """The chain saw ``key`` (an offload, a lookup or a load of it)."""

    def admit(self, key: bytes, reason: str) -> bool:
        """Whether to write ``key`` into the tier now (``reason``: store, promote or demote)."""


class AdmitAll:
    """Every chunk (the default)."""

    def observe(self, key: bytes) -> None:
        pass

    def admit(self, key: bytes, reason: str) -> bool:
        return True

    def __repr__(self) -> str:
        return "AdmitAll()"


class CallablePolicy:
    """A plain function ``fn(key, reason) -> bool`` as a policy."""

    def __init__(self, fn: Callable[[bytes, str], bool]) -> None:
        self.fn = fn

    def observe(self, key: bytes) -> None:
        pass

    def admit(self, key: bytes, reason: str) -> bool:
        return bool(self.fn(key, reason))

    def __repr__(self) -> str:
        return f"CallablePolicy({self.fn!r})"


class SecondHit:
    """Admit a key seen at least ``hits`` times among the last ``window`` distinct keys seen."""

    def __init__(self, window: int = 65536, window_s: float | None = None, hits: int = 2) -> None:
        self.window = window
        self.window_s = window_s
        self.hits = hits
        # key -> (times seen, first seen); oldest first, capped at `window` keys (a ghost list)
        self._seen: OrderedDict[bytes, tuple[int, float]] = OrderedDict()

    def _count(self, key: bytes, now: float) -> tuple[int, float] | None:
        got = self._seen.get(key)
        if got is not None and self.window_s is not None and now - got[1] > self.window_s:
            del self._seen[key]
            return None
        return got

    def observe(self, key: bytes) -> None:
        now = time.monotonic()
        got = self._count(key, now)
        self._seen[key] = (1, now) if got is None else (got[0] + 1, got[1])
        self._seen.move_to_end(key)
        while len(self._seen) > self.window:
            self._seen.popitem(last=False)

    def admit(self, key: bytes, reason: str) -> bool:
        got = self._count(key, time.monotonic())
        return got is not None and got[0] >= self.hits

    def __repr__(self) -> str:
        return f"SecondHit(window={self.window}, window_s={self.window_s})"


class FilterPolicy:
    """A static filter: the spec's namespace and chunk size (decided once), the key's prefix."""

    def __init__(
        self,
        spec: OffloadingSpec,
        namespaces: list[str] | None = None,
        max_chunk_bytes: int | None = None,
        min_chunk_bytes: int | None = None,
        key_prefixes: list[bytes] | None = None,
    ) -> None:
        ok = True
        if namespaces is not None:
            ok = any(fnmatch.fnmatchcase(spec.namespace, p) for p in namespaces)
        if max_chunk_bytes is not None and spec.chunk_bytes > max_chunk_bytes:
            ok = False
        if min_chunk_bytes is not None and spec.chunk_bytes < min_chunk_bytes:
            ok = False
        self.spec_ok = ok
        self.key_prefixes = tuple(key_prefixes) if key_prefixes is not None else None

    def observe(self, key: bytes) -> None:
        pass

    def admit(self, key: bytes, reason: str) -> bool:
        if not self.spec_ok:
            return False
        return self.key_prefixes is None or key.startswith(self.key_prefixes)

    def __repr__(self) -> str:
        return f"FilterPolicy(spec_ok={self.spec_ok}, key_prefixes={self.key_prefixes})"


def _int(where: str, name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise TierConfigError(f"{where}: {name} must be an int >= {minimum}; got {value!r}")
    return value


def _str_list(where: str, name: str, value: object) -> list[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TierConfigError(f"{where}: {name} must be a list of str; got {value!r}")
    return list(value)


def _prefixes(where: str, value: object) -> list[bytes]:
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise TierConfigError(f"{where}: key_prefixes must be a list of str or bytes; got {value!r}")
    out = []
    for v in value:
        if isinstance(v, str):
            out.append(v.encode())
        elif isinstance(v, bytes):
            out.append(v)
        else:
            raise TierConfigError(f"{where}: key_prefixes must be a list of str or bytes; got {v!r} in it")
    return out


_FIELDS = {
    "second_hit": ("window", "window_s", "hits"),
    "filter": ("namespaces", "max_chunk_bytes", "min_chunk_bytes", "key_prefixes"),
    "all": (),
}


def make_policy(value: object, spec: OffloadingSpec, where: str) -> AdmissionPolicy:
    """The policy a tier entry's ``admit`` value describes (see the module docstring)."""
    accepted = (
        "'all', 'second_hit', a dict with 'policy', a callable fn(key, reason) -> bool, "
        "or an object with observe() and admit()"
    )
    if value is None:
        return AdmitAll()
    if isinstance(value, str):
        value = {"policy": value}
    if isinstance(value, Mapping):
        cfg: dict[str, Any] = dict(value)
        kind = cfg.pop("policy", None)
        odd = [k for k in cfg if not isinstance(k, str)]
        if odd:
            raise TierConfigError(f"{where}: admit keys must be strings; got {odd[0]!r:.80}")
        if not isinstance(kind, str) or kind not in _FIELDS:
            raise TierConfigError(f"{where}: admit policy must be one of {', '.join(map(repr, _FIELDS))}; got {kind!r}")
        unknown = sorted(set(cfg) - set(_FIELDS[kind]))
        if unknown:
            raise TierConfigError(
                f"{where}: unknown key(s) {', '.join(map(repr, unknown))} for admit policy {kind!r}; "
                f"accepted: {', '.join(_FIELDS[kind]) or '(none)'}"
            )
        if kind == "all":
            return AdmitAll()
        if kind == "second_hit":
            window_s = cfg.get("window_s")
            if window_s is not None and (
                isinstance(window_s, bool) or not isinstance(window_s, (int, float)) or not 0 < window_s < float("inf")
            ):
                raise TierConfigError(f"{where}: window_s must be a number of seconds > 0 or None; got {window_s!r}")
            return SecondHit(
                _int(where, "window", cfg.get("window", 65536)),
                float(window_s) if window_s is not None else None,
                _int(where, "hits", cfg.get("hits", 2)),
            )
        return FilterPolicy(
            spec,
            _str_list(where, "namespaces", cfg["namespaces"]) if "namespaces" in cfg else None,
            _int(where, "max_chunk_bytes", cfg["max_chunk_bytes"]) if "max_chunk_bytes" in cfg else None,
            _int(where, "min_chunk_bytes", cfg["min_chunk_bytes"]) if "min_chunk_bytes" in cfg else None,
            _prefixes(where, cfg["key_prefixes"]) if "key_prefixes" in cfg else None,
        )
    if isinstance(value, type):  # a class passes both checks below, and fails (or admits all) at each call
        raise TierConfigError(f"{where}: admit must be {accepted}; got the class {value.__name__} (an instance?)")
    if callable(getattr(value, "admit", None)) and callable(getattr(value, "observe", None)):
        policy: AdmissionPolicy = value  # type: ignore[assignment]
        return policy
    if callable(value):
        return CallablePolicy(value)
    raise TierConfigError(f"{where}: admit must be {accepted}; got {value!r}")


class NotAdmittedError(ChunkError):
    """No tier of the chain admitted the chunk: it is stored nowhere."""
