"""Open once, close once, never reopen: the state machine of a tier's life, kept by
:class:`~asynctier.core.base.ChunkTier` and by the chain (a tier made of tiers).

A subclass writes :meth:`Lifecycle._opening` (bring the medium up; on failure or cancellation
leave nothing running) and :meth:`Lifecycle._closing_down` (let calls finish, release the
medium); :meth:`Lifecycle._closed` runs once the tier is closed, opened or not.
"""

from __future__ import annotations

import anyio

from .. import errors
from ..errors import TierClosedError, TierNotOpenError
from . import backend
from .backend import CloseHandle, current_loop, start_close

__all__ = ["Lifecycle"]

_NEW, _OPEN, _CLOSING, _CLOSED = "new", "open", "closing", "closed"


class Lifecycle:
    """``open()`` and ``aclose()`` for a tier: idempotent, one at a time, and a closed tier
    stays closed. Calls check :meth:`_check_open` before any I/O."""

    def _init_lifecycle(self) -> None:
        self._state = _NEW
        self._open_lock: anyio.Lock | None = None  # open() and the close, one at a time
        self._lock_loop: object = None  # the loop that made it (a lock serves one loop, one library)
        self._close_handle: CloseHandle | None = None  # the close every aclose() waits for
        self._generation = backend.fork_generation()  # (see _forked)

    async def _opening(self) -> None:
        raise NotImplementedError

    async def _closing_down(self) -> None:
        raise NotImplementedError

    def _closed(self) -> None:
        """Runs once the tier is closed (also when it was never opened)."""

    def _check_close(self) -> None:
        """Raise where the close cannot run (before anything changes: the tier stays open)."""

    @property
    def is_open(self) -> bool:
        """True between a successful ``open()`` and ``aclose()``."""
        return self._state == _OPEN

    def _check_open(self) -> None:
        if self._state == _OPEN:
            if self._generation != backend._generation:
                self._forked()
            return
        if self._state == _NEW:
            raise TierNotOpenError(f"{self!r} is not open: use 'async with tier:' or 'await tier.open()' first")
        raise TierClosedError(f"{self!r} is closed")

    def _refuse_if_forked(self) -> None:
        """For what does not pass :meth:`_check_open` (``drain()``, a second ``open()``)."""
        if self._generation != backend._generation and self._state != _NEW:
            self._forked()

    def _forked(self) -> None:
        """A tier opened before this process was forked: its worker threads, event-loop
        wake-ups and locks stayed in the parent (a call queued jobs nothing would run, and
        hung). Refused; ``aclose()`` here releases nothing of the parent's."""
        raise errors.TierStateError(
            f"{self!r} was opened in the parent of this forked process: its I/O threads are not here. "
            "Open a tier in this process (a new one; the parent's stays the parent's)"
        )

    def _refuse_reopen(self) -> None:
        if self._state in (_CLOSING, _CLOSED) or self._close_handle is not None:
            raise TierClosedError(f"{self!r} is closed; create a new tier instead of reopening")

    def _open_close_lock(self) -> anyio.Lock:
        """The open/close lock of the running loop: a close on another loop, once the tier's
        own is gone (see ChunkTier._check_close), takes a lock of its own loop and library."""
        here = current_loop()
        if self._open_lock is None or self._lock_loop is not here:
            self._open_lock, self._lock_loop = anyio.Lock(), here
        return self._open_lock

    async def _open_once(self) -> None:
        if self._state == _OPEN:
            self._refuse_if_forked()  # (it said "open" to a call that was then refused)
            return
        self._refuse_reopen()
        async with self._open_close_lock():
            if self._state == _OPEN:
                return
            self._refuse_reopen()  # closed while we waited
            await self._opening()
            self._generation = backend.fork_generation()
            self._state = _OPEN

    async def aclose(self) -> None:
        """Let calls in progress finish, then release the medium. Idempotent.

        One close for all callers; every aclose() returns once the medium is released. A
        cancelled aclose() does not stop the close: on asyncio it goes on as a task (the
        caller returns at once, as asyncio code expects); on trio the first caller's close
        is shielded.
        """
        if self._state == _CLOSED:
            return
        if self._generation != backend._generation:  # a forked copy: nothing of it runs here
            self._state = _CLOSED
            return
        if self._close_handle is None:
            self._check_close()
            if self._state == _OPEN:
                self._state = _CLOSING  # no new calls from here on
            self._close_handle = start_close(self._close)
        await self._close_handle.wait()

    async def _close(self) -> None:
        async with self._open_close_lock():  # an open() in progress ends first; then it is closed here
            if self._state == _CLOSED:
                return
            if self._state == _NEW:  # never opened
                self._state = _CLOSED
                self._closed()
                return
            self._state = _CLOSING
            try:
                await self._closing_down()
            finally:
                self._state = _CLOSED
                self._closed()
