"""The obj tier's stored objects: bad copies (corrupt, truncated, foreign, short on the ranged
path) fail their key and are deleted; layouts never collide; large chunks go in parts.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from s3_helpers import CHUNK, Rig, keys, kinds, on_asyncio_only, s3_config


async def test_corrupt_truncated_and_foreign_objects_fail_their_key(tmp_path: Path) -> None:
    rig = Rig()
    root = tmp_path / "store"
    tier = rig.tier({"type": "obj", "url": f"file://{root}"})
    async with tier:
        ks = keys(4)
        assert (await tier.offload(ks, [0, 1, 2, 3])).ok
        files = {p.name: p for p in root.rglob("*") if p.is_file()}
        assert len(files) == 4
        from asynctier.integrity import key_token

        def path(k: bytes) -> Path:
            return files[key_token(k)]

        blob = bytearray(path(ks[0]).read_bytes())
        blob[-10] ^= 0xFF  # payload bit flip
        path(ks[0]).write_bytes(bytes(blob))
        path(ks[1]).write_bytes(path(ks[1]).read_bytes()[:-100])  # truncated
        path(ks[2]).write_bytes(path(ks[3]).read_bytes())  # another key's object
        rig.zero()
        res = await tier.load(ks, [4, 5, 6, 7])
        assert res.succeeded == [ks[3]] and rig.chunk(7) == rig.orig_chunk(3)
        assert set(res.failed) == set(ks[:3])
        assert kinds(res) == {"checksum"}
        assert await tier.lookup(ks) == [False, False, False, True]  # bad copies deleted
        assert not path(ks[0]).exists()
        assert tier.stats().failures["checksum"] == 3


async def test_other_layout_never_collides(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    r1, r2 = Rig(namespace="model-a"), Rig(namespace="model-b")
    t1, t2 = r1.tier({"type": "obj", "url": url}), r2.tier({"type": "obj", "url": url})
    async with t1, t2:
        ks = keys(2)
        assert (await t1.offload(ks, [0, 1])).ok
        assert await t2.lookup(ks) == [False, False]
        assert kinds(await t2.load(ks, [0, 1])) == {"not_found"}


@on_asyncio_only
async def test_large_chunks_go_in_parallel_parts_and_ranges() -> None:
    mib = 1 << 20
    rig = Rig(chunk_bytes=11 * mib, num_chunks=3)
    tier = rig.tier(s3_config(part_size=5 * mib, part_concurrency=3))
    async with tier:
        ks = keys(2)
        res = await tier.offload(ks, [0, 1])
        assert res.ok, res.failed
        rig.zero()
        res = await tier.load(ks, [2, 0])
        assert res.ok, res.failed
        assert rig.chunk(2) == rig.orig_chunk(0) and rig.chunk(0) == rig.orig_chunk(1)
        extra = tier.stats().extra
        assert extra["multipart_uploads"] == 2 and extra["ranged_downloads"] == 2


@on_asyncio_only
@pytest.mark.parametrize("where", ["file", "s3"])
async def test_short_objects_on_the_ranged_path_fail_their_key_as_bad_and_are_deleted(
    where: str, tmp_path: Path
) -> None:
    """A chunk larger than part_size is fetched in ranges; an object cut short (in the last
    part, in a middle part, down to its header) fails its key as a bad copy and is deleted.
    A range past the end of a short object used to make obstore panic: the load failed as
    "other", the object stayed, and every later load failed the same way."""
    import obstore

    mib = 1 << 20
    if where == "s3":
        rig = Rig(chunk_bytes=11 * mib, num_chunks=6)
        tier = rig.tier(s3_config(part_size=5 * mib, lookup_ttl_s=0, lookup_negative_ttl_s=0))
        cuts = [11 * mib - 1000, 7 * mib, 200]
    else:
        rig = Rig(chunk_bytes=CHUNK, num_chunks=6)
        tier = rig.tier({"type": "obj", "url": f"file://{tmp_path}/store", "part_size": 16 * 1024})
        cuts = [CHUNK - 1000, 40 * 1024, 200]
    async with tier:
        ks = keys(3)
        assert (await tier.offload(ks, [0, 1, 2])).ok
        st = tier._st()
        for k, keep in zip(ks, cuts):
            body = obstore.get(st, tier._path(k)).bytes()
            obstore.put(st, tier._path(k), bytes(body)[:keep])
        res = await tier.load(ks, [3, 4, 5])
        assert set(res.failed) == set(ks) and kinds(res) == {"checksum"}, res.failed
        assert await tier.lookup(ks) == [False] * 3  # deleted
        assert kinds(await tier.load(ks, [3, 4, 5])) == {"not_found"}
        assert tier.breaker_state == "closed"


async def test_verify_without_remove_keeps_a_bad_object_accounted() -> None:
    """fsck without --remove: a bad object found by verify_chunks stays in the store, so it
    stays in the capacity account (it used to be dropped from it, left untracked)."""
    import obstore

    rig = Rig()
    tier = rig.tier({"type": "obj", "url": "memory://", "capacity_bytes": 1 << 30})
    async with tier:
        ks = keys(3)
        assert (await tier.offload(ks, [0, 1, 2])).ok
        st = tier._st()
        body = bytearray(obstore.get(st, tier._path(ks[0])).bytes())
        body[-1] ^= 1
        obstore.put(st, tier._path(ks[0]), bytes(body))
        before = tier.stats()
        res = await tier.verify_chunks(ks, remove_bad=False)
        assert set(res.failed) == {ks[0]}
        after = tier.stats()
        assert (
            (after.used_bytes, after.stored_chunks)
            == (before.used_bytes, before.stored_chunks)
            == (
                before.used_bytes,
                3,
            )
        )
        res = await tier.verify_chunks(ks, remove_bad=True)
        assert set(res.failed) == {ks[0]}
        assert tier.stats().stored_chunks == 2 and tier.stats().used_bytes == before.used_bytes * 2 // 3


@pytest.mark.parametrize("where", ["memory", "s3"])
async def test_deleting_a_bad_copy_leaves_a_copy_stored_since(where: str) -> None:
    """A load finds a bad object, and a good copy is stored under the same name before the
    bad one is deleted (a racing offload here or on another server): the good one stays.
    The delete went by name: the offload was reported stored and its copy was gone."""
    import obstore

    from asynctier import IntegrityError

    rig = Rig()
    cfg = s3_config(lookup_ttl_s=0, lookup_negative_ttl_s=0) if where == "s3" else {"type": "obj", "url": "memory://"}
    tier = rig.tier(cfg)
    async with tier:
        ks = keys(2)
        assert (await tier.offload(ks, [0, 1])).ok
        st = tier._st()
        for k in ks:
            body = bytearray(obstore.get(st, tier._path(k)).bytes())
            body[-1] ^= 1
            obstore.put(st, tier._path(k), bytes(body))
        out = memoryview(bytearray(CHUNK))
        errs = []
        for k in ks:
            with pytest.raises(IntegrityError) as info:
                await asyncio.to_thread(tier._get_into, k, out)
            errs.append(info.value)
        assert (await tier.offload(ks[:1], [0])).ok  # a good copy of ks[0], after the bad GET
        for k, e in zip(ks, errs):
            await asyncio.to_thread(tier.delete_bad_copy, k, e)
        assert tier.stats().extra["bad_copy_replaced"] == 1
        rig.zero()
        res = await tier.load(ks[:1], [2])
        assert res.ok and rig.chunk(2) == rig.orig_chunk(0)
        assert await tier.lookup(ks[1:]) == [False]  # the bad one nobody replaced is gone


# -- the stored format, written by hand --------------------------------------------------------------
def _object_by_hand(key: bytes, payload: bytes, chunk_bytes: int, namespace: str) -> tuple[str, bytes]:
    """(object path under the store root, object body) as docs/tiers/obj.md describes them,
    built from the format's description alone (no asynctier code)."""
    import base64
    import hashlib
    import struct

    import xxhash

    digest = hashlib.blake2b(f"asynctier/v1\0{chunk_bytes}\0{namespace}".encode(), digest_size=16).digest()
    if len(key) <= 96:
        name = base64.b32encode(key).decode("ascii").rstrip("=").lower()
    else:
        name = "h" + hashlib.blake2b(key, digest_size=32).hexdigest()
    fixed = struct.pack(
        "<4sHHIQQQ16s", b"ATKV", 1, 0, len(key), len(payload), xxhash.xxh3_64_intdigest(payload), 0, digest
    )
    header = fixed + key
    header += struct.pack("<Q", xxhash.xxh3_64_intdigest(header))
    return f"{digest.hex()}/{name}", header + payload


