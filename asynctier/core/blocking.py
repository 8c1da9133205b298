"""Base class for tiers whose per-chunk primitives block (system calls, sync clients).

They run on ``max_inflight`` worker threads of the threads engine
(:mod:`asynctier.engines.threads`); everything else comes from
:class:`~asynctier.core.base.ChunkTier`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from ..engines.base import Engine
from ..engines.threads import ThreadEngine
from .backend import run_on_thread_to_end, run_to_completion
from .base import ChunkTier
from .bookkeeping import is_not_found
from .jobs import SKIPPED, Skipped
from .ops import Op

__all__ = ["BlockingChunkTier"]

log = logging.getLogger("asynctier.core")


class BlockingChunkTier(ChunkTier):
    """A tier whose primitives block; they run on ``max_inflight`` worker threads.

    Subclasses implement :meth:`write_chunk`, :meth:`read_chunk`, :meth:`chunk_exists`,
    :meth:`delete_chunk`, and optionally :meth:`open_medium` / :meth:`close_medium`.
    Primitives are called from several threads at once.
    """

    # -- primitives ------------------------------------------------------------------------
    def write_chunk(self, key: bytes, data: memoryview) -> bool | None:
        """Store ``data`` (read-only, ``chunk_bytes`` long) under ``key``, atomically. Return
        False only when the medium holds ``key`` already and nothing was written (the call
        reports the key in :attr:`TransferResult.skipped`); None or True otherwise."""
        raise NotImplementedError

    def read_chunk(self, key: bytes, out: memoryview) -> int | None:
        """Fill ``out`` with what ``write_chunk`` stored under ``key``; optionally return how
        many bytes that was (fewer than ``len(out)``: a truncated copy).

        Raise :class:`ChunkNotFoundError` (or ``FileNotFoundError``) when absent and
        :class:`IntegrityError` when the stored copy is bad (the base class deletes it).
        """
        raise NotImplementedError

    def chunk_exists(self, key: bytes) -> bool:
        """Whether a chunk is stored under ``key``."""
        raise NotImplementedError

    def delete_chunk(self, key: bytes) -> bool:
        """Delete the chunk stored under ``key``; return whether one was there."""
        raise NotImplementedError

    def list_chunks(self) -> list[bytes]:
        """Every key stored on the medium (for ``fsck``); tiers with an index need not override."""
        raise NotImplementedError(f"the {self.tier_type!r} tier cannot list its chunks")

    def open_medium(self) -> None:
        """Blocking setup run once by ``open()`` in a worker thread (scan, connect, recover)."""

    def close_medium(self) -> None:
        """Blocking teardown run once by ``aclose()`` after draining."""

    # -- framing (asynctier.core.framing) ---------------------------------------------------
    def _write_framed(self, key: bytes, payload: memoryview) -> bool | None:
        if self.frames_own_bytes:
            return self.write_chunk(key, payload.toreadonly())  # the caller's slot: read-only, as documented
        return self.write_chunk(key, self._framing.frame(key, payload, per_thread=True))

    def _read_checked(self, key: bytes, out: memoryview) -> None:
        if self.frames_own_bytes:
            self.read_chunk(key, out)
        else:
            record = self._framing.read_buffer(key)
            filled = self.read_chunk(key, record)
            self._framing.read_checked(key, record, filled, out)

    # -- wiring ----------------------------------------------------------------------------
    def make_engine(self) -> Engine:
        return ThreadEngine(self.max_inflight or 1, name=f"asynctier-{self.tier_type}")

    async def _open_medium(self) -> None:
        opened = False

        def setup() -> None:
            nonlocal opened
            self.open_medium()
            opened = True
            if self._needs_listing():
                try:
                    listed: list[bytes] | None = self.list_chunks()
                except NotImplementedError:
                    listed = None
                self._index_listed(listed)

        try:
            await run_on_thread_to_end(setup)
        except BaseException:  # cancelled (or a KeyboardInterrupt raised into this task)
            # The thread ran to its end: undo what it set up (descriptors, locks, threads)
            # before the cancellation goes on; else they outlive the tier.
            if opened:
                try:
                    await run_to_completion(lambda: run_on_thread_to_end(self.close_medium))
                except Exception as e:
                    log.warning("%s: closing after a cancelled open failed: %r", self.tier_type, e)
            raise

    async def _list_chunks(self) -> list[bytes]:
        return await run_on_thread_to_end(self.list_chunks)

    async def _close_medium(self) -> None:
        await run_on_thread_to_end(self.close_medium)

    def job_body(self, op: Op) -> Callable[..., Any]:
        """The blocking body of a one-chunk job of ``op``: ``fn(key, chunk_id, t0)``."""
        return {
            Op.STORE: self._store_job,
            Op.LOAD: self._load_job,
            Op.REMOVE: self._remove_job,
            Op.LOOKUP: self._lookup_job,
            Op.VERIFY: self._verify_job,
        }[op]

    def _verify_job(self, key: bytes, remove_bad: int, t0: float) -> None:
        try:
            from ..posix_io import aligned_buffer  # page-aligned: read as a load is (O_DIRECT)

            self._read_checked(key, aligned_buffer(self.offloading_spec.chunk_bytes))
        except BaseException as e:
            if self._end_verify(key, e, bool(remove_bad)):
                self._drop_bad_copy(key, partial(self.delete_bad_copy, key, e))
            raise

    def _store_job(self, key: bytes, cid: int, t0: float) -> Skipped | None:
        victims = self._reserve_store_blocking(key, t0)
        if victims is None:
            return SKIPPED
        try:
            try:
                for v in victims:
                    self._evict(v)
            finally:
                self._removed(victims)
            wrote = self._write_framed(key, self._chunk(cid))
        except BaseException as e:
            self._end_store(key, t0, e)
            raise
        return self._end_written(key, t0, wrote)

    def _evict(self, key: bytes) -> None:
        try:
            self.delete_chunk(key)
        except Exception as e:
            self._evicted(key, e)
        else:
            self._evicted(key, None)

    def _load_job(self, key: bytes, cid: int, t0: float) -> None:
        entry = self._pin_for_load(key)
        try:
            self._read_checked(key, self._chunk(cid))
        except BaseException as e:
            if self._end_load(key, t0, e, entry):
                self._drop_bad_copy(key, partial(self.delete_bad_copy, key, e))
            raise
        self._end_load(key, t0, None, entry)

    def delete_bad_copy(self, key: bytes, exc: BaseException) -> None:
        """Delete the copy of ``key`` that failed verification with ``exc``: by key here; a
        tier that can name the copy it read (``IntegrityError.copy``) drops that one only."""
        self.delete_chunk(key)

    def _remove_job(self, key: bytes, cid: int, t0: float) -> None:
        if self._after_removal(self._begin_remove, key):
            try:
                self.delete_chunk(key)
            except BaseException as e:
                if not is_not_found(e):
                    self._end_remove(key, t0, e)
                    raise
            finally:
                self._removed([key])
        self._end_remove(key, t0, None)

    def _lookup_job(self, key: bytes, cid: int, t0: float) -> bool:
        return self.chunk_exists(key)
