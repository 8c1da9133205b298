"""The C twins of the nvme and fs tiers' per-chunk helpers (asynctier/_speedups.c) give what
their Python references give, byte for byte, refuse what those refuse without writing a byte,
and the nvme tier stores, loads and reopens the same with either set."""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path
from typing import Any

import pytest
from fs_helpers import chunk_file, damage_file
from nvme_helpers import chunk_at, fill, make

from asynctier import integrity
from asynctier.engines import native as nativeio
from asynctier.engines.speedups import speedups as bound_twins
from asynctier.integrity import MAX_B32_KEY, pack_header
from asynctier.tiers.fs import bulk, layout
from asynctier.tiers.fs import native as fs_native
from asynctier.tiers.fs.layout import N_SHARDS
from asynctier.tiers.nvme import bulk as nvme_bulk
from asynctier.tiers.nvme import catalog, fast, stores
from asynctier.tiers.nvme.format import EVICT, PUBLISH, _pack_records

native_only = pytest.mark.skipif(nativeio.problem() is not None, reason=f"no native workers: {nativeio.problem()}")
U64 = (1 << 64) - 1


def _twin_buffers(rng: random.Random, n: int) -> list[bytearray]:
    """Two buffers of the same ``n`` random bytes: one for the C twin, one for its reference."""
    first = bytearray(rng.randbytes(n))
    return [first, bytearray(first)]


def _keys(rng: random.Random) -> list[bytes]:
    return [rng.randbytes(n) for n in (0, 1, 7, 32, 96, 97, 200, 400, 600)] + [b"k-%d" % i for i in range(20)]


def test_a_runs_headers_are_pack_headers_bytes() -> None:
    """Each header at its block, as pack_header packs it with a zero checksum; nothing else in
    the buffer touched; the size returned is the last header's (0 for none). (The reference of
    the headers ``pack_slot_writes`` packs: tests/test_c_twins_nvme.py.)"""
    rng = random.Random(1)
    stride = 1024
    for _ in range(30):
        keys = rng.sample(_keys(rng), rng.randrange(0, 8))
        seqs = [rng.choice([0, 1, U64, rng.getrandbits(64)]) for _ in keys]
        payload, digest, start = rng.choice([0, 4096, 1 << 40]), rng.randbytes(16), rng.randrange(0, 4)
        buf, before = _twin_buffers(rng, stride * 12)
        got = integrity.pack_headers_into(buf, start, stride, keys, payload, digest, seqs)
        for j, (key, seq) in enumerate(zip(keys, seqs)):
            head = pack_header(key, payload, 0, digest, seq)
            at = (start + j) * stride
            assert buf[at : at + len(head)] == head
            before[at : at + len(head)] = head
        assert buf == before
        assert got == (len(pack_header(keys[-1], 0, 0, digest)) if keys else 0)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"keys": [b"a", b"b"], "seqs": [1]}, ValueError),  # not one seq a key
        ({"keys": [b"a", bytes(1000)], "seqs": [1, 2]}, ValueError),  # a header longer than its block
        ({"keys": [b"a", b"b"], "seqs": [1, 2], "start": 7}, ValueError),  # past the buffer's end
        ({"keys": [b"a", "b"], "seqs": [1, 2]}, TypeError),  # a key that is not bytes
        ({"keys": [b"a", b"b"], "seqs": [1, -1]}, (OverflowError, struct.error)),  # a seq below 0
        ({"keys": [b"a", b"b"], "seqs": [1, 1 << 64]}, (OverflowError, struct.error)),  # or above 2**64 - 1
    ],
)
def test_a_runs_headers_refused_leave_the_buffer_as_it_was(args: dict[str, Any], error: Any) -> None:
    stride = 512
    buf = bytearray(b"\xee" * (stride * 8))
    with pytest.raises(error):
        integrity.pack_headers_into(memoryview(buf), args.get("start", 0), stride, args["keys"], 4096, bytes(16),
                                    args["seqs"])  # fmt: skip
    assert buf == b"\xee" * (stride * 8)


