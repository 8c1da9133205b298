"""io_uring slot I/O for blocking tiers: one ring per worker thread, vectored read/write.

:class:`UringIO` is a drop-in for ``os.pwritev``/``os.preadv`` called from the runtime's
worker threads: each thread lazily gets its own small ring and submits one ``readv``/
``writev`` SQE at a time, then waits for its completion (``io_uring_enter`` releases the
GIL). Keeping the worker threads means the engine's bound, priorities, back-pressure,
cancellation and stats are unchanged, and a chunk I/O that was submitted always completes
before the call returns (the thread blocks until its CQE arrives).

``liburing`` (PyPI) is imported lazily, the first time a :class:`UringIO` is built, so
``import asynctier`` never loads it. :func:`probe` says whether io_uring works here.

Before this process loads ``liburing`` it is tried once in a child interpreter (cached for
the process): some builds of the binding die with SIGILL on CPUs they were not compiled
for (seen with liburing 2026.3.x on an AVX2-only VM), and a signal cannot be caught in
Python; a tier asking for ``io_engine="auto"`` must fall back to psync, not take the
server down.
"""

from __future__ import annotations

import errno
import functools
import importlib.util
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

__all__ = ["UringIO", "UringUnavailable", "probe"]


class UringUnavailable(RuntimeError):
    """io_uring cannot be used here (no ``liburing`` module, or the kernel refuses a ring)."""


# what the child runs: import the binding and set up (and tear down) one ring
_CHILD_CHECK = "import liburing as L; r = L.Ring(); L.io_uring_queue_init(2, r); L.io_uring_queue_exit(r)"


@functools.cache
def _binding_problem() -> str | None:
    """Why the ``liburing`` binding cannot be used in this process (None: it can).

    Checked in a child interpreter, once per process, so a crash costs the child only.
    """
    if importlib.util.find_spec("liburing") is None:
        return "the liburing module is not installed; pip install 'asynctier[nvme]'"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD_CHECK], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.SubprocessError) as e:
        return f"could not check the liburing module in a child process: {e}"
    if proc.returncode == 0:
        return None
    if proc.returncode < 0:
        try:
            sig = signal.Signals(-proc.returncode).name
        except ValueError:
            sig = f"signal {-proc.returncode}"
        return f"the liburing module crashed a child process with {sig} setting up a ring (built for another CPU?)"
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return f"setting up an io_uring ring failed: {lines[-1] if lines else f'exit status {proc.returncode}'}"


def _load() -> Any:
    problem = _binding_problem()
    if problem is not None:
        raise UringUnavailable(problem)
    try:
        import liburing
    except ImportError as e:  # an optional dependency: the "nvme" extra
        raise UringUnavailable(f"the liburing module is not installed ({e}); pip install 'asynctier[nvme]'") from e
    return liburing


def probe() -> str | None:
    """None when a ring can be set up here; otherwise why not (for a skip or a log line)."""
    try:
        UringIO(entries=2).close()
    except UringUnavailable as e:
        return str(e)
    return None


def _rest(bufs: Sequence[memoryview], done: int) -> list[memoryview]:
    """The part of ``bufs`` after the first ``done`` bytes (to resubmit a short transfer)."""
    out: list[memoryview] = []
    for b in bufs:
        if done >= b.nbytes:
            done -= b.nbytes
            continue
        out.append(b[done:] if done else b)
        done = 0
    return out


