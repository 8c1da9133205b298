"""The references every tier is divided by, measured at each point of the same run, on the
same file system: fio (O_DIRECT, same block size and depth) and a naive aiofiles loop."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from .. import benchkit
from ..sizes import format_size
from .primary import PrimaryBuffer
from .progress import Progress
from .results import Phase, RefResult

__all__ = ["FioState", "run_references"]


class FioState:
    """The fio engines still in use this run (one that fails is dropped) and the notes saying so."""

    def __init__(self, engines: list[str]) -> None:
        self.engines = list(engines)
        #: Engines the plan counted bytes for at every point, whether or not each still runs.
        self.planned = len(engines)
        self.notes: list[str] = []
        self._busy = threading.Lock()  # held while a job runs (on a thread)
        self._proc: subprocess.Popen[str] | None = None
        self._stopped = False

    def stop(self) -> None:
        """End the run's fio work (the run was interrupted): the job running is killed, no
        other starts, and this returns once its thread is out of fio's directory (a job that
        went on made it again after the run removed it)."""
        self._stopped = True
        proc = self._proc
        if proc is not None:
            proc.kill()
        with self._busy:
            pass

    def _started(self, proc: subprocess.Popen[str]) -> None:
        self._proc = proc
        if self._stopped:
            proc.kill()

    def best(self, directory: Path, rw: str, chunk: int, depth: int, size: int) -> dict[str, Any] | None:
        """Best of the engines for one job (blocking: run it on a thread); ``rw`` "overwrite":
        a write job over a file laid out first."""
        with self._busy:
            return self._best(directory, rw, chunk, depth, size)

    def _best(self, directory: Path, rw: str, chunk: int, depth: int, size: int) -> dict[str, Any] | None:
        best: benchkit.FioResult | None = None
        for engine in list(self.engines):
            if self._stopped:
                return None
            try:
                r = benchkit.run_fio(
                    directory, rw="write" if rw == "overwrite" else rw, bs=chunk, iodepth=depth, size=size,
                    ioengine=engine, direct=True, overwrite=rw == "overwrite", started=self._started,
                )  # fmt: skip
            except Exception as e:  # e.g. io_uring refused by the kernel or a sandbox
                if self._stopped:
                    return None
                self.engines.remove(engine)
                self.notes.append(f"fio engine {engine} failed ({type(e).__name__}); not used")
                continue
            if best is None or r.bytes_per_s > best.bytes_per_s:
                best = r
        return best.as_dict() if best else None


async def _fio(
    ref: RefResult, fio: FioState, workdir: Path, chunk: int, depth: int, size: int, progress: Progress, steady: bool
) -> None:
    label = f"reference {format_size(chunk)} depth {depth}"
    progress.phase(f"{label}: fio write")
    await asyncio.to_thread(benchkit.settle, workdir)
    ref.fio_write = await asyncio.to_thread(fio.best, workdir / "fio", "write", chunk, depth, size)
    progress.advance(fio.planned * size)
    progress.phase(f"{label}: fio read")
    ref.fio_read = await asyncio.to_thread(fio.best, workdir / "fio", "read", chunk, depth, size)
    progress.advance(fio.planned * 2 * size)  # a read job lays its file out first
    if steady:  # the full tier's reference: a tier at capacity writes into space used before
        progress.phase(f"{label}: fio overwrite")
        ref.fio_overwrite = await asyncio.to_thread(fio.best, workdir / "fio", "overwrite", chunk, depth, size)
        progress.advance(fio.planned * 2 * size)


async def _naive(
    ref: RefResult, primary: PrimaryBuffer, workdir: Path, chunk: int, depth: int, chunks: int, progress: Progress
) -> None:
    label = f"reference {format_size(chunk)} depth {depth}"
    size = chunk * chunks
    d = workdir / f"naive-{chunk}-{depth}"
    view = primary.view[:size]
    advanced = 0
    try:
        progress.phase(f"{label}: naive aiofiles write")
        await asyncio.to_thread(benchkit.settle, workdir)
        lat: list[float] = []
        t = time.perf_counter()
        await benchkit.naive_aiofiles(d, view, chunk, chunks, depth=depth, mode="write", sync="none", latencies=lat)
        await asyncio.to_thread(benchkit.sync_tree, d)  # timed like the tiers: until on disk
        ref.naive_write = Phase.of(time.perf_counter() - t, size, chunks, lat)
        progress.advance(size)
        advanced += size
        await asyncio.to_thread(benchkit.drop_tree_cache, d)
        progress.phase(f"{label}: naive aiofiles read")
        lat = []
        primary.dirty_bytes = max(primary.dirty_bytes, size)
        t = time.perf_counter()
        await benchkit.naive_aiofiles(d, view, chunk, chunks, depth=depth, mode="read", latencies=lat)
        ref.naive_read = Phase.of(time.perf_counter() - t, size, chunks, lat)
    except Exception as e:
        ref.notes.append(f"naive loop failed: {type(e).__name__}: {e}")
    finally:
        progress.advance(2 * size - advanced)
        primary.restore()
        await asyncio.to_thread(shutil.rmtree, d, True)


async def run_references(
    primary: PrimaryBuffer,
    chunk: int,
    depth: int,
    chunks: int,
    workdir: Path,
    fio: FioState | None,
    naive: bool,
    progress: Progress,
    steady: bool = False,
) -> RefResult:
    """fio (when ``fio`` holds engines; with ``steady`` an overwrite job too) and the naive
    loop (when ``naive``) at one point."""
    ref = RefResult(chunk_bytes=chunk, depth=depth, chunks=chunks)
    if fio is not None and fio.engines:
        await _fio(ref, fio, workdir, chunk, depth, chunk * chunks, progress, steady)
    elif fio is not None:  # every engine failed earlier: the bytes planned for them are done with
        progress.advance(fio.planned * (5 if steady else 3) * chunk * chunks)
    if naive:
        await _naive(ref, primary, workdir, chunk, depth, chunks, progress)
    return ref