def test_a_header_matches_as_the_python_check_says(speedups: Any) -> None:
    """True for the very header (any bytes after it), False for a byte changed anywhere in it,
    a field that differs, or a buffer cut short; from bytes, bytearrays and memoryviews."""
    rng = random.Random(2)
    for key in _keys(rng):
        payload, csum, seq, digest = rng.getrandbits(40), rng.getrandbits(64), rng.getrandbits(64), rng.randbytes(16)
        head = pack_header(key, payload, csum, digest, seq)
        bufs: list[Any] = [head, head + rng.randbytes(50), bytearray(head), memoryview(head + b"\0" * 9)]
        for buf in bufs:
            assert speedups.header_matches(buf, key, payload, csum, digest, seq)
            assert integrity.header_matches(buf, key, payload, csum, digest, seq)
        for at in (0, 5, 12, 20, 28, 40, len(head) - 9, len(head) - 1):
            bad = bytearray(head)
            bad[at] ^= 0x10
            assert not speedups.header_matches(bad, key, payload, csum, digest, seq)
            assert not integrity.header_matches(bad, key, payload, csum, digest, seq)
        cases = [(payload + 1, csum, seq), (payload, csum ^ 1, seq), (payload, csum, seq ^ 1)]
        for p, c, s in cases:
            assert not speedups.header_matches(head, key, p, c, digest, s)
        assert not speedups.header_matches(head[:-1], key, payload, csum, digest, seq)
        assert not speedups.header_matches(head, key + b"x", payload, csum, digest, seq)
    with pytest.raises(TypeError, match="a key is bytes"):
        speedups.header_matches(b"", "k", 1, 0, bytes(16), 0)
    with pytest.raises(OverflowError):
        speedups.header_matches(b"", b"k", 1, -1, bytes(16), 0)


def test_journal_records_are_the_python_records(speedups: Any) -> None:
    """The same bytes for every (key, slot, seq, csum), at the limits of each field; a field past
    its limit refused by both."""
    rng = random.Random(3)
    items = [
        (rng.randbytes(rng.choice([1, 32, 300, 65535])), rng.choice([0, 5, (1 << 32) - 1]), rng.getrandbits(64),
         rng.choice([0, U64, rng.getrandbits(64)]))
        for _ in range(40)
    ]  # fmt: skip
    for typ in (PUBLISH, EVICT):
        assert speedups.pack_records(typ, items) == _pack_records(typ, items)
        assert speedups.pack_records(typ, tuple(items[:3])) == _pack_records(typ, items[:3])
    assert speedups.pack_records(PUBLISH, []) == []
    for bad in [(bytes(65536), 1, 1, 1), (b"k", 1 << 32, 1, 1), (b"k", 1, -1, 1), (b"k", 1, 1, 1 << 64)]:
        with pytest.raises((ValueError, OverflowError)):
            speedups.pack_records(PUBLISH, [bad])
        with pytest.raises(struct.error):
            _pack_records(PUBLISH, [bad])
    with pytest.raises(TypeError, match="a key is bytes"):
        speedups.pack_records(PUBLISH, [("k", 1, 1, 1)])
    with pytest.raises(TypeError, match=r"\(key, slot, seq, csum\) tuple"):
        speedups.pack_records(PUBLISH, [(b"k", 1, 1)])
    with pytest.raises(ValueError, match="0 to 255"):
        speedups.pack_records(256, [])


