"""The fs tier's per-chunk plan on the native engine: its C twins (asynctier/_speedups.c)
name files and pack headers as the Python reference does, and the fast recycling plan
(NativeIO.recycle_plan, no plan objects) is the job the protocol's plan describes."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.engines import native as nativeio
from asynctier.integrity import MAX_B32_KEY, pack_header
from asynctier.posix_io import aligned_buffer
from asynctier.tiers.fs import HEADER_BLOCK, FsTier, bulk, layout

CHUNK = 64 * 1024
native_only = pytest.mark.skipif(nativeio.problem() is not None, reason=f"no native workers: {nativeio.problem()}")


def _keys() -> list[bytes]:
    rng = random.Random(5)
    out = []
    for n in range(MAX_B32_KEY + 1):
        out += [bytes(n), b"\xff" * n, bytes(rng.getrandbits(8) for _ in range(n)), os.urandom(n)]
    return out + [b"k-%d" % i for i in range(200)]


def test_the_c_file_namer_agrees_with_python(speedups: Any) -> None:
    """Shard and file name of keys of 0 to 96 bytes: the same as layout.name_of (the files
    a tier wrote either way are found by the other); longer keys, named by a hash, and
    anything but bytes are refused, not named another way."""
    for key in _keys():
        assert speedups.name_of(key) == layout.name_of(key), key
    with pytest.raises(ValueError, match="at most 96 bytes"):
        speedups.name_of(bytes(MAX_B32_KEY + 1))
    for bad in ("key", bytearray(b"key"), memoryview(b"key"), None):
        with pytest.raises(TypeError, match="takes bytes"):
            speedups.name_of(bad)
    with pytest.raises(TypeError, match="address as an int"):
        speedups.use_xxh3("0x1234")


def test_the_c_header_packer_writes_what_pack_header_packs(speedups: Any) -> None:
    """The header in the block is pack_header's with a zero checksum, byte for byte; what a
    longer header left in the block's first ``used`` bytes is zeroed and nothing past it is
    touched (the block is written to the file whole)."""
    rng = random.Random(9)
    for key in [*_keys(), bytes(300), os.urandom(2000)]:
        digest = rng.randbytes(16)
        payload = rng.choice([0, 1, CHUNK, 2 << 20, (1 << 40) + 7])
        block = bytearray(b"\xee" * HEADER_BLOCK)
        used = rng.randrange(0, HEADER_BLOCK)
        size = speedups.pack_header_into(memoryview(block), used, key, payload, digest)
        want = pack_header(key, payload, 0, digest)
        assert size == len(want) and bytes(block[:size]) == want
        assert block[size:used] == bytes(max(0, used - size))
        assert block[max(size, used) :] == b"\xee" * (HEADER_BLOCK - max(size, used))
    block = bytearray(HEADER_BLOCK)
    with pytest.raises(ValueError, match="layout_digest is 16 bytes"):
        speedups.pack_header_into(memoryview(block), 0, b"k", 1, bytes(15))
    with pytest.raises(ValueError, match="in a 100-byte block"):
        speedups.pack_header_into(memoryview(bytearray(100)), 0, bytes(90), 1, bytes(16))
    with pytest.raises(BufferError, match="not writable"):
        speedups.pack_header_into(memoryview(bytes(HEADER_BLOCK)), 0, b"k", 1, bytes(16))
    with pytest.raises(TypeError, match="a key is bytes, not str"):
        speedups.pack_header_into(memoryview(block), 0, "k", 1, bytes(16))
    with pytest.raises(OverflowError):
        speedups.pack_header_into(memoryview(block), 0, b"k", -1, bytes(16))


def _tier(root: Path, **config: Any) -> tuple[FsTier, memoryview]:
    spec = OffloadingSpec(CHUNK, 8, namespace="test/fs-fast")
    view = aligned_buffer(spec.total_bytes)
    cfg = {"type": "fs", "root": str(root), "io_engine": "native", **config}
    tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
    assert isinstance(tier, FsTier)
    return tier, view


@native_only
@pytest.mark.parametrize("twins", ["c", "python"])
async def test_a_group_blocks_header_tail_is_zeroed_after_a_group_packer_wrote_it(tmp_path: Path, twins: str) -> None:
    """A header block after the slots' own: a lone plan's short header there (a group's chunk
    planned one by one), then a group packer's longer one (written whole, the block not marked
    again), then another short one: nothing of the longer header is left after it (the block
    is written to the file whole)."""
    tier, _view = _tier(tmp_path)
    async with tier:
        io = tier._native
        assert io is not None
        if twins == "python":
            io._pack_header_into = None
        else:
            pytest.importorskip("asynctier._speedups")
            assert io._pack_header_into is not None
        assert io._hb is not None
        digest = tier.offloading_spec.layout_digest
        block = io.block(0, 1)
        assert block >= io._slots
        io.new_header(block, b"s", CHUNK)
        bulk._put_block_header(io._hb, block, HEADER_BLOCK, b"L" * 90, CHUNK, digest)  # as pack_recycles writes it
        size = io.new_header(block, b"t", CHUNK)
        assert bytes(io.slot_hb[block][:size]) == pack_header(b"t", CHUNK, 0, digest)
        assert bytes(io.slot_hb[block][size:]) == bytes(HEADER_BLOCK - size)


@native_only
@pytest.mark.parametrize("twins", ["c", "python"])
async def test_the_fast_recycle_plan_is_the_protocols_plan(tmp_path: Path, twins: str) -> None:
    """recycle_plan's descriptor and header block are recycle_fields' of the protocol's own
    plan (given the same temporary name), for short keys and for long ones named by a hash;
    with the C twins and with their Python fallbacks."""
    tier, _view = _tier(tmp_path)
    async with tier:
        io = tier._native
        assert io is not None
        if twins == "python":
            io._name_of, io._pack_header_into = layout.name_of, None
        else:
            pytest.importorskip("asynctier._speedups")
            assert io._pack_header_into is not None
        proto = tier.protocol
        data = tier._chunk(3)
        addr = io._view_addr + 3 * CHUNK
        for key, victim in [(b"new", b"old"), (b"n" * 97, b"o"), (b"n", b"o" * 300), (bytes(96), b"\x00" * 96)]:
            io.slot_hb[0][:] = b"\xab" * HEADER_BLOCK  # an older header's bytes, to be zeroed
            io.slot_hb[1][:] = b"\xab" * HEADER_BLOCK
            io._hb_used[0] = io._hb_used[1] = HEADER_BLOCK
            fields, temp = io.recycle_plan(0, key, victim, io.direct_flags, addr, CHUNK)
            plan, sj = proto.recycle(key, victim, data, io.direct_flags, temp)
            want = io.recycle_fields(1, plan, sj, addr, CHUNK)
            hb = 10  # the field of the header block's address (each slot its own)
            assert fields[:hb] + fields[hb + 1 :] == want[:hb] + want[hb + 1 :], key
            assert fields[hb] + HEADER_BLOCK == want[hb]
            assert bytes(io.slot_hb[0]) == bytes(io.slot_hb[1])
            assert temp.startswith(layout.TMP_PREFIX)


@native_only
@pytest.mark.parametrize("twins", ["c", "python"])
async def test_stores_into_a_full_tier_recycle_and_read_back(tmp_path: Path, twins: str) -> None:
    """A full tier's steady state over the fast path: each store recycles its victim's file
    (counted), and every chunk stored last reads back intact; with either twins."""
    per = HEADER_BLOCK + CHUNK
    tier, view = _tier(tmp_path, capacity_bytes=4 * per)
    rng = random.Random(3)
    async with tier:
        if twins == "python":
            assert tier._native is not None
            tier._native._name_of, tier._native._pack_header_into = layout.name_of, None
        for round_ in range(4):
            data = [rng.randbytes(CHUNK) for _ in range(4)]
            for i, d in enumerate(data):
                view[i * CHUNK : (i + 1) * CHUNK] = d
            keys = [b"r%d-%d" % (round_, i) for i in range(4)]
            assert (await tier.offload(keys, list(range(4)))).ok
            view[: 8 * CHUNK] = bytes(8 * CHUNK)
            res = await tier.load(keys, list(range(4, 8)))
            assert res.ok, res.failed
            assert [bytes(view[(4 + i) * CHUNK : (5 + i) * CHUNK]) for i in range(4)] == data
        st = tier.stats()
        assert st.evictions == 12 and st.extra.get("recycled") == 12, st.extra
