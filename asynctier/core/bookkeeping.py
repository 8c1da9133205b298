"""Index and stats bookkeeping around each chunk job, shared by the blocking and async bases.

A store reserves room (or learns the key is already stored), evicts, writes, then commits or
aborts; a load pins its entry against eviction and drops a copy that failed verification; a
write or removal of a key waits out an earlier deletion of the same key. These rules hold for
every tier with an index (``uses_index = True``), whatever its medium.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, TypeVar

from ..errors import ChunkNotFoundError, IntegrityError
from ..lru import LRUIndex, RemovalPending
from ..spec import OffloadingSpec
from ..stats import StatsRecorder
from .backend import run_on_thread_to_end
from .jobs import SKIPPED, Skipped

__all__ = ["Bookkeeping", "REMOVAL_WAIT_S", "is_not_found"]

log = logging.getLogger("asynctier.core")

T = TypeVar("T")

#: How long a write or removal of a key waits for an earlier deletion of the same key. A
#: deletion is one unlink or request; this only bounds the harm of one that is never reported.
REMOVAL_WAIT_S = 30.0


def is_not_found(exc: BaseException) -> bool:
    return isinstance(exc, (ChunkNotFoundError, FileNotFoundError))


class Bookkeeping:
    """Mixed into :class:`~asynctier.core.base.ChunkTier`: what happens around each chunk I/O."""

    offloading_spec: OffloadingSpec
    tier_type: str
    index: LRUIndex | None
    _stats: StatsRecorder
    _view: memoryview

    def stored_size(self) -> int:
        """Bytes one chunk occupies on the medium (capacity accounting); default: payload only."""
        return self.offloading_spec.chunk_bytes

    def _chunk(self, cid: int) -> memoryview:
        return self.offloading_spec.chunk_view(self._view, cid)

    def _needs_listing(self) -> bool:
        """Whether the open lists the medium to fill the index (:attr:`recovers_index`)."""
        return (
            self.index is not None and getattr(self, "persistent", True) and not getattr(self, "recovers_index", False)
        )

    def _index_listed(self, keys: list[bytes] | None) -> None:
        """Record the chunks an open found on the medium (None: it cannot list them)."""
        if keys is None:
            log.warning(
                "%s: an indexed tier that cannot list its chunks (list_chunks) opens with an empty index: chunks "
                "an earlier process stored are neither served nor counted against capacity_bytes",
                self.tier_type,
            )
            return
        assert self.index is not None
        size = self.stored_size()
        for k in keys:
            self.index.add(k, size)

    def _begin_store(self, key: bytes) -> list[bytes] | None:
        """Reserve room; None means the key is already stored (skip the write)."""
        if self.index is None:
            return []
        return self.index.reserve(key, self.stored_size())

    def _end_store(self, key: bytes, t0: float, exc: BaseException | None, *, skipped: bool = False) -> None:
        if exc is None:
            if self.index is not None and not skipped:
                self.index.commit(key)
            self._stats.record_success(
                "offload", self.offloading_spec.chunk_bytes, time.perf_counter() - t0, skipped=skipped
            )
        else:
            if self.index is not None:
                self.index.abort(key)
            self._stats.record_failure(exc)

    def begin_load(self, key: bytes) -> object | None:
        """Pin ``key`` for a load; returns the index entry pinned (None without an index)."""
        if self.index is None:
            return None
        entry = self.index.pin_entry(key)
        if entry is None:
            raise ChunkNotFoundError(f"no chunk stored under key {key.hex()[:32]}", key)
        return entry

    def _end_load(self, key: bytes, t0: float, exc: BaseException | None, entry: object | None = None) -> bool:
        """Book a load of the copy pinned as ``entry``; True if that copy must be deleted (it
        failed verification and is still the key's: not removed, and stored again, meanwhile)."""
        ours = True  # the copy read is still the key's
        if self.index is not None:
            self.index.unpin(key, touch=exc is None, entry=entry)
            if exc is not None and (is_not_found(exc) or isinstance(exc, IntegrityError)):
                # a bad copy is deleted next: a new write of the key waits for that (_removed)
                dropped = self.index.discard(key, removing=isinstance(exc, IntegrityError), entry=entry)
                ours = entry is None or dropped  # else a newer copy (or none) is the key's: leave it be
        if exc is None:
            self._stats.record_success("load", self.offloading_spec.chunk_bytes, time.perf_counter() - t0)
            return False
        self._stats.record_failure(exc)
        return ours and isinstance(exc, IntegrityError)

    def _end_verify(self, key: bytes, exc: BaseException, remove_bad: bool) -> bool:
        """Book a failed verification; True if the bad copy must be deleted now."""
        self._stats.record_failure(exc)
        bad = isinstance(exc, IntegrityError)
        if bad:
            self._stats.incr("bad_chunks_found")
        if bad and remove_bad and self.index is not None:
            self.index.discard(key, removing=True)
        return bad and remove_bad

    def _end_remove(self, key: bytes, t0: float, exc: BaseException | None) -> None:
        if exc is None:
            self._stats.record_success("remove", 0, time.perf_counter() - t0)
        else:
            self._stats.record_failure(exc)

    # -- keys being deleted: a write or removal of one waits (LRUIndex.track_removals) ---------
    def _removed(self, keys: Sequence[bytes]) -> None:
        """The deletion of ``keys`` (victims, a removed key, a bad copy) is over, done or not."""
        if self.index is not None and keys:
            self.index.removed(keys)

    def _wait_removal(self, pending: RemovalPending) -> None:
        """Block until ``pending`` is over (worker threads; :meth:`_await_removal` on the loop)."""
        if not pending.wait(REMOVAL_WAIT_S):
            # never reported over: a bug, but a lost write is better than a stuck one
            log.error("%s: the deletion of chunk %s was not reported over in %ss; going on",
                      self.tier_type, pending.key.hex()[:32], REMOVAL_WAIT_S)  # fmt: skip
            self._removed([pending.key])

    async def _await_removal(self, pending: RemovalPending) -> None:
        await run_on_thread_to_end(self._wait_removal, pending)  # rare: a key re-stored as it is evicted

    def _begin_remove(self, key: bytes) -> bool:
        """Before deleting ``key`` on request; False: a write of it is in progress and wins."""
        return self.index.begin_remove(key) if self.index is not None else True

    def _reserve_store(self, key: bytes, t0: float) -> list[bytes] | None:
        """Begin a store: the chunks to evict first, or None when ``key`` is stored already
        (accounted as skipped). A failure to begin is counted and raised;
        :class:`RemovalPending` (an old copy of ``key`` is being deleted) is raised as is:
        wait for it, then call again (:meth:`_after_removal`)."""
        try:
            victims = self._begin_store(key)
        except RemovalPending:
            raise
        except BaseException as e:
            self._stats.record_failure(e)
            raise
        if victims is None:
            self._end_store(key, t0, None, skipped=True)
        return victims

    def _after_removal(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` (an index operation), waiting out a deletion of the same key that it
        reports with :class:`RemovalPending` (worker threads)."""
        while True:
            try:
                return fn(*args)
            except RemovalPending as p:
                self._wait_removal(p)

    async def _after_removal_async(self, fn: Callable[..., T], *args: Any) -> T:
        """:meth:`_after_removal` on the event loop."""
        while True:
            try:
                return fn(*args)
            except RemovalPending as p:
                await self._await_removal(p)

    def _reserve_store_blocking(self, key: bytes, t0: float) -> list[bytes] | None:
        """:meth:`_reserve_store`, waiting out a deletion of ``key`` (worker threads)."""
        return self._after_removal(self._reserve_store, key, t0)

    def _pin_for_load(self, key: bytes) -> object | None:
        """Begin a load (the chunk is pinned against eviction; returns the entry for
        :meth:`_end_load`); a failure is counted and raised."""
        try:
            return self.begin_load(key)
        except BaseException as e:
            self._stats.record_failure(e)
            raise

    async def _async_store(
        self, key: bytes, t0: float, write: Callable[[list[bytes]], Awaitable[bool | None]]
    ) -> Skipped | None:
        """One store run as a coroutine: reserve (or skip a key already stored),
        ``write(victims)`` (evict them, then write), commit or abort. :data:`SKIPPED` when
        nothing was written (the key was stored already)."""
        victims = await self._after_removal_async(self._reserve_store, key, t0)
        if victims is None:
            return SKIPPED
        return await self._async_store_reserved(key, t0, victims, write)

    async def _async_store_reserved(
        self, key: bytes, t0: float, victims: list[bytes], write: Callable[[list[bytes]], Awaitable[bool | None]]
    ) -> Skipped | None:
        """:meth:`_async_store` once room is reserved (``victims`` to evict first)."""
        try:
            wrote = await write(victims)
        except BaseException as e:
            self._end_store(key, t0, e)
            raise
        finally:
            self._removed(victims)  # write() deleted them (or failed to): re-stores of them may go on
        return self._end_written(key, t0, wrote)

    def _end_written(self, key: bytes, t0: float, wrote: bool | None) -> Skipped | None:
        """A store's write returned ``wrote``: False when the medium holds ``key`` already and
        wrote nothing (``write_chunk`` may say so): committed, and counted as skipped."""
        if wrote is not False:
            self._end_store(key, t0, None)
            return None
        if self.index is not None:
            self.index.commit(key)
        self._end_store(key, t0, None, skipped=True)
        return SKIPPED

    async def _async_load(
        self,
        key: bytes,
        t0: float,
        read: Callable[[], Awaitable[None]],
        delete: Callable[[BaseException], Awaitable[object]],
        entry: object | None = None,
    ) -> None:
        """One load run as a coroutine, after :meth:`_pin_for_load`: ``read()``, account it,
        and drop a copy that failed verification with ``delete(its error)``."""
        try:
            await read()
        except BaseException as e:
            if self._end_load(key, t0, e, entry):
                await self._drop_bad_copy_async(key, partial(delete, e))
            raise
        self._end_load(key, t0, None, entry)

    # -- a copy that failed verification: deleted once, whatever the deletion does ---------
    def _drop_bad_copy(self, key: bytes, delete: Callable[[], object]) -> None:
        """``delete()`` the bad copy of ``key``; a failure to delete is logged (the chunk's
        failure stays the verification's), and the deletion is over either way."""
        try:
            delete()
        except Exception as de:
            log.warning("%s: removing bad chunk %s failed: %r", self.tier_type, key.hex()[:32], de)
        finally:
            self._removed([key])

    async def _drop_bad_copy_async(self, key: bytes, delete: Callable[[], Awaitable[object]]) -> None:
        """:meth:`_drop_bad_copy` with a coroutine."""
        try:
            await delete()
        except Exception as de:
            log.warning("%s: removing bad chunk %s failed: %r", self.tier_type, key.hex()[:32], de)
        finally:
            self._removed([key])

    def _evicted(self, key: bytes, exc: BaseException | None) -> None:
        self._stats.incr("evictions")
        if exc is not None and not is_not_found(exc):
            log.warning("%s: evicting %s failed: %r", self.tier_type, key.hex()[:32], exc)
