"""Bench helpers that the figures depend on: waiting for the device before a measurement."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asynctier.cli import benchkit


def test_settle_waits_for_a_quiet_device_after_deletions(disk_tmp_path: Path) -> None:
    tmp_path = disk_tmp_path  # a block device's statistics: not the suite's tmpfs
    stat = benchkit._device_stat(tmp_path)
    if stat is None:
        pytest.skip(f"{tmp_path} is not on a block device")
    (tmp_path / "f").write_bytes(os.urandom(1 << 20))
    os.unlink(tmp_path / "f")
    waited = benchkit.settle(tmp_path, quiet_s=0.1, limit_s=5.0)
    assert 0.1 <= waited <= 5.0 + 1.0  # at least one quiet window observed, never past the limit (+ one poll)
    fields = stat.read_text().split()
    assert len(fields) >= 11, "the block layer's stat file has the fields settle reads"


def test_settle_on_a_file_system_without_a_device_only_flushes() -> None:
    if not os.path.isdir("/dev/shm") or benchkit._device_stat("/dev/shm") is not None:
        pytest.skip("no device-less tmpfs at /dev/shm")
    assert benchkit.settle("/dev/shm", quiet_s=10.0) < 10.0


def test_bare_file_per_chunk_writes_named_files_and_reads_them_back(tmp_path: Path) -> None:
    from asynctier.posix_io import aligned_buffer

    chunk, n = 8192, 12
    src = aligned_buffer(chunk * n)
    src[:] = os.urandom(chunk * n)
    rate = benchkit.bare_file_per_chunk(tmp_path, src, chunk, n, depth=3, mode="write", shards=4)
    assert rate > 0
    files = sorted(p for p in tmp_path.rglob("bare-*"))
    assert len(files) == n and all(p.stat().st_size == 4096 + chunk for p in files)
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.startswith("bare-")]
    dst = aligned_buffer(chunk * n)
    benchkit.bare_file_per_chunk(tmp_path, dst, chunk, n, depth=3, mode="read", shards=4)
    assert bytes(dst) == bytes(src)
    with pytest.raises(ValueError, match="mode"):
        benchkit.bare_file_per_chunk(tmp_path, dst, chunk, n, depth=1, mode="append")


@pytest.mark.skipif(not benchkit.fio_available(), reason="fio is not installed")
def test_run_fio_writes_its_own_files_whatever_the_cwd_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # fio takes the job name as the file name when a non-file of that name is in its cwd
    # (the package directory, run from the repository root): each run then overwrote one
    # file that the cleanup never removed, and fio's write figures were of a warm file
    (tmp_path / "asynctier").mkdir()
    monkeypatch.chdir(tmp_path)
    work = tmp_path / "fio"
    for engine in ("psync", "io_uring"):
        try:
            r = benchkit.run_fio(work, rw="write", bs=65536, iodepth=2, size=1 << 20, ioengine=engine, direct=False)
        except Exception:  # an engine this kernel or fio lacks
            continue
        assert r.bytes_per_s > 0
        assert sorted(os.listdir(work)) == [], os.listdir(work)  # every file it wrote was removed
    assert sorted(os.listdir(tmp_path)) == ["asynctier", "fio"]


def test_interference_counts_this_threads_involuntary_switches_and_the_hosts_steal() -> None:
    """A thread kept busy beside more busy processes than CPUs is switched out while it could
    run; the steal share is a fraction of the machine's CPU time."""
    spin = "import time\nend = time.monotonic() + 1.0\nwhile time.monotonic() < end: pass"
    others = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        seen = benchkit.Interference()
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            pass
        got = seen.stop()
    finally:
        for p in others:
            p.wait()
    assert got["loop_preempted"] > 0, got
    assert got["steal_share"] is None or 0.0 <= got["steal_share"] <= 1.0, got