@native_only
@pytest.mark.parametrize("twins", ["c", "python"])
async def test_the_nvme_tier_stores_loads_and_reopens_with_either_twins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, twins: str
) -> None:
    """Stores into a slab that evicts, loads, a reopen that replays the journal: every byte
    back, the same with the Python references in place of the C twins (a build without a
    compiler); a slot whose header was rewritten is not loaded."""
    if twins == "python":
        monkeypatch.setattr(stores, "_ops", nvme_bulk)
        monkeypatch.setattr(fast, "_ops", nvme_bulk)
        monkeypatch.setattr(catalog, "_bulk", nvme_bulk)
        monkeypatch.setattr(fast, "header_matches", integrity.header_matches)
        monkeypatch.setattr(catalog, "pack_records", _pack_records)
    elif bound_twins() is None:
        pytest.skip("asynctier._speedups not built")
    chunk, path = 4096, tmp_path / "t.slab"
    tier, view = make(path, chunk=chunk, nchunks=48, slots=32, io_engine="native")
    async with tier:
        data = fill(view, chunk, 4)
        for c in range(0, 48, 12):  # 48 keys into 32 slots: the first ones evicted
            assert (await tier.offload([b"k%d" % i for i in range(c, c + 12)], list(range(c, c + 12)))).ok
        keys = [b"k%d" % i for i in range(24, 48)]
        view[:] = bytes(view.nbytes)
        res = await tier.load(keys, list(range(24)))
        assert res.ok, res.failed
        assert [chunk_at(view, chunk, i) for i in range(24)] == data[24:48]
        assert tier.stats().extra.get("native_retries", 0) == 0
    tier, view = make(path, chunk=chunk, nchunks=48, slots=32, io_engine="native")
    async with tier:
        res = await tier.load(keys, list(range(24)))
        assert res.ok, res.failed
        assert [chunk_at(view, chunk, i) for i in range(24)] == data[24:48]
        cat, geo = tier._catalog, tier._slabs.geo
        assert cat is not None and geo is not None
        _, off = geo.locate(cat.index.entries[keys[0]])
        fd = os.open(path, os.O_RDWR)
        try:  # the header of another key, a valid one, in keys[0]'s slot
            os.pwrite(fd, pack_header(b"other", chunk, 0, tier.offloading_spec.layout_digest, 1), off)
        finally:
            os.close(fd)
        res = await tier.load(keys[:2], [0, 1])
        assert keys[0] in res.failed and keys[1] not in res.failed


def _read_args(rng: random.Random, keys: list[bytes], table: bytearray, offset: int) -> tuple[Any, ...]:
    m = len(keys)
    cids, blocks = rng.sample(range(1000), m), rng.sample(range(1000), m)
    dfds = [rng.randrange(0, 1 << 31) for _ in range(N_SHARDS)]
    return (table, offset, rng.randrange(4), keys, cids, blocks, dfds, rng.getrandbits(31), rng.randrange(2),
            rng.getrandbits(47), 4096, rng.getrandbits(47), rng.choice([4096, 1 << 20]))  # fmt: skip


def test_a_groups_read_descriptors_are_the_python_descriptors(speedups: Any) -> None:
    """Each key's READ descriptor, byte for byte as the Python twin packs it (names by name_of,
    its shard's directory), at its place in the table and nothing else touched."""
    rng = random.Random(4)
    size = nativeio.JOB_LAYOUT.size
    for _ in range(30):
        keys = rng.sample([k for k in _keys(rng) if 0 < len(k) <= MAX_B32_KEY], rng.randrange(0, 17))
        offset = size * rng.randrange(0, 3)
        tables = _twin_buffers(rng, size * 20)
        args = _read_args(rng, keys, tables[0], offset)
        speedups.pack_reads(*args)
        bulk.pack_reads(tables[1], *args[1:])
        assert tables[0] == tables[1]
        for j, key in enumerate(keys):
            job = nativeio.Job.from_buffer_copy(bytes(tables[0][offset + j * size : offset + (j + 1) * size]))
            shard, name = layout.name_of(key)
            assert (job.kind, job.dfd, job.name, job.group) == (nativeio.READ, args[6][shard], name, -1)
            assert job.buf == args[11] + args[4][j] * args[12] and job.hb == args[9] + args[5][j] * 4096


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"keys": [b"a", bytes(97)]}, ValueError),  # a key longer than name_of names
        ({"keys": [b"a", b""]}, ValueError),  # or empty
        ({"keys": [b"a", "b"]}, TypeError),  # not bytes
        ({"cids": [1]}, ValueError),  # not one cid a key
        ({"cids": [1, -1]}, OverflowError),  # a cid below 0
        ({"dfds": [3] * 255}, ValueError),  # not one directory a shard
        ({"dfds": [1 << 31 if i == layout.shard_of(b"b") else 3 for i in range(256)]}, ValueError),  # a key's
        # shard's directory past int32 (only the shards a group uses are looked at)
        ({"offset": 856 * 19}, ValueError),  # past the table's end
        ({"flags": 1 << 40}, ValueError),
    ],
)
def test_read_descriptors_refused_leave_the_table_as_it_was(speedups: Any, change: dict[str, Any], error: Any) -> None:
    table = bytearray(b"\xee" * (856 * 20))
    args = dict(zip(
        ("table", "offset", "prio", "keys", "cids", "blocks", "dfds", "flags", "hashed", "hb_addr", "hb_len",
         "view_addr", "n"),
        (table, 0, 2, [b"a", b"b"], [1, 2], [3, 4], [3] * 256, 0, 1, 4096, 4096, 1 << 20, 4096),
    ))  # fmt: skip
    with pytest.raises(BufferError, match="not writable"):
        speedups.pack_reads(bytes(856 * 4), *list(args.values())[1:])
    args.update(change)
    with pytest.raises(error):
        speedups.pack_reads(*args.values())
    assert table == b"\xee" * (856 * 20)


