"""Measuring against the machine: fio as the physical limit, a naive aiofiles loop as the floor.

The helpers the scripts in ``bench/`` import. They and ``asynctier bench`` report a tier's
throughput as ratios of these, measured in the same run, on the same file system, with the
same block size and queue depth.
"""

from __future__ import annotations

import concurrent.futures
import errno
import json
import os
import resource
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "SETTLE_LIMIT_S",
    "FioResult",
    "bare_file_per_chunk",
    "drop_page_cache",
    "drop_tree_cache",
    "fio_available",
    "fio_version",
    "files_under",
    "naive_aiofiles",
    "percentile",
    "run_fio",
    "ratio",
    "settle",
    "sync_tree",
    "machine_info",
    "md_table",
    "write_results",
]


@dataclass
class FioResult:
    """One fio job's outcome: bytes/s, I/Os per second, completion latency percentiles (s)."""

    rw: str
    bs: int
    iodepth: int
    ioengine: str
    direct: bool
    bytes_per_s: float
    iops: float
    lat_p50_s: float
    lat_p99_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def fio_available() -> bool:
    """Whether the ``fio`` binary is on PATH."""
    return shutil.which("fio") is not None


def fio_version() -> str | None:
    """``fio --version`` (for example ``"fio-3.33"``), or None when fio is missing."""
    if not fio_available():
        return None
    try:
        out = subprocess.run(["fio", "--version"], check=True, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _fio_args(
    directory: Path,
    rw: str,
    bs: int,
    iodepth: int,
    size: int,
    ioengine: str,
    sync_engine: bool,
    direct: bool,
    file_per_block: bool,
) -> list[str]:
    """The fio command line of one job (:func:`run_fio`): a synchronous engine reaches the
    depth with ``iodepth`` jobs, each moving its share of ``size``."""
    numjobs = iodepth if sync_engine else 1
    per_job = max(bs, (size // numjobs) // bs * bs)
    args = [
        "fio",
        "--name=asynctier",
        f"--directory={directory}",
        f"--rw={rw}",
        f"--bs={bs}",
        f"--size={per_job}",
        f"--ioengine={ioengine}",
        f"--iodepth={1 if sync_engine else iodepth}",
        f"--numjobs={numjobs}",
        f"--direct={int(direct)}",
        "--group_reporting=1",
        "--output-format=json",
        "--invalidate=1",
    ]
    if file_per_block:
        args += [
            f"--nrfiles={max(1, per_job // bs)}",
            f"--filesize={bs}",
            "--file_service_type=sequential",
            f"--openfiles={max(1, iodepth)}",
        ]
        if rw.endswith("write"):
            # each file made by the job's own open(O_CREAT), timed: else fio makes (and
            # fallocates) them all before the clock starts, and the inode's cost goes unseen
            args.append("--create_on_open=1")
        args = [a for a in args if not a.startswith("--size=")]
    return args


def run_fio(
    directory: str | os.PathLike[str],
    *,
    rw: str,
    bs: int,
    iodepth: int,
    size: int,
    ioengine: str = "io_uring",
    direct: bool = True,
    fsync_at_end: bool = True,
    runtime_s: float | None = None,
    file_per_block: bool = False,
    overwrite: bool = False,
    mem: str | None = None,
    started: Callable[[subprocess.Popen[str]], None] | None = None,
    until_stopped: bool = False,
) -> FioResult:
    """Run one fio job on a file in ``directory`` and return its figures.

    ``rw`` is ``"write"`` or ``"read"`` (sequential) or ``"randwrite"``/``"randread"``. For
    a synchronous engine (``psync``) the depth is reached with ``iodepth`` threads, as a
    thread-pool tier does; for ``io_uring``/``libaio`` with one job at that queue depth. A
    read job lays out its file first and drops it from the page cache.

    ``file_per_block=True`` spreads the job over ``size // bs`` files of one block each,
    opened in turn (``depth`` open at a time): the layout of a file-per-chunk tier, as a
    reference for what one file per chunk costs on this file system. A write job creates
    each file as it opens it (``create_on_open``), inside the measured time, as a tier does.
    ``overwrite=True`` (a write job): the file is laid out first, untimed, and the job writes
    over it, as a tier at capacity writes into space it has used before (fs recycling a
    victim's file, nvme a slot); a fresh file costs the file system new blocks.
    ``mem`` is fio's ``--mem`` (where its buffers come from; ``"shmhuge"``: hugetlb pages,
    which the kernel must hold in reserve); default: fio's own (``malloc``).
    ``started(process)`` is told the fio process as it starts (to stop it from another thread).
    ``until_stopped=True``: the job goes over its file again and again until the process gets
    ``SIGINT`` (from ``started``'s side), then reports what it moved meanwhile: a stream beside
    another measurement, for as long as that one lasts.
    """
    directory = Path(directory).absolute()  # fio runs with this cwd: a relative path would resolve twice
    directory.mkdir(parents=True, exist_ok=True)
    sync_engine = ioengine in ("psync", "sync", "pvsync", "pvsync2")
    numjobs = iodepth if sync_engine else 1
    args = _fio_args(directory, rw, bs, iodepth, size, ioengine, sync_engine, direct, file_per_block)
    if rw.endswith("write") and fsync_at_end:
        args.append("--end_fsync=1")
    if overwrite:
        args.append("--overwrite=1")
    if mem is not None:
        args.append(f"--mem={mem}")
    if runtime_s is not None and until_stopped:
        raise ValueError("run_fio: runtime_s and until_stopped exclude each other")
    if runtime_s is not None:
        args += [f"--runtime={runtime_s}", "--time_based=0"]
    if until_stopped:
        args += ["--runtime=86400", "--time_based=1"]
    # cwd: fio writes to a path named like the job ("asynctier") instead of "asynctier.0.0" when
    # one exists in its cwd and is not a regular file (the package directory, run from the
    # repository root): every job then overwrote one file that was never deleted
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=directory) as proc:
        if started is not None:
            started(proc)
        try:
            stdout, stderr = proc.communicate(timeout=None if until_stopped else 600)
        except BaseException:
            proc.kill()
            raise
    # (fio ends with 128 on SIGINT, its report written whole)
    if proc.returncode and not (until_stopped and proc.returncode == 128):
        raise subprocess.CalledProcessError(proc.returncode, args, stdout, stderr)
    data = json.loads(stdout[stdout.index("{") :])
    job = data["jobs"][0]
    side = job["write"] if "write" in rw else job["read"]
    pct = side.get("clat_ns", {}).get("percentile", {})
    for f in directory.glob("asynctier.*"):
        f.unlink(missing_ok=True)
    return FioResult(
        rw=rw,
        bs=bs,
        iodepth=iodepth,
        ioengine=ioengine,
        direct=direct,
        bytes_per_s=float(side["bw_bytes"]),
        iops=float(side["iops"]),
        lat_p50_s=float(pct.get("50.000000", 0)) / 1e9,
        lat_p99_s=float(pct.get("99.000000", 0)) / 1e9,
        extra={"numjobs": numjobs, "file_per_block": file_per_block},
    )


def hugetlb_free_bytes() -> int:
    """Bytes of hugetlb pages the kernel holds free and unreserved (``/proc/meminfo``): what
    fio's ``--mem=shmhuge`` can take; 0 where none are kept (the default) or not Linux."""
    fields: dict[str, int] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("HugePages_Free", "HugePages_Rsvd", "Hugepagesize"):
                    fields[name] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        return 0
    pages = fields.get("HugePages_Free", 0) - fields.get("HugePages_Rsvd", 0)
    return max(0, pages) * fields.get("Hugepagesize", 0) * 1024


def drop_page_cache(paths: Iterable[str | os.PathLike[str]]) -> None:
    """Evict files from the page cache (POSIX_FADV_DONTNEED) so the next read hits the medium."""
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_under(directory: str | os.PathLike[str]) -> list[str]:
    """Every regular file below ``directory`` (recursively); empty when it does not exist."""
    out: list[str] = []
    for dirpath, _dirs, names in os.walk(directory):
        out.extend(os.path.join(dirpath, n) for n in names)
    return out


def _syncfs(path: str | os.PathLike[str]) -> bool:
    """syncfs(2) on the file system holding ``path``; False where it is not available."""
    from asynctier.posix_io import libc

    try:
        syncfs = libc().syncfs
    except (OSError, AttributeError):  # no C library to load, or one without syncfs
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        return int(syncfs(fd)) == 0
    finally:
        os.close(fd)


def _device_stat(path: str | os.PathLike[str]) -> Path | None:
    """The block-layer statistics file of the device holding ``path`` (Linux), if any."""
    st = os.stat(path)
    p = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat")
    return p if p.exists() else None


#: The longest :func:`settle` waits for a quiet device by default.
SETTLE_LIMIT_S = 15.0


#: Set to end every :func:`settle` at once (an interrupted run: the process waits for its threads at exit).
_STOP_SETTLING = threading.Event()


def stop_settling() -> None:
    """End the waits of :func:`settle`, now and from now on (the run is over)."""
    _STOP_SETTLING.set()


def settle(path: str | os.PathLike[str], *, quiet_s: float = 0.3, limit_s: float = SETTLE_LIMIT_S) -> float:
    """Flush the file system holding ``path`` and wait until its device is idle.

    Deleting the previous measurement's files leaves work for the device after ``unlink``
    returns: journal commits, writeback and, on a file system mounted with ``discard``,
    a discard of every freed extent.
    Measured next, a contender would pay for its predecessor. This waits until the device
    has done no I/O and has none in flight for ``quiet_s`` (at most ``limit_s``); returns the
    seconds waited. Without ``/sys/dev/block`` it only flushes.
    """
    t0 = time.monotonic()
    _syncfs(path)
    stat = _device_stat(path)
    if stat is None:
        return time.monotonic() - t0
    last, quiet_since = None, time.monotonic()
    while time.monotonic() - t0 < limit_s and not _STOP_SETTLING.is_set():
        fields = stat.read_text().split()
        ios = (fields[0], fields[4], fields[11] if len(fields) > 11 else "")  # reads, writes, discards done
        busy = fields[8] != "0"  # requests in flight
        now = time.monotonic()
        if busy or ios != last:
            last, quiet_since = ios, now
        elif now - quiet_since >= quiet_s:
            break
        _STOP_SETTLING.wait(0.05)
    return time.monotonic() - t0


def sync_tree(directory: str | os.PathLike[str], *, per_file: bool = False) -> int:
    """Make every file below ``directory`` durable; returns the file count.

    Benchmarks time this after a buffered write phase so that a figure means "bytes on the
    medium", as fio's ``end_fsync`` does. By default one ``syncfs`` call flushes the file
    system in one journal commit: an fdatasync of each new file would swamp the figure with
    per-file journal commits no tier needs (docs/benchmarks.md has what they cost). ``per_file``
    (or a platform without syncfs) fdatasyncs each file and directory instead.
    """
    files = files_under(directory)
    if not per_file and os.path.isdir(directory) and _syncfs(directory):
        return len(files)
    for p in files:
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:  # vanished (a temporary file renamed away): nothing to sync
            continue
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
    for dirpath, _dirs, _names in os.walk(directory):
        try:
            fd = os.open(dirpath, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            continue
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return len(files)


def drop_tree_cache(directory: str | os.PathLike[str]) -> int:
    """:func:`drop_page_cache` for every file below ``directory``; returns the file count."""
    files = files_under(directory)
    drop_page_cache(files)
    return len(files)


def percentile(sorted_values: list[float], p: float) -> float:
    """The ``p`` quantile (0..1) of an already sorted list, nearest rank; 0.0 when empty."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]


def _cpu_ticks() -> tuple[int, int] | None:
    """(all, steal) clock ticks of every CPU so far, from ``/proc/stat``; None where it is absent."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks), ticks[7]


class Interference:
    """What took the CPU from this thread between its making and :meth:`stop`: the share of
    the machine's CPU time its hypervisor kept (*steal*, from ``/proc/stat``; a virtual CPU
    stopped while the host serves someone else, which no thread in the guest sees), and how
    many times this thread was switched out while it could have run (involuntary context
    switches). Event-loop lag measured on a virtual machine means little without them."""

    def __init__(self) -> None:
        self._ticks = _cpu_ticks()
        self._switches = _thread_switches()

    def stop(self) -> dict[str, Any]:
        """``steal_share`` (0..1, None where ``/proc/stat`` is absent) and ``loop_preempted``
        (the calling thread's involuntary switches) since this was made."""
        t0, t1 = self._ticks, _cpu_ticks()
        steal = (t1[1] - t0[1]) / (t1[0] - t0[0]) if t0 and t1 and t1[0] > t0[0] else None
        return {"steal_share": steal, "loop_preempted": _thread_switches() - self._switches}


def _thread_switches() -> int:
    """Involuntary context switches of the calling thread so far (of the process where the
    system does not count them per thread)."""
    return resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)).ru_nivcsw


async def naive_aiofiles(
    directory: str | os.PathLike[str],
    view: memoryview,
    chunk_bytes: int,
    n: int,
    *,
    depth: int,
    mode: str,
    sync: str = "each",
    latencies: list[float] | None = None,
) -> float:
    """The floor: aiofiles, one file per chunk, ``depth`` at a time; returns bytes/s. Its
    calls go to a pool of ``depth`` threads: the loop's default pool (``min(32, CPUs + 4)``
    threads, 6 on 2 CPUs) would hold it below the depth it is compared at.

    ``mode="write"`` writes each file, then with ``sync="each"`` fsyncs it (bytes on disk);
    with ``sync="none"`` the caller syncs at the end (:func:`sync_tree`), as fio's
    ``end_fsync`` and ``asynctier bench`` do. ``mode="read"`` reads the files back (drop them
    from the page cache first). ``latencies``, when given, receives each chunk's time.
    """
    if sync not in ("each", "none"):
        raise ValueError(f"sync must be 'each' or 'none'; got {sync!r}")
    import asyncio

    import aiofiles

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sem = asyncio.Semaphore(depth)
    pool = concurrent.futures.ThreadPoolExecutor(depth, thread_name_prefix="naive-aiofiles")
    loop = asyncio.get_running_loop()

    async def one(i: int) -> None:
        async with sem:
            t = time.perf_counter()
            path = directory / f"naive-{i}"
            slot = (i % (view.nbytes // chunk_bytes)) * chunk_bytes
            if mode == "write":
                async with aiofiles.open(path, "wb", executor=pool) as f:
                    await f.write(bytes(view[slot : slot + chunk_bytes]))  # what naive code does
                    await f.flush()
                    if sync == "each":
                        await loop.run_in_executor(pool, os.fsync, f.fileno())
            else:
                async with aiofiles.open(path, "rb", executor=pool) as f:
                    data = await f.read()
                view[slot : slot + len(data)] = data
            if latencies is not None:
                latencies.append(time.perf_counter() - t)

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        return n * chunk_bytes / (time.perf_counter() - t0)
    finally:
        pool.shutdown(wait=False)


def bare_file_per_chunk(
    directory: str | os.PathLike[str],
    view: memoryview,
    chunk_bytes: int,
    n: int,
    *,
    depth: int,
    mode: str,
    shards: int = 256,
    header_bytes: int = 4096,
    spread: bool = True,
) -> float:  # long: one chunk's system calls stay in one closure, no extra layers timed
    """The system calls of a file-per-chunk tier, from ``depth`` plain threads; returns bytes/s.

    No tier around them: no event loop, checksum, header contents, index or error handling.
    ``mode="write"``: per chunk an unnamed file (``O_TMPFILE``, O_DIRECT where the view is
    aligned) in one of ``shards`` subdirectories, one ``pwritev`` of a ``header_bytes`` block
    and the chunk, ``linkat`` under its name, ``close``; the caller syncs at the end.
    ``mode="read"``: ``open``, one ``preadv`` into a header block and the chunk's slot of
    ``view``, ``close`` (drop the files from the page cache first). What the fs tier's thread
    engine asks of the file system, so tier / bare is what the tier itself costs. ``spread``:
    ``directory`` is flagged as the tier flags its namespace directory, so that ext4 places the
    shards apart (:func:`asynctier.posix_io.spread_subdirs`; a no-op elsewhere).
    """
    if mode not in ("write", "read"):
        raise ValueError(f"mode must be 'write' or 'read'; got {mode!r}")
    if not hasattr(os, "O_TMPFILE"):
        raise OSError(errno.EOPNOTSUPP, "bare_file_per_chunk needs O_TMPFILE (Linux)")
    from concurrent.futures import ThreadPoolExecutor

    from ..posix_io import O_DIRECT, aligned_buffer, buffer_address, spread_subdirs

    directory = Path(directory)
    if spread and mode == "write":
        directory.mkdir(parents=True, exist_ok=True)
        spread_subdirs(directory)
    dirs = [directory / f"{i:03x}" for i in range(shards)]
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    dfds = [os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) for d in dirs]
    slots = view.nbytes // chunk_bytes
    direct = O_DIRECT if buffer_address(view) % 4096 == 0 and chunk_bytes % 4096 == 0 else 0
    headers = [aligned_buffer(header_bytes) for _ in range(depth)]
    free = list(range(depth))

    def one(i: int) -> None:
        k = free.pop()  # list.pop/append are atomic: one header block per thread at a time
        hb = headers[k]
        try:
            slot = (i % slots) * chunk_bytes
            data = view[slot : slot + chunk_bytes]
            dfd = dfds[i % shards]
            name = f"bare-{i}"
            if mode == "write":
                fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | direct, 0o644, dir_fd=dfd)
                try:
                    os.pwritev(fd, [hb, data], 0)
                    os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dfd, follow_symlinks=True)
                finally:
                    os.close(fd)
            else:
                fd = os.open(name, os.O_RDONLY | direct, dir_fd=dfd)
                try:
                    os.preadv(fd, [hb, data], 0)
                finally:
                    os.close(fd)
        finally:
            free.append(k)

    try:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(depth) as pool:
            for _ in pool.map(one, range(n)):
                pass
        return n * chunk_bytes / (time.perf_counter() - t0)
    finally:
        for fd in dfds:
            os.close(fd)


def ratio(value: float, reference: float) -> float | None:
    """``value / reference``, or None when there is no reference."""
    return value / reference if reference else None


def md_table(columns: list[str], rows: list[list[str]]) -> str:
    """A markdown table."""
    out = ["| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def machine_info() -> dict[str, Any]:
    """CPUs, memory, platform, Python and fio version: the context every result file records."""
    import platform

    mem = 0
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpus": cpus,
        "memory_bytes": mem,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "fio": fio_version(),
    }


def write_results(directory: str | os.PathLike[str], name: str, data: dict[str, Any], markdown: str) -> list[Path]:
    """Write ``NAME.json`` and ``NAME.md`` into ``directory`` (created); return their paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    js, md = d / f"{name}.json", d / f"{name}.md"
    js.write_text(json.dumps(data, indent=2, default=str) + "\n")
    md.write_text(markdown if markdown.endswith("\n") else markdown + "\n")
    return [js, md]