@pytest.mark.parametrize("part_size", [8 << 20, 16 * 1024])  # one GET; the first part, then ranges
async def test_an_object_written_by_hand_loads_byte_exact(tmp_path: Path, part_size: int) -> None:
    """Objects put into a file:// store from raw bytes, following the documented format (not
    the tier's writer), load through the tier byte for byte: a short key (base32 name) and
    a long one (hashed name, its key read back from the header when listing)."""
    import os

    rig = Rig()
    root = tmp_path / "store"
    ks = [b"prefix-hash-" + os.urandom(20), b"L" * 200]
    payloads = [os.urandom(CHUNK) for _ in ks]
    for k, data in zip(ks, payloads):
        rel, body = _object_by_hand(k, data, CHUNK, rig.spec.namespace)
        assert rel.split("/")[0] == rig.spec.layout_id
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)
    tier = rig.tier({"type": "obj", "url": f"file://{root}", "part_size": part_size, "capacity_bytes": 1 << 30})
    async with tier:
        assert sorted(await tier.stored_keys()) == sorted(ks)
        assert tier.stats().stored_chunks == 2  # accounted at open from the listing
        assert await tier.lookup(ks) == [True, True]
        rig.zero()
        res = await tier.load(ks, [3, 5])
        assert res.ok, res.failed
        assert rig.chunk(3) == payloads[0] and rig.chunk(5) == payloads[1]


