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


@pytest.mark.skipif(not benchkit.fio_available(), reason="fio is not installed")
def test_run_fio_until_stopped_streams_until_its_sigint_then_reports(tmp_path: Path) -> None:
    """A stream beside another measurement: fio goes over its file until told to stop, then
    its report comes back as any run's (not as a failure), and its file is removed."""
    import signal
    import threading

    procs: list[subprocess.Popen[str]] = []
    got: list[benchkit.FioResult] = []
    t = threading.Thread(target=lambda: got.append(benchkit.run_fio(
        tmp_path, rw="write", bs=65536, iodepth=4, size=1 << 20, direct=False, fsync_at_end=False,
        until_stopped=True, started=procs.append)))  # fmt: skip
    t.start()
    time.sleep(1.0)
    assert t.is_alive(), "a 1 MiB job that was not told to stop ended by itself"
    procs[0].send_signal(signal.SIGINT)
    t.join(30)
    assert got and got[0].bytes_per_s > 0, got
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match="exclude each other"):
        benchkit.run_fio(tmp_path, rw="write", bs=65536, iodepth=1, size=1 << 20, runtime_s=1, until_stopped=True)


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


def test_the_naive_loop_reaches_the_depth_it_is_compared_at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its calls went to the loop's default pool: 6 threads on this 2-CPU machine, so at depth
    16 it had at most 6 I/Os in flight while the tiers had 16."""
    import asyncio
    import threading

    now, peak, lock = [0], [0], threading.Lock()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.3)  # every writer gets here before the first leaves
        real_fsync(fd)
        with lock:
            now[0] -= 1

    monkeypatch.setattr(os, "fsync", slow_fsync)
    view = memoryview(bytearray(16 * 4096))
    asyncio.run(benchkit.naive_aiofiles(tmp_path, view, 4096, 16, depth=16, mode="write", sync="each"))
    assert peak[0] == 16, peak


def test_the_full_tier_and_repeated_points_are_divided_by_their_own_references() -> None:
    """The full-tier figure was divided by fio writing a fresh file (new blocks to allocate),
    though a tier at capacity writes into space it used before; and --repeat divided the
    median tier run by the median fio run, which may come from other repetitions."""
    from asynctier.cli.bench.results import Phase, PointResult, RefResult, median_ratios, ratios

    def point(gbps: float) -> PointResult:
        ph = Phase.of(1.0, int(gbps * 1e9), 10)
        return PointResult(tier="t", tier_type="fs", chunk_bytes=4096, depth=1, chunks=10, ok=True, offload=ph,
                           steady=ph)  # fmt: skip

    def ref(write: float, overwrite: float) -> RefResult:
        return RefResult(chunk_bytes=4096, depth=1, chunks=10, fio_write={"bytes_per_s": write * 1e9},
                         fio_overwrite={"bytes_per_s": overwrite * 1e9})  # fmt: skip

    r = ratios(point(1.0), ref(1.0, 2.0))
    assert r["fio_write"] == pytest.approx(1.0) and r["fio_steady"] == pytest.approx(0.5)
    pairs = [(point(1.0), ref(3.0, 3.0)), (point(2.0), ref(1.0, 1.0)), (point(3.0), ref(2.0, 2.0))]
    assert median_ratios(pairs)["fio_write"] == pytest.approx(1.5)  # 1/3, 2, 1.5 (medians: 2/2 = 1)


def test_hugetlb_free_bytes_is_free_less_reserved_pages_at_the_kernels_page_size() -> None:
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        assert benchkit.hugetlb_free_bytes() == 0
        return
    f = {ln.split(":")[0]: int(ln.split()[1]) for ln in meminfo.read_text().splitlines() if ln.startswith("Huge")}
    want = max(0, f.get("HugePages_Free", 0) - f.get("HugePages_Rsvd", 0)) * f.get("Hugepagesize", 0) * 1024
    assert benchkit.hugetlb_free_bytes() == want
