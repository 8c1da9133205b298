"""The nvme tier's on-disk format, pinned: a slab set, checkpoint and journal built here byte
by byte from docs/tiers/nvme.md (struct and xxhash, not the tier's writers), then opened with
the tier and read back byte-exact."""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import struct
from array import array
from dataclasses import dataclass
from pathlib import Path

import pytest
import xxhash
from nvme_helpers import aligned, chunk_at

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.tiers.nvme import NvmeTier

CHUNK = 10_000  # not a block multiple: the payload area is rounded up
NAMESPACE = "format/pinned"


def xxh(data: bytes) -> bytes:
    return struct.pack("<Q", xxhash.xxh3_64_intdigest(data))


def layout_digest(chunk_bytes: int, namespace: str) -> bytes:
    return hashlib.blake2b(f"asynctier/v1\0{chunk_bytes}\0{namespace}".encode(), digest_size=16).digest()


def round_up(n: int, block: int) -> int:
    return -(-n // block) * block


class Geometry:
    def __init__(self, block: int, stripes: int, per_stripe: int) -> None:
        self.block = block
        self.hdr_area = round_up(52 + 1024 + 8, block)
        self.slot_size = self.hdr_area + round_up(CHUNK, block)
        self.data_off = round_up(max(104, 4096), block)
        self.stripes = stripes
        self.per_stripe = per_stripe
        self.nslots = stripes * per_stripe
        self.slab_bytes = self.data_off + per_stripe * self.slot_size

    def locate(self, slot: int) -> tuple[int, int]:
        return slot % self.stripes, self.data_off + (slot // self.stripes) * self.slot_size


def superblock(geo: Geometry, stripe: int, epoch: int, slab_id: bytes, digest: bytes) -> bytes:
    head = struct.pack(
        "<8sIIQQQQII16s16sQ",
        b"ATNVSLAB", 1, geo.block, CHUNK, geo.slot_size, geo.per_stripe, epoch, stripe, geo.stripes, slab_id,
        digest, geo.data_off,
    )  # fmt: skip
    assert len(head) == 96
    return head + xxh(head)


def slot_header(key: bytes, payload: bytes, seq: int, digest: bytes) -> bytes:
    body = struct.pack("<4sHHIQQQ16s", b"ATKV", 1, 0, len(key), len(payload), xxhash.xxh3_64_intdigest(payload), seq,
                       digest) + key  # fmt: skip
    return body + xxh(body)


def journal_head(gen: int, slab_id: bytes) -> bytes:
    head = struct.pack("<8sIIQ16s", b"ATNVJRNL", 1, 0, gen, slab_id)
    return head + xxh(head)


def record(typ: int, key: bytes, slot: int, seq: int, csum: int) -> bytes:
    body = struct.pack("<BBHIQQ", typ, 0, len(key), slot, seq, csum) + key
    return body + xxh(body)


PUBLISH, EVICT = 1, 2


def checkpoint(gen: int, slab_id: bytes, n: int, lru: list[tuple[bytes, int]], seqs: dict[int, int],
               csums: dict[int, int]) -> bytes:  # fmt: skip
    keys = [b""] * n
    prev, nxt = [-1] * n, [-1] * n
    for i, (k, s) in enumerate(lru):
        keys[s] = k
        if i:
            prev[s] = lru[i - 1][1]
            nxt[lru[i - 1][1]] = s
    head_slot = lru[0][1] if lru else -1
    tail_slot = lru[-1][1] if lru else -1
    blob = b"".join(keys)
    body = struct.pack("<8sIIQ16sQqqQ", b"ATNVCKPT", 1, 0, gen, slab_id, n, head_slot, tail_slot, len(blob))
    body += array("H", map(len, keys)).tobytes() + blob  # host byte order, as documented
    body += array("i", prev).tobytes() + array("i", nxt).tobytes()
    body += array("Q", [seqs.get(s, 0) for s in range(n)]).tobytes()
    body += array("Q", [csums.get(s, 0) for s in range(n)]).tobytes()
    return body + xxh(body)


def block_size(d: Path) -> int:
    return max(512, os.statvfs(d).f_bsize)


@dataclass
class SlabSet:
    """What :func:`build` wrote, and what the tier should find there."""

    paths: list[Path]
    geo: Geometry
    data: dict[bytes, bytes]
    journal: Path
    journal_len: int  # up to the last whole record
    older: Path  # a generation older than the checkpoint's (when there is one)
    epoch: int


def build(tmp_path: Path, with_checkpoint: bool) -> SlabSet:
    """Two slabs of six slots each, eight chunks written, and an index on top (a checkpoint
    of generation 3 plus journal generation 3, or journal generation 1 alone) that publishes,
    evicts and republishes some of them and ends in a torn record."""
    rnd = random.Random(5)
    epoch, slab_id = 7, rnd.randbytes(16)
    digest = layout_digest(CHUNK, NAMESPACE)
    paths = [tmp_path / "a.slab", tmp_path / "b.slab"]
    geo = Geometry(block_size(tmp_path), stripes=2, per_stripe=6)
    data = {b"key-%d" % i: rnd.randbytes(CHUNK) for i in range(8)}
    slot_of = {b"key-%d" % i: s for i, s in enumerate([0, 1, 2, 3, 5, 8, 9, 11])}
    seq_of = {k: epoch << 32 | (i + 1) for i, k in enumerate(data)}

    slabs = [bytearray(geo.slab_bytes) for _ in paths]
    for i in range(2):
        sb = superblock(geo, i, epoch, slab_id, digest)
        slabs[i][: len(sb)] = sb
    for k, payload in data.items():
        stripe, off = geo.locate(slot_of[k])
        head = slot_header(k, payload, seq_of[k], digest)
        slabs[stripe][off : off + len(head)] = head
        slabs[stripe][off + geo.hdr_area : off + geo.hdr_area + CHUNK] = payload
    # key-7's slot rewritten since: the same key under another sequence number (a stale mapping)
    stripe, off = geo.locate(slot_of[b"key-7"])
    stale = slot_header(b"key-7", data[b"key-7"], seq_of[b"key-7"] + 1000, digest)
    slabs[stripe][off : off + len(stale)] = stale
    for p, raw in zip(paths, slabs):
        p.write_bytes(bytes(raw))

    def csum(k: bytes) -> int:
        return xxhash.xxh3_64_intdigest(data[k])

    def publish(k: bytes) -> bytes:
        return record(PUBLISH, k, slot_of[k], seq_of[k], csum(k))

    prefix = tmp_path / "a.slab.atidx"
    base_keys = [b"key-0", b"key-1", b"key-2", b"key-3", b"key-7"]  # least recently used first
    later = [publish(b"key-4"), publish(b"key-5")]
    later.append(record(EVICT, b"key-2", slot_of[b"key-2"], seq_of[b"key-2"], 0))  # removed
    later.append(record(EVICT, b"key-3", slot_of[b"key-3"], seq_of[b"key-3"] + 1, 0))  # another copy: kept
    later.append(publish(b"key-6"))
    later.append(record(EVICT, b"key-6", slot_of[b"key-6"], seq_of[b"key-6"], 0))  # stored, then removed
    later.append(publish(b"key-1"))  # published again: now the most recently used
    torn = publish(b"key-6")[:-3]  # cut by a crash
    older = Path(f"{prefix}.journal.00000002")
    if with_checkpoint:
        lru = [(k, slot_of[k]) for k in base_keys]
        ck = checkpoint(3, slab_id, geo.nslots, lru, {slot_of[k]: seq_of[k] for k in base_keys},
                        {slot_of[k]: csum(k) for k in base_keys})  # fmt: skip
        Path(f"{prefix}.ckpt").write_bytes(ck)
        older.write_bytes(journal_head(2, slab_id) + publish(b"key-6"))  # older than the checkpoint
        gen = 3
        journal = journal_head(gen, slab_id) + b"".join(later)
    else:
        gen = 1
        journal = journal_head(gen, slab_id) + b"".join(map(publish, base_keys)) + b"".join(later)
    journal_path = Path(f"{prefix}.journal.{gen:08d}")
    journal_path.write_bytes(journal + torn)
    return SlabSet(paths, geo, data, journal_path, len(journal), older, epoch)


def on_disk(built: SlabSet) -> tuple[int, bool, list[int]]:
    """The journal's length, whether the older generation is there, each superblock's epoch."""
    epochs = [struct.unpack_from("<Q", p.read_bytes()[:48], 40)[0] for p in built.paths]
    return built.journal.stat().st_size, built.older.exists(), epochs


@pytest.mark.parametrize("with_checkpoint", [True, False], ids=["checkpoint+journal", "journal-only"])
async def test_a_slab_set_built_from_the_documented_bytes_loads_back_exactly(
    tmp_path: Path, with_checkpoint: bool
) -> None:
    assert layout_digest(CHUNK, NAMESPACE) == OffloadingSpec(CHUNK, 1, namespace=NAMESPACE).layout_digest
    built = await asyncio.to_thread(build, tmp_path, with_checkpoint)
    geo, data = built.geo, built.data
    spec = OffloadingSpec(CHUNK, 8, namespace=NAMESPACE)
    view = aligned(spec.total_bytes)
    cfg = {"type": "nvme", "paths": [str(p) for p in built.paths], "capacity_bytes": 2 * geo.slab_bytes}
    tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
    assert isinstance(tier, NvmeTier)
    async with tier:
        assert tier.nslots == geo.nslots and tier.stored_size() == geo.slot_size
        expect = [b"key-0", b"key-3", b"key-7", b"key-4", b"key-5", b"key-1"]  # LRU order
        assert await tier.stored_keys() == expect
        assert tier.stats().extra["recovered_chunks"] == 6
        # the torn record was cut off, a generation older than the checkpoint's is gone, and
        # the epoch was bumped in every superblock before anything was written
        assert await asyncio.to_thread(on_disk, built) == (built.journal_len, False, [built.epoch + 1] * 2)
        good = [b"key-0", b"key-1", b"key-3", b"key-4", b"key-5"]
        res = await tier.load(good, list(range(5)))
        assert res.ok, res.failed
        assert [chunk_at(view, CHUNK, i) for i in range(5)] == [data[k] for k in good]
        res = await tier.load([b"key-7"], [5])  # its slot holds another write: a miss, not garbage
        assert not res.ok and await tier.lookup([b"key-7", b"key-2", b"key-6"]) == [False, False, False]