def test_reads_failed_finds_the_reads_the_python_check_finds(speedups: Any) -> None:
    """A read that failed, came short, or brought a header other than its key's with the
    checksum read (a key, a checksum, a length that differs) is named by both twins; the others
    by neither."""
    rng = random.Random(5)
    hb_len, n, digest = 512, 1 << 16, rng.randbytes(16)
    for _ in range(30):
        keys = rng.sample(_keys(rng), rng.randrange(0, 16))
        blocks = rng.sample(range(40), len(keys))
        hbs = bytearray(rng.randbytes(hb_len * 40))
        res = bytearray(nativeio.RESULT_LAYOUT.size * 20)
        offset = nativeio.RESULT_LAYOUT.size * rng.randrange(0, 4)
        want: list[int] = []
        for j, (key, block) in enumerate(zip(keys, blocks)):
            csum, result, stage = rng.getrandbits(64), hb_len + n, 0
            head = pack_header(key, n, csum, digest)
            how = rng.choice(["ok", "ok", "ok", "stage", "short", "csum", "key", "flip"])
            if how == "stage":
                stage, result = 2, -5
            elif how == "short":
                result -= 1
            elif how == "csum":
                head = pack_header(key, n, csum ^ 1, digest)
            elif how == "key":
                head = pack_header(key + b"x", n, csum, digest)
            elif how == "flip":
                head = bytes([head[0] ^ 1]) + head[1:]
            if len(head) > hb_len:
                head, how = head[:hb_len], "long"  # a key whose header does not fit a block: bad
            hbs[block * hb_len : block * hb_len + len(head)] = head
            nativeio.RESULT_LAYOUT.pack_into(res, offset + j * 24, result, csum, stage, 0)
            if how != "ok":
                want.append(j)
        if any(len(pack_header(k, n, 0, digest)) > hb_len for k in keys):
            with pytest.raises(ValueError, match="does not fit"):
                speedups.reads_failed(memoryview(res), offset, keys, blocks, memoryview(hbs), hb_len, n, digest)
            continue
        got = speedups.reads_failed(memoryview(res), offset, keys, blocks, memoryview(hbs), hb_len, n, digest)
        ref = bulk.reads_failed(memoryview(res), offset, keys, blocks, memoryview(hbs), hb_len, n, digest)
        assert got == ref == want
    with pytest.raises(ValueError, match="outcomes at offset"):
        speedups.reads_failed(bytes(48), 24, [b"a", b"b"], [0, 1], bytes(1024), 512, 1, digest)
    with pytest.raises(ValueError, match="does not fit block 2"):
        speedups.reads_failed(bytes(48), 0, [b"a", b"b"], [0, 2], bytes(1024), 512, 1, digest)


