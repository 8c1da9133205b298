"""What the fs tier's tests (and the chain's, over an fs tier) share: where a chunk's file is,
and how to damage or swap stored chunks on disk."""

from __future__ import annotations

from pathlib import Path

from asynctier.integrity import key_token
from asynctier.tiers.fs import HEADER_BLOCK, FsTier
from asynctier.tiers.fs.layout import shard_of

__all__ = ["chunk_file", "damage_file", "swap_files"]


def chunk_file(tier: FsTier, key: bytes) -> Path:
    return tier.dir / f"{shard_of(key):02x}" / key_token(key)


def damage_file(path: Path, how: str) -> None:
    """``flip``: one payload bit; otherwise cut the payload in half."""
    raw = bytearray(path.read_bytes())
    if how == "flip":
        raw[HEADER_BLOCK + 1] ^= 0x40
    else:
        del raw[HEADER_BLOCK + (len(raw) - HEADER_BLOCK) // 2 :]
    path.write_bytes(bytes(raw))


def swap_files(a: Path, b: Path) -> None:
    raw_a, raw_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(raw_b)
    b.write_bytes(raw_a)
