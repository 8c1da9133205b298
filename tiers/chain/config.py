"""The chain's configuration, checked before anything is built.

::

    {"type": "chain",
     "tiers": [{"type": "memory", "capacity_bytes": 8 << 30},
               {"type": "fs", "root": "/mnt/nvme/kv", "admit": "second_hit"},
               {"type": "obj", "url": "s3://bucket/kv", "deadline_s": 2.0}],
     "write": "back"}

Each entry of ``tiers`` is a tier config for the factory, plus four keys the chain takes out
of it for itself: ``name`` (the tier's name in stats, results and metrics; default its type),
``admit`` (its admission policy, :mod:`.admission`), ``deadline_s`` (the longest the chain
waits for one call to it; default none) and ``breaker`` (``{"threshold": 5, "cooldown_s":
5.0}``: consecutive failed calls that open its circuit breaker, and how long it stays open).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from asynctier.core.base import MAX_INFLIGHT
from asynctier.core.validation import MAX_SECONDS
from asynctier.errors import TierConfigError

__all__ = ["ChainConfig", "EntryConfig", "ENTRY_KEYS", "WRITE_POLICIES", "parse_entries"]

#: The keys of a tier entry that belong to the chain (taken out before the factory sees it).
ENTRY_KEYS = ("name", "admit", "deadline_s", "breaker")
WRITE_POLICIES = ("back", "through")
_BREAKER_KEYS = ("threshold", "cooldown_s")
#: Background slots beyond this many chunks are a mistake (a count of bytes, say): the staging
#: buffer holds max_inflight + backlog_chunks chunks, allocated when the chain is built.
MAX_BACKLOG_CHUNKS = 1 << 20


def _seconds(where: str, name: str, value: object, *, allow_none: bool, zero_ok: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and (value >= 0 if zero_ok else value > 0)
        and value <= MAX_SECONDS
    ):
        return float(value)
    bound = ">= 0" if zero_ok else "> 0"
    raise TierConfigError(
        f"{where}{name} must be a number of seconds {bound} and <= {MAX_SECONDS:g}{' or None' if allow_none else ''}; "
        f"got {value!r}"
    )


def _int(where: str, name: str, value: object, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
        raise TierConfigError(f"{where}{name} must be an int {bound}; got {value!r}")
    return value


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TierConfigError(f"chain: {name} must be True or False; got {value!r}")
    return value


@dataclass(frozen=True)
class EntryConfig:
    """One tier of the chain: its factory config and the chain's settings for it."""

    name: str
    tier_config: dict[str, Any]
    admit: object
    deadline_s: float | None
    breaker_threshold: int
    breaker_cooldown_s: float


def parse_entries(tiers: object) -> list[EntryConfig]:
    """A chain's ``tiers`` list, checked: each entry's factory config (the chain's own keys,
    :data:`ENTRY_KEYS`, taken out) with its name and settings; the caller's dicts untouched."""
    if isinstance(tiers, (str, bytes, Mapping)) or not isinstance(tiers, Sequence):
        raise TierConfigError(
            f"chain: tiers must be a list of tier configs (dicts with 'type'), fastest first; got {tiers!r:.100}"
        )
    if not tiers:
        raise TierConfigError("chain: tiers must list at least one tier config (fastest first); got an empty list")
    out: list[EntryConfig] = []
    names: set[str] = set()
    generated: set[str] = set()
    for i, raw in enumerate(tiers):
        where = f"chain: tiers[{i}]: "
        if not isinstance(raw, Mapping):
            raise TierConfigError(f"{where}each tier must be a dict with 'type'; got {type(raw).__name__} {raw!r:.80}")
        cfg = dict(raw)
        kind = cfg.get("type")
        if not isinstance(kind, str) or not kind:
            raise TierConfigError(f"{where}each tier needs 'type' (a non-empty str); got {kind!r}")
        name = cfg.pop("name", None)
        if name is None:  # the type, numbered from its second entry on: fs, fs-1, fs-2
            seen = sum(1 for e in out if e.tier_config.get("type") == kind)
            name = kind if seen == 0 else f"{kind}-{seen}"
        if not isinstance(name, str) or not name or "/" in name or not name.isprintable():
            raise TierConfigError(f"{where}name must be a non-empty printable str without '/'; got {name!r}")
        if name in names:
            given = (
                " (a name given by default: set 'name' on these tiers)"
                if name in generated or "name" not in raw
                else ""
            )
            raise TierConfigError(
                f"{where}name {name!r}{given} is used by another tier of the chain; names must be unique"
            )
        names.add(name)
        if "name" not in raw:
            generated.add(name)
        admit = cfg.pop("admit", None)
        deadline = _seconds(where, "deadline_s", cfg.pop("deadline_s", None), allow_none=True)
        breaker = cfg.pop("breaker", None)
        if breaker is None:
            breaker = {}
        if not isinstance(breaker, Mapping):
            raise TierConfigError(f"{where}breaker must be a dict with threshold and/or cooldown_s; got {breaker!r}")
        unknown = sorted(set(breaker) - set(_BREAKER_KEYS))
        if unknown:
            raise TierConfigError(f"{where}breaker: unknown key(s) {unknown}; accepted: threshold, cooldown_s")
        out.append(
            EntryConfig(
                name=name,
                tier_config=cfg,
                admit=admit,
                deadline_s=deadline,
                breaker_threshold=_int(where, "breaker threshold", breaker.get("threshold", 5), 1),
                breaker_cooldown_s=_seconds(
                    where, "breaker cooldown_s", breaker.get("cooldown_s", 5.0), allow_none=False, zero_ok=True
                )
                or 0.0,
            )
        )
    return out