def test_a_groups_recycling_stores_are_the_python_ones(speedups: Any) -> None:
    """Each store's header (the rest of its block zeroed) and RECYCLE descriptor, byte for
    byte as the Python twin writes them, at their places and nothing else touched."""
    rng = random.Random(6)
    size, hb_len = nativeio.JOB_LAYOUT.size, 512
    names = [k for k in _keys(rng) if 0 < len(k) <= MAX_B32_KEY]
    for _ in range(30):
        m = rng.randrange(0, 17)
        keys, victims = rng.sample(names, m), rng.sample(names, m)
        temps = [f".tmp~h~{rng.randrange(1 << 20)}~{'x' * rng.randrange(0, 60)}" for _ in range(m)]
        cids, blocks = rng.sample(range(1000), m), rng.sample(range(40), m)
        dfds = [rng.randrange(0, 1 << 31) for _ in range(N_SHARDS)]
        offset = size * rng.randrange(0, 3)
        tables = _twin_buffers(rng, size * 20)
        hbs = _twin_buffers(rng, hb_len * 40)
        mode = rng.choice([0o600, 0o640, 0o644])
        rest = (rng.randrange(4), keys, victims, temps, cids, blocks, dfds, rng.getrandbits(31), rng.randrange(-1, 99),
                rng.randrange(2), mode)  # fmt: skip
        tail = (rng.getrandbits(47), hb_len, rng.getrandbits(47), rng.choice([4096, 1 << 20]), rng.randbytes(16))
        speedups.pack_recycles(tables[0], offset, *rest, memoryview(hbs[0]), *tail)
        bulk.pack_recycles(tables[1], offset, *rest, memoryview(hbs[1]), *tail)
        assert tables[0] == tables[1] and hbs[0] == hbs[1]
        for j, key in enumerate(keys):
            job = nativeio.Job.from_buffer_copy(bytes(tables[0][offset + j * size : offset + (j + 1) * size]))
            head = pack_header(key, tail[3], 0, tail[4])
            assert job.mode == mode  # the taken file's permission bits (tiers/fs: file_mode)
            at = blocks[j] * hb_len
            assert hbs[0][at : at + hb_len] == head + bytes(hb_len - len(head))
            assert (job.kind, job.name, job.name2, job.name3) == (
                nativeio.RECYCLE, layout.name_of(key)[1], layout.name_of(victims[j])[1], temps[j].encode()
            )  # fmt: skip
            assert (job.dfd, job.dfd2, job.body_len) == (dfds[layout.shard_of(key)], dfds[layout.shard_of(victims[j])],
                                                         len(head) - 8)  # fmt: skip


