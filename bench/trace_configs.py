"""The tiers and chains ``bench_trace.py`` replays its trace through, by name.

A name is one tier (``memory``, ``fs``, ``nvme``, ``obj``) or a chain of them joined by ``+``,
fastest first (``memory+fs+obj``), optionally followed by ``:through`` or ``:back`` for the
chain's write policy. Capacities are given in chunks, so a figure says how much of the trace's
working set each tier holds; the obj tier is unbounded (a shared store).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_RUNS", "SINGLE_TIERS", "Capacities", "build_config"]

SINGLE_TIERS = ("memory", "fs", "nvme", "obj")
#: What a default run replays: each tier alone, then the chains a user chooses between.
DEFAULT_RUNS = (
    "memory",
    "fs",
    "nvme",
    "obj",
    "memory+fs",
    "memory+nvme",
    "memory+obj",
    "memory+fs+obj",
    "memory+fs+obj:through",
)
#: A disk tier's chunk takes a header block beside its payload (fs and nvme ``stored_size``).
_HEADER_BLOCK = 4096


@dataclass(frozen=True)
class Capacities:
    """How many chunks each bounded tier holds."""

    memory_chunks: int
    disk_chunks: int
    chunk_bytes: int

    def memory_bytes(self) -> int:
        return self.memory_chunks * self.chunk_bytes

    def disk_bytes(self) -> int:
        # the payload rounded to the block, plus the header block
        block = -(-self.chunk_bytes // _HEADER_BLOCK) * _HEADER_BLOCK
        return self.disk_chunks * (block + _HEADER_BLOCK)


def parse_run(name: str) -> tuple[list[str], str | None]:
    """``"memory+fs:through"`` -> (["memory", "fs"], "through"); a clear error for anything else."""
    body, _, write = name.partition(":")
    parts = body.split("+")
    unknown = [p for p in parts if p not in SINGLE_TIERS]
    if unknown or not body:
        raise ValueError(
            f"run {name!r}: unknown tier {unknown[0] if unknown else ''!r}; accepted: {', '.join(SINGLE_TIERS)}, "
            "joined by '+' fastest first (memory+fs+obj), optionally ':back' or ':through'"
        )
    if len(set(parts)) != len(parts):
        raise ValueError(f"run {name!r}: a tier appears twice in the chain")
    if write and (write not in ("back", "through") or len(parts) < 2):
        raise ValueError(f"run {name!r}: ':{write}' is accepted only as ':back' or ':through' after a chain")
    return parts, (write or None) if len(parts) > 1 else None


def _tier(kind: str, root: Path, caps: Capacities, obj: Mapping[str, Any] | None) -> dict[str, Any]:
    if kind == "memory":
        return {"type": "memory", "capacity_bytes": caps.memory_bytes()}
    if kind == "fs":
        return {"type": "fs", "root": str(root / "fs"), "capacity_bytes": caps.disk_bytes()}
    if kind == "nvme":
        return {"type": "nvme", "path": str(root / "nvme.slab"), "capacity_bytes": caps.disk_bytes()}
    if obj is not None:  # the S3 server's config: its own prefix per run
        return {**obj, "url": f"{obj['url'].rstrip('/')}/{root.name}"}
    return {"type": "obj", "url": f"file://{root / 'obj'}"}


def build_config(
    name: str, root: Path, caps: Capacities, *, write: str = "back", obj: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The factory config of run ``name`` with its files under ``root`` (one directory per run).

    ``write`` is the chains' policy where the name gives none; ``obj`` replaces the obj tier's
    ``file://`` config (an S3 server's).
    """
    parts, policy = parse_run(name)
    tiers = [_tier(kind, root, caps, obj) for kind in parts]
    if len(tiers) == 1:
        return tiers[0]
    return {"type": "chain", "tiers": tiers, "write": policy or write}