class _Ring:
    """One thread's ring; used by that thread only (submission and completion)."""

    def __init__(self, lu: Any, entries: int) -> None:
        self.lu = lu
        self.ring = lu.Ring()
        self.cqe = lu.Cqe()
        try:
            lu.io_uring_queue_init(entries, self.ring)
        except OSError as e:  # ENOSYS (old kernel), EPERM (seccomp / io_uring_disabled), ENOMEM
            raise UringUnavailable(f"io_uring_queue_init failed: {e}") from e
        self.closed = False

    def rw(self, write: bool, fd: int, bufs: Sequence[memoryview], offset: int) -> int:
        """One ``writev``/``readv`` SQE, waited for; the byte count (raises OSError on error)."""
        lu = self.lu
        iov = lu.Iovec(list(bufs))  # holds pointers into bufs: they stay referenced until the CQE
        sqe = lu.io_uring_get_sqe(self.ring)
        if sqe is None:  # cannot happen with one I/O in flight per ring; be explicit anyway
            raise OSError(errno.EBUSY, "io_uring submission queue full")
        if write:
            lu.io_uring_prep_writev(sqe, fd, iov, offset)
        else:
            lu.io_uring_prep_readv(sqe, fd, iov, offset)
        try:
            lu.io_uring_submit(self.ring)
        except OSError:
            # The SQE may still sit in the queue, pointing at our buffers: a later submit
            # would send it. Drop the ring (exit discards unsubmitted SQEs); the next call
            # on this thread sets up a fresh one.
            self.close()
            raise
        while True:
            try:
                # the binding raises OSError(-res) for a failed CQE, leaving it in the queue
                lu.io_uring_wait_cqe(self.ring, self.cqe)
                cqe = self.cqe[0]
                res = int(cqe.res)
                lu.io_uring_cqe_seen(self.ring, cqe)
            except OSError as e:
                if lu.io_uring_cq_ready(self.ring) == 0:
                    if e.errno in (errno.EINTR, errno.EAGAIN, errno.EBUSY, errno.ETIME):
                        continue  # the wait itself failed: the I/O is still in flight, wait on
                    raise
                lu.io_uring_cq_advance(self.ring, 1)  # consume the failed CQE
                raise OSError(
                    e.errno, f"io_uring {'writev' if write else 'readv'} at offset {offset}: {e.strerror}"
                ) from None
            del iov
            if res < 0:  # a binding that does not raise on a negative res
                raise OSError(-res, f"io_uring {'writev' if write else 'readv'} at offset {offset}")
            return res

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.lu.io_uring_queue_exit(self.ring)


class UringIO:
    """``pwritev_all``/``preadv_all`` through per-thread io_uring rings.

    Build one per tier (at open); every thread that calls it gets its own ring on first
    use. :meth:`close` tears every ring down; call it only once no I/O is in flight (after
    the tier's workers drained).
    """

    def __init__(self, entries: int = 4) -> None:
        self._lu = _load()
        self._entries = entries
        self._local = threading.local()
        self._lock = threading.Lock()
        self._rings: list[_Ring] = []
        self._closed = False
        self._ring()  # fail here (at open), not on the first I/O, when io_uring is refused

    def _ring(self) -> _Ring:
        r: _Ring | None = getattr(self._local, "ring", None)
        if r is None:
            with self._lock:
                if self._closed:
                    raise OSError(errno.EBADF, "io_uring engine is closed")
                r = _Ring(self._lu, self._entries)
                self._rings.append(r)
            self._local.ring = r
        elif r.closed:
            if self._closed:
                raise OSError(errno.EBADF, "io_uring engine is closed")
            self._local.ring = None  # dropped after a failed submit: set up a new one
            return self._ring()
        return r

    def pwritev_all(self, fd: int, bufs: Sequence[memoryview], offset: int) -> None:
        """Write all of ``bufs`` at ``offset`` (short writes are resubmitted for the rest)."""
        ring = self._ring()
        total = sum(b.nbytes for b in bufs)
        done = 0
        while done < total:
            n = ring.rw(True, fd, _rest(bufs, done) if done else bufs, offset + done)
            if n <= 0:
                raise OSError(errno.EIO, f"io_uring writev wrote {n} bytes at offset {offset + done}")
            done += n

    def preadv_all(self, fd: int, bufs: Sequence[memoryview], offset: int) -> int:
        """Read into ``bufs`` from ``offset``; the bytes read (less than asked only at EOF)."""
        ring = self._ring()
        total = sum(b.nbytes for b in bufs)
        got = 0
        while got < total:
            n = ring.rw(False, fd, _rest(bufs, got) if got else bufs, offset + got)
            if n == 0:
                break  # end of file
            got += n
        return got

    def close(self) -> None:
        """Exit every ring (idempotent)."""
        with self._lock:
            self._closed = True
            rings, self._rings = self._rings, []
        for r in rings:
            r.close()