def test_a_groups_new_file_stores_are_the_python_ones(speedups: Any) -> None:
    """Each store's header (the rest of its block zeroed) and WRITE descriptor, byte for byte
    as the Python twin writes them, at their places and nothing else touched."""
    rng = random.Random(8)
    size, hb_len = nativeio.JOB_LAYOUT.size, 512
    names = [k for k in _keys(rng) if 0 < len(k) <= MAX_B32_KEY]
    for _ in range(30):
        m = rng.randrange(0, 17)
        keys, fds = rng.sample(names, m), [rng.choice([-1, rng.randrange(1 << 20)]) for _ in range(m)]
        cids, blocks = rng.sample(range(1000), m), rng.sample(range(40), m)
        dfds = [rng.randrange(0, 1 << 31) for _ in range(N_SHARDS)]
        offset = size * rng.randrange(0, 3)
        tables = _twin_buffers(rng, size * 20)
        hbs = _twin_buffers(rng, hb_len * 40)
        rest = (rng.randrange(4), keys, cids, blocks, fds, dfds, rng.getrandbits(31), rng.randrange(2),
                rng.choice([0o644, 0o600 | nativeio.MODE_FIX]))  # fmt: skip
        tail = (rng.getrandbits(47), hb_len, rng.getrandbits(47), rng.choice([4096, 1 << 20]), rng.randbytes(16))
        speedups.pack_writes(tables[0], offset, *rest, memoryview(hbs[0]), *tail)
        bulk.pack_writes(tables[1], offset, *rest, memoryview(hbs[1]), *tail)
        assert tables[0] == tables[1] and hbs[0] == hbs[1]
        for j, key in enumerate(keys):
            job = nativeio.Job.from_buffer_copy(bytes(tables[0][offset + j * size : offset + (j + 1) * size]))
            head = pack_header(key, tail[3], 0, tail[4])
            assert (job.kind, job.fd, job.dfd2, job.name, job.name2) == (nativeio.WRITE, fds[j], -1,
                                                                          layout.name_of(key)[1], b"")  # fmt: skip
            assert (job.dfd, job.body_len, job.mode) == (dfds[layout.shard_of(key)], len(head) - 8, rest[-1])
    table = bytearray(b"\xee" * (size * 4))
    for bad, error in [({"fds": [1 << 31]}, ValueError), ({"keys": [bytes(97)]}, ValueError),
                       ({"blocks": [99]}, ValueError), ({"dfds": [1] * 3}, ValueError)]:  # fmt: skip
        args = {"table": table, "offset": 0, "prio": 1, "keys": [b"a"], "cids": [0], "blocks": [0], "fds": [-1],
                "dfds": [3] * 256, "flags": 1, "sync": 0, "mode": 0o644, "hbs": bytearray(hb_len * 4),
                "hb_addr": 0, "hb_len": hb_len, "view_addr": 0, "n": 4096, "layout_digest": bytes(16)}  # fmt: skip
        args.update(bad)
        with pytest.raises(error):
            speedups.pack_writes(*args.values())
        assert table == b"\xee" * (size * 4) and args["hbs"] == bytes(hb_len * 4)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"victims": [b"v", bytes(97)]}, ValueError),  # a victim longer than name_of names
        ({"temps": ["t1", "t" * 256]}, ValueError),  # a temporary name too long for its field
        ({"temps": ["t1", "\u00e9"]}, ValueError),  # or not ASCII
        ({"temps": ["t1", b"t2"]}, ValueError),  # or not a str
        ({"keys": [b"a", bytes(90)], "hb_len": 128}, ValueError),  # a header longer than its block
        ({"blocks": [0, 8]}, ValueError),  # a block past the header blocks' end
        ({"cids": [1]}, ValueError),  # not one cid a key
        ({"lock_fd": 1 << 31}, ValueError),
    ],
)
def test_recycling_stores_refused_leave_table_and_blocks_as_they_were(
    speedups: Any, change: dict[str, Any], error: Any
) -> None:
    table, hbs = bytearray(b"\xee" * (856 * 4)), bytearray(b"\xdd" * (512 * 8))
    args = {"table": table, "offset": 0, "prio": 3, "keys": [b"a", b"b"], "victims": [b"v", b"w"],
            "temps": ["t1", "t2"], "cids": [1, 2], "blocks": [0, 1], "dfds": [3] * 256, "flags": 1, "lock_fd": 9,
            "sync": 0, "mode": 0o600, "hbs": hbs, "hb_addr": 4096, "hb_len": 512, "view_addr": 8192, "n": 4096,
            "layout_digest": bytes(16)}  # fmt: skip
    speedups.pack_recycles(*args.values())  # as given: fine
    table[:], hbs[:] = b"\xee" * len(table), b"\xdd" * len(hbs)
    args.update(change)
    with pytest.raises(error):
        speedups.pack_recycles(*args.values())
    assert table == b"\xee" * (856 * 4) and hbs == b"\xdd" * (512 * 8)


