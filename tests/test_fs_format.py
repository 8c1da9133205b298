"""The fs tier's on-disk format, pinned: chunk files written here from raw bytes, following
docs/tiers/fs.md (not the tier's writer), are found by a tier's scan and load byte-exact.
A change of the format that breaks this must bump the format version instead."""

from __future__ import annotations

import base64
import hashlib
import os
import struct
from pathlib import Path

import pytest
import xxhash

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.engines import native as nativeio

CHUNK = 8192
NAMESPACE = "test/format"

_NO_NATIVE = nativeio.problem()


def namespace_dir(root: Path) -> tuple[Path, bytes]:
    """ROOT/v1-<32 hex digits of the layout digest>, and the digest: BLAKE2b-128 of
    "asynctier/v1", NUL, the chunk size in decimal, NUL, the namespace."""
    digest = hashlib.blake2b(f"asynctier/v1\0{CHUNK}\0{NAMESPACE}".encode(), digest_size=16).digest()
    return root / f"v1-{digest.hex()}", digest


def file_name(key: bytes) -> str:
    """Keys up to 96 bytes: base32, lowercase, no padding; longer: "h" + BLAKE2b-256 hex."""
    if len(key) <= 96:
        return base64.b32encode(key).decode().lower().rstrip("=")
    return "h" + hashlib.blake2b(key, digest_size=32).hexdigest()


def chunk_bytes(key: bytes, payload: bytes, digest: bytes) -> bytes:
    """Header (little-endian: magic, version, flags, key length, payload length, payload
    xxh3-64, sequence, layout digest; the key; xxh3-64 of all that) padded with zeros to
    4096 bytes, then the payload."""
    body = struct.pack(
        "<4sHHIQQQ16s", b"ATKV", 1, 0, len(key), len(payload), xxhash.xxh3_64_intdigest(payload), 0, digest
    )
    body += key
    header = body + struct.pack("<Q", xxhash.xxh3_64_intdigest(body))
    return header + bytes(4096 - len(header)) + payload


@pytest.mark.parametrize(
    "io_engine",
    ["threads", pytest.param("native", marks=pytest.mark.skipif(_NO_NATIVE is not None, reason=f"{_NO_NATIVE}"))],
)
async def test_a_chunk_file_written_by_the_documented_format_loads_byte_exact(tmp_path: Path, io_engine: str) -> None:
    ns, digest = namespace_dir(tmp_path)
    keys = [b"prefix-hash-\x00\xff", bytes(range(200))]  # a base32 name and a hashed one
    payloads = [os.urandom(CHUNK) for _ in keys]
    for key, payload in zip(keys, payloads):
        shard = ns / f"{xxhash.xxh3_64_intdigest(key) & 255:02x}"
        shard.mkdir(parents=True, exist_ok=True)
        (shard / file_name(key)).write_bytes(chunk_bytes(key, payload, digest))
    spec = OffloadingSpec(CHUNK, 4, namespace=NAMESPACE)
    view = memoryview(bytearray(spec.total_bytes))
    # one worker: the store below runs on the thread whose header buffer the loads filled
    config = {"type": "fs", "root": str(tmp_path), "io_engine": io_engine, "max_inflight": 1}
    tier = SecondaryTierFactory.create_secondary_tier(config, view, spec)
    async with tier:
        assert sorted(await tier.stored_keys()) == sorted(keys)  # the scan trusted both
        res = await tier.load(keys, [0, 1])
        assert res.ok, res.failed
        assert [bytes(view[i * CHUNK : (i + 1) * CHUNK]) for i in range(2)] == payloads
        # and what the tier writes is the same bytes
        view[2 * CHUNK : 3 * CHUNK] = payloads[0]
        assert (await tier.offload([b"written-here"], [2])).ok
        own = ns / f"{xxhash.xxh3_64_intdigest(b'written-here') & 255:02x}" / file_name(b"written-here")
        assert own.read_bytes() == chunk_bytes(b"written-here", payloads[0], digest)
