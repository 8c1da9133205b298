"""What ``asynctier fsck`` checks: each selected ``[tiers.NAME]`` table, a chain replaced by its
members (at any depth), every tier class resolved before any chunk is read or removed.

A member is named by where it sits in the file: ``kv.tiers[1]`` is the second entry of the
chain ``[tiers.kv]``, ``kv.tiers[1].tiers[0]`` the first entry of a chain inside it. Its config
is the one the chain builds it from (the chain's own entry keys, ``name``, ``admit``,
``deadline_s`` and ``breaker``, taken out by the chain's own parser).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import TierConfigError
from ..factory import SecondaryTierFactory

__all__ = ["NOT_PERSISTENT", "CheckTarget", "check_targets", "require_chunk_tier"]

#: Why a tier in process memory (a table, or a chain's member) is skipped (the report's ``skipped``).
NOT_PERSISTENT = "it holds nothing across processes (a fresh process always sees it empty)"


@dataclass(frozen=True)
class CheckTarget:
    """One tier fsck checks, or skips saying why."""

    name: str  # "kv", or for a member of a chain "kv.tiers[1]"
    where: str  # how messages name its config: "[tiers.kv]", "[tiers.kv] tiers[1]"
    config: dict[str, Any]
    member: str | None = None  # the chain's name for it (its entry's `name`, default its type)
    skipped: str | None = None


def require_chunk_tier(name: str, cls: type) -> None:
    """fsck lists and verifies through :class:`~asynctier.core.ChunkTier`'s methods; refuse any other tier."""
    from ..core import ChunkTier

    if not issubclass(cls, ChunkTier):
        raise TierConfigError(
            f"tier {name!r} ({cls.__module__}.{cls.__qualname__}) cannot be checked: fsck needs a ChunkTier "
            "(stored_keys and verify_chunks)"
        )


def check_targets(table: str, config: Mapping[str, Any]) -> list[CheckTarget]:
    """The tiers to check for ``[tiers.<table>]``: the table itself, or a chain's members."""
    return _expand(table, "", config, None)


def _expand(table: str, path: str, config: Mapping[str, Any], member: str | None) -> list[CheckTarget]:
    # by name: mypy checks tiers/ as the package "tiers", not as the installed asynctier.tiers
    chain: Any = importlib.import_module("asynctier.tiers.chain.config")
    chain_tier: type = importlib.import_module("asynctier.tiers.chain").ChainTier
    name = f"{table}.{path}" if path else table
    where = f"[tiers.{table}] {path}" if path else f"[tiers.{table}]"
    try:
        cls = SecondaryTierFactory.get_tier_class(config)
        entries = chain.parse_entries(config.get("tiers")) if issubclass(cls, chain_tier) else None
    except TierConfigError as e:
        raise TierConfigError(f"{where}: {e}") from None
    if entries is not None:
        out: list[CheckTarget] = []
        for i, entry in enumerate(entries):
            sub = f"{path}.tiers[{i}]" if path else f"tiers[{i}]"
            out += _expand(table, sub, entry.tier_config, entry.name)
        return out
    require_chunk_tier(name, cls)
    skipped = NOT_PERSISTENT if not getattr(cls, "persistent", True) else None
    return [CheckTarget(name, where, dict(config), member, skipped)]