def test_jobs_failed_names_the_jobs_that_did_not_simply_succeed(speedups: Any) -> None:
    rng = random.Random(7)
    for _ in range(20):
        m, offset = rng.randrange(0, 17), 24 * rng.randrange(0, 4)
        res = bytearray(24 * 20)
        ends = [(rng.choice([0, 0, 0, 1, 2, 7]), rng.choice([0, 0, 0, 1])) for _ in range(m)]
        for j, (stage, info) in enumerate(ends):
            nativeio.RESULT_LAYOUT.pack_into(
                res, offset + 24 * j, rng.randrange(-5, 9), rng.getrandbits(64), stage, info
            )
        want = [j for j, (stage, info) in enumerate(ends) if stage or info]  # a failed step, or a name taken
        assert speedups.jobs_failed(memoryview(res), offset, m) == bulk.jobs_failed(memoryview(res), offset, m) == want
    with pytest.raises(ValueError, match="outcomes at offset"):
        speedups.jobs_failed(bytes(48), 24, 2)


@native_only
@pytest.mark.parametrize("twins", ["c", "python"])
async def test_the_fs_tier_loads_and_recycles_groups_with_either_twins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, twins: str
) -> None:
    """Group loads planned and checked by either twin: every byte back, a damaged file and a
    missing one failing alone. Then a group of stores into the full tier, two into room and
    six each into a victim's file: every key loads its bytes, before and after a reopen."""
    from asynctier import IntegrityError, OffloadingSpec, SecondaryTierFactory
    from asynctier.posix_io import aligned_buffer
    from asynctier.tiers.fs import HEADER_BLOCK

    if twins == "python":
        monkeypatch.setattr(fs_native.NativeIO, "start", _python_twins(fs_native.NativeIO.start))
    elif bound_twins() is None:
        pytest.skip("asynctier._speedups not built")
    spec = OffloadingSpec(4096, 16, namespace="test/twins")
    view = aligned_buffer(spec.total_bytes)
    config = {"type": "fs", "root": str(tmp_path), "io_engine": "native", "max_inflight": 1,
              "capacity_bytes": 9 * (HEADER_BLOCK + 4096)}  # fmt: skip
    tier = SecondaryTierFactory.create_secondary_tier(config, view, spec)
    keys = [b"k%d" % i for i in range(8)] + [bytes(200)]  # the last one named by a hash, in Python
    async with tier:
        view[:] = os.urandom(len(view))
        data = bytes(view)
        assert (await tier.offload(keys, list(range(9)))).ok
        damage_file(chunk_file(tier, b"k3"), "flip")
        chunk_file(tier, b"k5").unlink()
        view[:] = bytes(len(view))
        res = await tier.load(keys, list(range(9)))
        assert sorted(res.failed) == [b"k3", b"k5"] and isinstance(res.failed[b"k3"], IntegrityError)
        for i in (0, 1, 2, 4, 6, 7, 8):
            assert bytes(view[i * 4096 : (i + 1) * 4096]) == data[i * 4096 : (i + 1) * 4096]
        view[:] = data
        new = [b"n%d" % i for i in range(7)] + [bytes(150)]
        assert (await tier.offload(new, list(range(8, 16)))).ok
        s = tier.stats()
        assert (s.evictions, s.extra.get("recycled"), s.stored_chunks) == (6, 6, 9), s.extra
        view[: 8 * 4096] = bytes(8 * 4096)
        assert (await tier.load(new, list(range(8)))).ok
        assert bytes(view[: 8 * 4096]) == data[8 * 4096 :]
    tier = SecondaryTierFactory.create_secondary_tier(config, view, spec)
    async with tier:
        view[:] = bytes(len(view))
        assert (await tier.load(new, list(range(8)))).ok
        assert bytes(view[: 8 * 4096]) == data[8 * 4096 :]
        held = await tier.stored_keys()
        assert len(held) == 9 and set(new) <= set(held)  # no victim's file or temporary name left
        assert sorted(p.name for p in tier.dir.glob("??/*")) == sorted(layout.name_of(k)[1].decode() for k in held)


