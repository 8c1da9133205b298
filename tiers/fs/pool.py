"""Unnamed files made ahead of need, so that a store does not wait for its file's creation."""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable

__all__ = ["O_TMPFILE", "POOL_HOLD_POLL_S", "POOL_TARGET", "TmpfilePool", "close_tier_fds"]

O_TMPFILE: int = getattr(os, "O_TMPFILE", 0)
#: tmpfile_pool=None: unnamed files kept made ahead (one descriptor each).
POOL_TARGET = 64
#: A held pool asks its ``hold`` again this often.
POOL_HOLD_POLL_S = 1.0


class TmpfilePool:
    """Unnamed files (``O_TMPFILE``) made ahead of need by a background thread.

    Creating a file is a journaled metadata operation that can wait on the journal, a
    large share of a small chunk's time (docs/benchmarks.md). Made ahead, off the chunk's
    latency path, it overlaps the writes in flight, and files made during an idle spell
    take a burst of stores faster than making them in the burst. An unnamed inode can be
    linked under any name on its file system and dies with its descriptor (or at the next
    mount after a crash): a pooled file is invisible and costs no disk space until it is
    written and linked. ``hold``, where given, pauses the
    making while it returns True (the native engine's pool: while the tier is busy).
    """

    def __init__(
        self,
        dir_fds: list[int],
        flags: int,
        target: int,
        name: str,
        hold: Callable[[], bool] | None = None,
        mode: tuple[int, bool] = (0o600, False),
    ) -> None:
        self.flags = flags
        self._mode, self._fix_mode = mode  # the files' mode; whether the umask strips bits of it
        self._dir_fds = list(dir_fds)
        self._target = target
        self._hold = hold  # while it returns True, make no file (looked at before each)
        self._fds: collections.deque[int] = collections.deque()
        self._cv = threading.Condition()
        self._stop = False
        self._wants_room = False  # the thread waits for a take (the pool is full)
        self._held = False  # the thread waits, hold() said so (it asks again every POOL_HOLD_POLL_S)
        self._thread = threading.Thread(target=self._fill, name=name, daemon=True)
        self._thread.start()

    def take(self) -> int | None:
        """A file opened with :attr:`flags`, or None when none is ready."""
        try:
            fd = self._fds.popleft()
        except IndexError:
            return None
        if self._wants_room:  # only then: a wake-up per take would cost the taker the GIL
            with self._cv:
                self._cv.notify()
        return fd

    def take_many(self, n: int) -> list[int]:
        """:meth:`take` ``n`` times: each a file, or -1 where none was ready."""
        fds, out = self._fds, []
        try:
            for _ in range(n):
                out.append(fds.popleft())
        except IndexError:  # (slow-path threads take too: the deque's length may change meanwhile)
            pass
        if out and self._wants_room:
            with self._cv:
                self._cv.notify()
        return out + [-1] * (n - len(out))

    @property
    def ready(self) -> int:
        """Files made and not yet taken."""
        return len(self._fds)

    def _fill(self) -> None:
        made = 0
        backoff = 0.0
        while True:
            with self._cv:
                # set before the check: a take that empties a slot after it sees the flag
                self._wants_room = True
                while not self._stop and len(self._fds) >= self._target:
                    self._cv.wait()
                self._wants_room = False
                if self._stop:
                    return
                self._held = True
                if self._hold is not None and self._hold():
                    self._cv.wait(POOL_HOLD_POLL_S)  # ended early by close()
                    self._held = False
                    continue
                self._held = False
            try:
                dfd = self._dir_fds[made % len(self._dir_fds)]  # spread over the shards, as writers are
                fd = os.open(".", O_TMPFILE | self.flags, self._mode, dir_fd=dfd)
                if self._fix_mode:
                    os.fchmod(fd, self._mode)
            except OSError:
                # read-only, full, or no O_TMPFILE/O_DIRECT here: writers make their own files
                # (and meet the error themselves); try again later, less often while it lasts
                # (takes notify the condition: the deadline, not a wake-up, ends the wait)
                backoff = min(30.0, max(1.0, 2 * backoff))
                until = time.monotonic() + backoff
                with self._cv:
                    while not self._stop and (left := until - time.monotonic()) > 0:
                        self._cv.wait(left)
                continue
            backoff = 0.0
            made += 1
            with self._cv:
                if self._stop:
                    os.close(fd)
                    return
                self._fds.append(fd)

    def close(self) -> None:
        """Stop the thread and close the files not taken (idempotent)."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join()
        while self._fds:
            os.close(self._fds.popleft())


def close_tier_fds(fds: list[int], pools: list[TmpfilePool]) -> None:
    """Stop the pools, then close the descriptors (a tier's finalizer: each only once)."""
    for pool in pools:  # first: its thread creates files in the directories below
        pool.close()
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
