"""Base class for tiers whose per-chunk primitives are coroutines (async clients).

They run on the tasks engine (:mod:`asynctier.engines.tasks`), on whichever event loop
calls them: asyncio, uvloop or trio.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import anyio

from ..engines.base import Engine
from ..engines.tasks import TaskEngine
from ..errors import ChunkTimeoutError
from .backend import run_to_completion
from .base import ChunkTier
from .bookkeeping import is_not_found
from .jobs import Skipped
from .ops import Op

__all__ = ["AsyncChunkTier"]

log = logging.getLogger("asynctier.core")

T = TypeVar("T")


class AsyncChunkTier(ChunkTier):
    """A tier whose primitives are coroutines; at most ``max_inflight`` run at once.

    Same primitives as :class:`~asynctier.core.blocking.BlockingChunkTier`, as ``async def``.
    ``timeout_s`` bounds each chunk I/O (a late one fails with :class:`ChunkTimeoutError`).
    """

    async def write_chunk(self, key: bytes, data: memoryview) -> bool | None:
        """Store ``data`` under ``key``, atomically (False: held already, see
        :meth:`BlockingChunkTier.write_chunk`)."""
        raise NotImplementedError

    async def read_chunk(self, key: bytes, out: memoryview) -> int | None:
        """Fill ``out`` with the chunk stored under ``key`` (see :meth:`BlockingChunkTier.read_chunk`)."""
        raise NotImplementedError

    async def chunk_exists(self, key: bytes) -> bool:
        """Whether a chunk is stored under ``key``."""
        raise NotImplementedError

    async def delete_chunk(self, key: bytes) -> bool:
        """Delete the chunk stored under ``key``; return whether one was there."""
        raise NotImplementedError

    async def list_chunks(self) -> list[bytes]:
        """Every key stored on the medium (for ``fsck``); tiers with an index need not override."""
        raise NotImplementedError(f"the {self.tier_type!r} tier cannot list its chunks")

    async def open_medium(self) -> None:
        """Setup run once by ``open()``."""

    async def close_medium(self) -> None:
        """Teardown run once by ``aclose()`` after draining."""

    # -- framing (asynctier.core.framing) ---------------------------------------------------
    async def _write_framed(self, key: bytes, payload: memoryview) -> bool | None:
        if self.frames_own_bytes:
            return await self.write_chunk(key, payload.toreadonly())  # the caller's slot: read-only, as documented
        return await self.write_chunk(key, self._framing.frame(key, payload, per_thread=False))

    async def _read_checked(self, key: bytes, out: memoryview) -> None:
        if self.frames_own_bytes:
            await self.read_chunk(key, out)
        else:
            record = self._framing.read_buffer(key)
            filled = await self.read_chunk(key, record)
            self._framing.read_checked(key, record, filled, out)

    def make_engine(self) -> Engine:
        return TaskEngine(self.max_inflight or 1, name=f"asynctier-{self.tier_type}")

    async def _deadline(self, coro: Awaitable[T]) -> T:
        """Run one primitive under ``timeout_s``; on expiry it is cancelled (its I/O stops) first."""
        if self.timeout_s is None:
            return await coro
        with anyio.move_on_after(self.timeout_s) as scope:
            return await coro
        assert scope.cancelled_caught
        raise ChunkTimeoutError(f"chunk I/O exceeded timeout_s={self.timeout_s}")

    async def _open_medium(self) -> None:
        await self.open_medium()
        if self._needs_listing():
            try:
                listed: list[bytes] | None = await self.list_chunks()
            except NotImplementedError:
                listed = None
            except BaseException:
                # an open that fails leaves nothing open; cancelled, the undo runs to its end first
                try:
                    await run_to_completion(self.close_medium)
                except Exception as e:
                    log.warning("%s: closing after a failed open failed: %r", self.tier_type, e)
                raise
            self._index_listed(listed)

    async def _list_chunks(self) -> list[bytes]:
        return await self.list_chunks()

    async def _close_medium(self) -> None:
        await self.close_medium()

    def job_body(self, op: Op) -> Callable[..., Any]:
        return {
            "offload": self._store_job,
            "load": self._load_job,
            "remove": self._remove_job,
            "lookup": self._lookup_job,
            "verify": self._verify_job,
        }[op]

    async def _verify_job(self, key: bytes, remove_bad: int, t0: float) -> None:
        try:
            await self._deadline(self._read_checked(key, memoryview(bytearray(self.offloading_spec.chunk_bytes))))
        except BaseException as e:
            if self._end_verify(key, e, bool(remove_bad)):
                await self._drop_bad_copy_async(key, partial(self._delete_bad_in_time, key, e))
            raise

    async def _store_job(self, key: bytes, cid: int, t0: float) -> Skipped | None:
        async def evict_then_write(victims: list[bytes]) -> bool | None:
            for v in victims:
                try:
                    await self._deadline(self.delete_chunk(v))
                except Exception as e:
                    self._evicted(v, e)
                else:
                    self._evicted(v, None)
            self._removed(victims)  # re-stores of them may go on (_async_store repeats this harmlessly)
            return await self._deadline(self._write_framed(key, self._chunk(cid)))

        return await self._async_store(key, t0, evict_then_write)

    async def _load_job(self, key: bytes, cid: int, t0: float) -> None:
        entry = self._pin_for_load(key)
        await self._async_load(
            key,
            t0,
            lambda: self._deadline(self._read_checked(key, self._chunk(cid))),
            partial(self._delete_bad_in_time, key),  # a stalled server must not hang the load
            entry,
        )

    async def _delete_bad_in_time(self, key: bytes, exc: BaseException) -> None:
        await self._deadline(self.delete_bad_copy(key, exc))

    async def delete_bad_copy(self, key: bytes, exc: BaseException) -> None:
        """Delete the copy of ``key`` that failed verification with ``exc``: by key here; a
        tier that can name the copy it read (``IntegrityError.copy``) drops that one only."""
        await self.delete_chunk(key)

    async def _remove_job(self, key: bytes, cid: int, t0: float) -> None:
        if await self._after_removal_async(self._begin_remove, key):
            try:
                await self._deadline(self.delete_chunk(key))
            except BaseException as e:
                if not is_not_found(e):
                    self._end_remove(key, t0, e)
                    raise
            finally:
                self._removed([key])
        self._end_remove(key, t0, None)

    async def _lookup_job(self, key: bytes, cid: int, t0: float) -> bool:
        return await self._deadline(self.chunk_exists(key))