def _python_twins(start: Any) -> Any:
    def patched(io: fs_native.NativeIO) -> None:
        start(io)
        io._pack_reads, io._reads_failed = bulk.pack_reads, bulk.reads_failed
        io._pack_recycles, io._jobs_failed = bulk.pack_recycles, bulk.jobs_failed
        io.split_plain = bulk.split_plain

    return patched


def test_a_group_of_stores_is_split_as_the_python_split_says(speedups: Any) -> None:
    """split_plain from random reservations (no victim, one, two; a key stored already, an
    error; reservations of other types) under each setting of the tier's two flags."""
    rng = random.Random(7)
    kinds: list[Any] = [[], [b"v1"], [b"v1", b"v2"], None, CapacityErrorLike(), ("v",), [b"v3"]]
    for _ in range(300):
        m = rng.randrange(0, 10)
        keys = [b"k%d" % rng.randrange(1000) for _ in range(m)]
        cids = [rng.randrange(64) for _ in range(m)]
        reserved = [rng.choice(kinds) for _ in range(m)]
        for tmpfile in (False, True):
            for recycle in (False, True):
                got = speedups.split_plain(keys, cids, reserved, tmpfile, recycle)
                assert got == bulk.split_plain(keys, cids, reserved, tmpfile, recycle)
                rec, new, others = got[:3]
                assert sorted(rec + new + others) == list(range(m))
    with pytest.raises(ValueError, match="1 keys, 0 cids and 1 reservations"):
        speedups.split_plain([b"k"], [], [[]], True, True)
    with pytest.raises(TypeError, match="takes 5 arguments"):
        speedups.split_plain([b"k"], [0], [[]], True)


class CapacityErrorLike(Exception):
    pass


PLAIN_KEYS = [[b"a"], [], [b""], ["a"], [b"a" * 1025], [b"a" * 1024, b"b"], [bytearray(b"a")], [b"a", None], [b"x"] * 3]
PLAIN_IDS = [[0], [], [-1], [5], [4], [True], [1.0], [2**70], [-(2**70)], [0, 4, 3], [3, 3], [0, "1"]]


def test_a_calls_plain_keys_and_ids_are_what_the_references_say() -> None:
    from asynctier.core import validation

    c = pytest.importorskip("asynctier._speedups")
    for keys in PLAIN_KEYS:
        assert c.plain_keys(keys, 1024) is validation.plain_keys(keys, 1024), keys
    for ids in PLAIN_IDS:
        assert c.plain_ids(ids, 5) is validation.plain_ids(ids, 5), ids
    with pytest.raises(TypeError, match="keys is a list"):
        c.plain_keys((b"a",), 1024)
    with pytest.raises(TypeError, match="ids is a list"):
        c.plain_ids((0,), 5)


@pytest.mark.parametrize("twins", ["c", "python"])
def test_a_calls_checks_give_the_same_errors_with_either_twins(monkeypatch: pytest.MonkeyPatch, twins: str) -> None:
    from asynctier import OffloadingSpec
    from asynctier.core import validation

    if twins == "python":
        monkeypatch.setattr(validation, "_plain_keys", validation.plain_keys)
        monkeypatch.setattr(validation, "_plain_ids", validation.plain_ids)
    spec = OffloadingSpec(4096, 5)
    view = memoryview(bytearray(spec.total_bytes))
    assert validation.check_pairs(spec, view, (b"a", b"b"), (0, 4), load=True) == ([b"a", b"b"], [0, 4])
    bad: list[tuple[Any, Any, type[Exception], str]] = [
        ([b"a", b"a"], [0, 1], ValueError, "distinct"),
        ([b"a", "b"], [0, 1], TypeError, "each key must be bytes"),
        ([b""], [0], ValueError, "1..1024 bytes"),
        ([b"a"], [5], IndexError, "out of range"),
        ([b"a"], [True], TypeError, "chunk id must be an int"),
        ([b"a", b"b"], [1, 1], ValueError, "distinct within one load"),
    ]
    for keys, ids, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            validation.check_pairs(spec, view, keys, ids, load=True)