@dataclass(frozen=True)
class ChainConfig:
    """Everything the chain tier was configured with, checked (see :class:`ChainTier`)."""

    entries: list[EntryConfig]
    write: str
    backlog_chunks: int
    promote: bool
    refresh_below: bool
    demote: bool
    demote_headroom_chunks: int
    background_batch: int
    max_inflight: int
    store_backpressure: str
    backpressure_timeout_s: float
    verify: bool | None

    @classmethod
    def parse(
        cls,
        *,
        tiers: object,
        write: object,
        backlog_chunks: object,
        promote: object,
        refresh_below: object,
        demote: object,
        demote_headroom_chunks: object,
        background_batch: object,
        max_inflight: object,
        store_backpressure: object,
        backpressure_timeout_s: object,
        verify: object,
    ) -> ChainConfig:
        entries = parse_entries(tiers)
        if write not in WRITE_POLICIES:
            raise TierConfigError(
                f"chain: write must be 'back' (the call returns once the first tier has the chunk) or "
                f"'through' (once every tier has it or failed it); got {write!r}"
            )
        if store_backpressure not in ("wait", "drop"):
            raise TierConfigError(f"chain: store_backpressure must be 'wait' or 'drop'; got {store_backpressure!r}")
        if verify is not None:
            _bool("verify", verify)
        demote = _bool("demote", demote)
        if demote and len(entries) < 2:
            raise TierConfigError("chain: demote=True needs a second tier to demote into; the chain has one")
        backlog = _int("chain: ", "backlog_chunks", backlog_chunks, 0, MAX_BACKLOG_CHUNKS)
        if backlog == 0 and len(entries) > 1 and (write == "back" or demote):
            # every background write is dropped: acknowledged chunks would live in the first tier only
            need = "write='back' (its write-backs)" if write == "back" else "demote=True (its demotions)"
            raise TierConfigError(
                f"chain: backlog_chunks=0 leaves no slot for background writes, and {need} would all be dropped; "
                "use backlog_chunks >= 1, or write='through' and demote=False"
            )
        return cls(
            entries=entries,
            write=str(write),
            backlog_chunks=backlog,
            promote=_bool("promote", promote),
            refresh_below=_bool("refresh_below", refresh_below),
            demote=demote,
            demote_headroom_chunks=_int("chain: ", "demote_headroom_chunks", demote_headroom_chunks, 1),
            background_batch=_int("chain: ", "background_batch", background_batch, 1),
            max_inflight=_int("chain: ", "max_inflight", max_inflight, 1, MAX_INFLIGHT),
            store_backpressure=str(store_backpressure),
            backpressure_timeout_s=_seconds(
                "chain: ", "backpressure_timeout_s", backpressure_timeout_s, allow_none=False, zero_ok=True
            )
            or 0.0,
            verify=verify,  # type: ignore[arg-type]
        )
