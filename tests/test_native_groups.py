"""Group jobs of the native workers (``nativeio.GROUP``): several files read, written or
recycled by one worker in one slot, each as if alone, reported once; and the fs tier's
stores and loads that run as such jobs when a call has more chunks than its share of
``max_inflight``."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

import pytest

from asynctier.engines import native as nativeio
from asynctier.integrity import checksum

native_only = pytest.mark.skipif(nativeio.problem() is not None, reason=f"no native workers: {nativeio.problem()}")

HB = 64
N = 4096


Buf = ctypes.Array[ctypes.c_char]


def _read(dfd: int, name: bytes, hb: Buf, buf: Buf) -> nativeio.JobFields:
    return nativeio.fields(nativeio.READ, 0, dfd, name, flags=os.O_RDONLY, hb=ctypes.addressof(hb), hb_len=HB,
                           buf=ctypes.addressof(buf), n=N, hashed=True)  # fmt: skip


def _write(dfd: int, name: bytes, hb: Buf, buf: Buf) -> nativeio.JobFields:
    return nativeio.fields(nativeio.WRITE, 0, dfd, name, flags=os.O_WRONLY, hb=ctypes.addressof(hb), hb_len=HB,
                           buf=ctypes.addressof(buf), n=N)  # fmt: skip


@native_only
async def test_a_group_runs_each_job_as_if_alone_and_reports_each_outcome(tmp_path: Path) -> None:
    """Reads (hashed), writes (new files published by linkat) and a failing read in one
    group: each outcome is its own; a failure does not stop the jobs after it."""
    (tmp_path / "one").write_bytes(b"h" * HB + b"1" * N)
    (tmp_path / "two").write_bytes(b"h" * HB + b"2" * 100)  # short: read ends at EOF
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=2, bound=1, slots=2)
    pool.attach()
    hbs = [ctypes.create_string_buffer(HB) for _ in range(5)]
    bufs = [ctypes.create_string_buffer(N) for _ in range(5)]
    for i in (2, 4):
        hbs[i].raw = b"H" * HB
        bufs[i].raw = bytes([65 + i]) * N
    subs = [
        _read(dfd, b"one", hbs[0], bufs[0]),
        _read(dfd, b"missing", hbs[1], bufs[1]),
        _write(dfd, b"new-a", hbs[2], bufs[2]),
        _read(dfd, b"two", hbs[3], bufs[3]),
        _write(dfd, b"one", hbs[4], bufs[4]),  # the name is taken: reported, not overwritten
    ]
    try:
        res = await pool.run(1, nativeio.Job(-1, 0, *pool.group(1, 0, subs)))
        assert (res.result, res.stage) == (5, 0)
        out = pool.group_outcomes(1, 5)
        assert out[0] == (HB + N, checksum(b"1" * N), 0, 0)
        assert out[1][0] == -errno.ENOENT and out[1][2] == nativeio.ST_OPEN
        assert out[2][:1] == (HB + N,) and out[2][2:] == (0, 0)
        assert out[3][0] == HB + 100 and out[3][1] == 0 and out[3][2] == 0  # short: not hashed
        assert out[4][2:] == (0, 1)  # name taken (info 1), the file left as it was
        assert (tmp_path / "new-a").read_bytes() == b"H" * HB + b"C" * N
        assert (tmp_path / "one").read_bytes() == b"h" * HB + b"1" * N
        assert bufs[0].raw == b"1" * N
        assert pool.counts()[:2] == (0, 1)  # one token for the whole group
    finally:
        await pool.aclose()
        os.close(dfd)


@native_only
def test_a_group_out_of_bounds_is_refused() -> None:
    pool = nativeio.NativePool(threads=1, bound=1, slots=1)
    try:
        with pytest.raises(ValueError, match="1 to 16"):
            pool.group(0, 0, [])
        with pytest.raises(ValueError, match="1 to 16"):
            pool.group(0, 0, [nativeio.fields(nativeio.READ, 0, -1, b"x")] * (nativeio.GROUP_MAX + 1))
    finally:
        pool.abandon()


@native_only
async def test_the_workers_refuse_a_group_of_other_kinds(tmp_path: Path) -> None:
    """Only reads, writes and recycles go in a group (no unlinks, no nested groups)."""
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    pool = nativeio.NativePool(threads=1, bound=1, slots=1)
    pool.attach()
    try:
        bad = pool.group(0, 0, [nativeio.fields(nativeio.UNLINK, 0, dfd, b"x")])
        with pytest.raises(OSError, match="refused"):
            await pool.run(0, nativeio.Job(-1, 0, *bad))
    finally:
        await pool.aclose()
        os.close(dfd)