async def test_a_part_size_smaller_than_the_largest_header_is_refused(tmp_path: Path) -> None:
    """Every load reads the header from the first part: a part_size smaller than the header
    of the longest key made every load of such a chunk fail as corrupt and delete it. It is
    refused at construction; at the smallest part_size accepted, a chunk of the longest key
    goes up in parts and comes back whole."""
    from asynctier import TierConfigError
    from asynctier.core import MAX_KEY_BYTES
    from asynctier.integrity import ChunkHeader

    smallest = ChunkHeader.packed_size(MAX_KEY_BYTES)
    rig = Rig()
    for url in ("memory://", f"file://{tmp_path}/store", "gs://bucket/prefix", "az://container/prefix"):
        with pytest.raises(TierConfigError, match="part_size"):
            rig.tier({"type": "obj", "url": url, "part_size": smallest - 1})
    tier = rig.tier({"type": "obj", "url": f"file://{tmp_path}/store", "part_size": smallest})
    async with tier:
        ks = [b"k" * MAX_KEY_BYTES, b"short"]
        assert (await tier.offload(ks, [0, 1])).ok
        rig.zero()
        res = await tier.load(ks, [2, 3])
        assert res.ok, res.failed
        assert rig.chunk(2) == rig.orig_chunk(0) and rig.chunk(3) == rig.orig_chunk(1)
        assert tier.stats().extra["ranged_downloads"] == 2


async def test_objects_not_named_as_this_tier_names_a_key_are_not_listed(tmp_path: Path) -> None:
    """Any name that decoded as base32 was listed as a key: an upper-case spelling of a chunk's
    name listed that key twice (fsck: "keys must be distinct within one call"), a nested
    object listed a key never stored, and a copy of a long key's object under another hashed
    name listed its key again. Each was also counted in used_bytes at reopen."""
    from asynctier.cli.fsck import fsck_tier
    from asynctier.integrity import key_token

    rig = Rig()
    root = tmp_path / "store"
    config = {"type": "obj", "url": f"file://{root}", "capacity_bytes": 1 << 30}
    short, long = b"abc", b"L" * 200  # a base32 name, a hashed one
    tier = rig.tier(config)
    async with tier:
        assert (await tier.offload([short, long], [0, 1])).ok
        used = tier.stats().used_bytes
    (layout,) = [p for p in root.iterdir() if p.is_dir()]
    real = layout / key_token(long)
    (layout / key_token(short).upper()).write_bytes(b"not ours")
    (layout / ("h" + "0" * 64)).write_bytes(real.read_bytes())  # another hashed name
    (layout / "sub").mkdir()
    (layout / "sub" / key_token(b"ghost")).write_bytes(b"x" * 10)
    tier = rig.tier(config)
    async with tier:
        assert sorted(await tier.stored_keys()) == sorted([short, long])
        assert tier.stats().used_bytes == used
    report = await fsck_tier("t", config, rig.spec)
    assert (report.checked, report.ok) == (2, 2), report
