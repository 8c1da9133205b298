"""Helper base classes for tier authors: write the per-chunk primitives, inherit the rest.

:class:`BlockingChunkTier` — primitives are plain blocking functions (system calls, sync
clients); they run on ``max_inflight`` worker threads. :class:`AsyncChunkTier` — primitives
are coroutines (async clients); they run on ``max_inflight`` asyncio tasks.

Either way the subclass writes four methods::

    write_chunk(key, data)   # store one chunk from a read-only memoryview slice
    read_chunk(key, out)     # fill `out` (a writable slice) or raise ChunkNotFoundError
    chunk_exists(key)        # -> bool
    delete_chunk(key)        # -> bool (was something deleted)

and inherits argument validation, the in-flight bound shared by all callers, loads ahead of
queued stores, store back-pressure (``wait`` or ``drop``), stats, capacity with LRU
eviction (``uses_index = True``), removal of chunks that fail verification, and
cancellation safety. Optional hooks: ``open_medium``/``close_medium`` (recovery, connections)
and :meth:`ChunkTier.stored_size` (bytes a chunk occupies, for capacity accounting).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import weakref
from collections.abc import Awaitable, Callable, KeysView, Sequence
from collections.abc import Set as AbstractSet
from typing import Any, ClassVar, Literal, TypeVar

from . import engines
from .contract import SecondaryTierManager
from .engines import CANCELLED, Batch, Engine, Job
from .errors import (
    BackpressureError,
    ChunkNotFoundError,
    ChunkTimeoutError,
    IntegrityError,
    TierClosedError,
    TierConfigError,
    TierNotOpenError,
)
from .lru import LRUIndex, RemovalPending
from .spec import OffloadingSpec
from .stats import StatsRecorder, TierStats, TransferResult

__all__ = ["AsyncChunkTier", "BlockingChunkTier", "ChunkTier", "MAX_KEY_BYTES"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Longest key accepted (keys are prefix hashes; this leaves room for them in chunk headers).
MAX_KEY_BYTES = 1024

_NEW, _OPEN, _CLOSING, _CLOSED = "new", "open", "closing", "closed"

#: How long a write or removal of a key waits for an earlier deletion of the same key. A
#: deletion is one unlink or request; this only bounds the harm of one that is never reported.
REMOVAL_WAIT_S = 30.0


def _positive_int(name: str, value: object, *, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        accepted = "a positive int" + (" or None" if allow_none else "")
        raise TierConfigError(f"{name} must be {accepted}; got {value!r}")
    return value


def _non_negative_float(name: str, value: object, *, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
        accepted = "a finite number >= 0" + (" or None" if allow_none else "")
        raise TierConfigError(f"{name} must be {accepted}; got {value!r}")
    return float(value)


def _retrieved(fut: asyncio.Future[Any]) -> None:
    """Done callback: mark a background future's exception as seen (its awaiters re-raise it)."""
    if not fut.cancelled():
        fut.exception()


def _unordered(items: object) -> bool:
    """A set: iterated in hash order (a dict and its keys() keep insertion order)."""
    return isinstance(items, AbstractSet) and not isinstance(items, KeysView)


def _is_not_found(exc: BaseException) -> bool:
    return isinstance(exc, (ChunkNotFoundError, FileNotFoundError))


class ChunkTier(SecondaryTierManager):
    """Everything but the primitives; subclass :class:`BlockingChunkTier` or :class:`AsyncChunkTier`.

    Args (the common knobs every built-in tier shares):
        max_inflight: chunk I/Os running at once, across all callers (default 16).
        store_backpressure: ``"wait"`` (stores wait for a free slot) or ``"drop"`` (a store
            that gets no slot within ``backpressure_timeout_s`` fails with
            :class:`~asynctier.errors.BackpressureError`). Loads are never dropped.
        backpressure_timeout_s: how long a store may wait in ``"drop"`` mode (default 0.05).
        capacity_bytes: bytes the tier may hold (None = unbounded); least recently used
            chunks are evicted to make room. Needs a tier with ``uses_index = True``.
        durability: ``"none"`` or ``"fsync"`` (tiers list what they support).
        verify: verify checksums on load (default True).
        timeout_s: deadline per chunk I/O (None = none); enforced by the engine for async
            tiers, by the tier's client for blocking ones.
    """

    #: Durability modes this tier can honour.
    supported_durability: ClassVar[tuple[str, ...]] = ("none",)
    #: Keep an authoritative in-memory :class:`LRUIndex` of stored chunks (O(1) lookup,
    #: capacity with LRU eviction, skip of chunks already present).
    uses_index: ClassVar[bool] = False
    #: The tier enforces ``capacity_bytes`` itself (a fixed slab, its own LRU); without this
    #: or ``uses_index``, ``capacity_bytes`` is refused rather than accepted and ignored.
    handles_capacity: ClassVar[bool] = False

    def __init__(
        self,
        *,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str | None = None,
        max_inflight: int = 16,
        store_backpressure: Literal["wait", "drop"] = "wait",
        backpressure_timeout_s: float = 0.05,
        capacity_bytes: int | None = None,
        durability: Literal["none", "fsync"] = "none",
        verify: bool = True,
        timeout_s: float | None = None,
    ) -> None:
        if not isinstance(offloading_spec, OffloadingSpec):
            raise TypeError(f"offloading_spec must be an OffloadingSpec; got {type(offloading_spec).__name__}")
        self.offloading_spec = offloading_spec
        self.tier_type = tier_type or self.default_type or type(self).__name__
        self._view = offloading_spec.check_view(primary_kv_view, writable=False)
        self.max_inflight = _positive_int("max_inflight", max_inflight)
        if store_backpressure not in ("wait", "drop"):
            raise TierConfigError(f"store_backpressure must be 'wait' or 'drop'; got {store_backpressure!r}")
        self.store_backpressure = store_backpressure
        self.backpressure_timeout_s = _non_negative_float("backpressure_timeout_s", backpressure_timeout_s)
        self.capacity_bytes = _positive_int("capacity_bytes", capacity_bytes, allow_none=True)
        if self.capacity_bytes is not None and not (self.uses_index or self.handles_capacity):
            raise TierConfigError(
                f"the {self.tier_type!r} tier does not bound what it holds: capacity_bytes is accepted only by "
                "tiers with uses_index = True (or handles_capacity = True); leave it out (None)"
            )
        if durability not in self.supported_durability:
            raise TierConfigError(
                f"durability={durability!r} is not supported by the {self.tier_type!r} tier; "
                f"accepted: {', '.join(map(repr, self.supported_durability))}"
            )
        self.durability = durability
        if not isinstance(verify, bool):
            raise TierConfigError(f"verify must be True or False; got {verify!r}")
        self.verify = verify
        self.timeout_s = _non_negative_float("timeout_s", timeout_s, allow_none=True)
        if self.uses_index:
            self.index: LRUIndex | None = LRUIndex(self.capacity_bytes, track_removals=True)
        else:
            self.index = None
        self._stats = StatsRecorder()
        self._state = _NEW
        self._engine: Engine | None = None
        self._open_lock: asyncio.Lock | None = None  # open() and the close, one at a time
        self._close_task: asyncio.Future[None] | None = None  # the close every aclose() waits for
        self._active = 0
        self._idle: asyncio.Event | None = None

    # -- hooks for subclasses --------------------------------------------------------------
    def stored_size(self) -> int:
        """Bytes one chunk occupies on the medium (capacity accounting); default: payload only."""
        return self.offloading_spec.chunk_bytes

    def _make_engine(self) -> Engine:
        raise NotImplementedError

    async def _open_medium(self) -> None:
        raise NotImplementedError

    async def _close_medium(self) -> None:
        raise NotImplementedError

    def _job_fn(self, op: str) -> Callable[..., Any]:
        raise NotImplementedError

    def _group_size(self, op: str, n: int) -> int:
        """Chunks per job for a call of ``n`` chunks (default 1: one job per chunk).

        A tier that can move several chunks in one I/O (adjacent slots, say) returns more
        than 1 for ``"offload"``/``"load"`` and implements :meth:`_group_job_fn`. A group job
        holds one in-flight slot, runs ahead of or behind others by the same priorities, is
        dropped or withdrawn as a whole, and returns one outcome per chunk.
        """
        return 1

    def _group_job_fn(self, op: str) -> Callable[[list[bytes], list[int], float], list[BaseException | None]]:
        """The job body for a group: ``fn(keys, chunk_ids, t0)`` -> each chunk's failure or None."""
        raise NotImplementedError

    def _became_idle(self) -> None:
        """Called on the event-loop thread when the last call in progress returns (default:
        nothing). For background work that must keep off the loop's way while calls run."""

    # -- lifecycle -------------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        """True between a successful ``open()`` and ``aclose()``."""
        return self._state == _OPEN

    async def open(self) -> ChunkTier:
        if self._state == _OPEN:
            return self
        if self._state in (_CLOSING, _CLOSED) or self._close_task is not None:
            raise TierClosedError(f"{self!r} is closed; create a new tier instead of reopening")
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:
            if self._state == _OPEN:
                return self
            if self._state in (_CLOSING, _CLOSED) or self._close_task is not None:  # closed while we waited
                raise TierClosedError(f"{self!r} is closed; create a new tier instead of reopening")
            engine = self._make_engine()
            engine.start()
            try:
                await self._open_medium()
            except BaseException:
                await engine.stop()
                raise
            self._engine = engine
            # a tier dropped without aclose() must not leave its workers behind
            weakref.finalize(self, engine.stop_nowait)
            self._idle = asyncio.Event()
            self._idle.set()
            self._state = _OPEN
        return self

    async def aclose(self) -> None:
        # One close for all callers, run as a task: a second aclose() returns only once the
        # medium is released, and a cancelled one leaves the close to finish (shielded).
        if self._state == _CLOSED:
            return
        task = self._close_task
        if task is None:
            if self._state == _OPEN:
                self._state = _CLOSING  # no new calls from here on
            task = self._close_task = asyncio.ensure_future(self._close())
            task.add_done_callback(_retrieved)
        await asyncio.shield(task)

    async def _close(self) -> None:
        if self._open_lock is None:
            self._open_lock = asyncio.Lock()
        async with self._open_lock:  # an open() in progress ends first; then it is closed here
            if self._state == _CLOSED:
                return
            if self._state == _NEW:  # never opened
                self._state = _CLOSED
                return
            self._state = _CLOSING
            try:
                await self.drain()
                await self._close_medium()
            finally:
                if self._engine is not None:
                    await self._engine.stop()
                self._state = _CLOSED

    async def drain(self) -> None:
        if self._idle is not None:
            await self._idle.wait()

    def _check_open(self) -> None:
        if self._state == _OPEN:
            return
        if self._state == _NEW:
            raise TierNotOpenError(f"{self!r} is not open: use 'async with tier:' or 'await tier.open()' first")
        raise TierClosedError(f"{self!r} is closed")

    # -- argument checks (before any I/O) --------------------------------------------------
    @staticmethod
    def _check_keys(keys: Sequence[bytes]) -> list[bytes]:
        if isinstance(keys, (bytes, bytearray, memoryview, str)):
            raise TypeError("keys must be a sequence of bytes keys (for example [key]), not a single key")
        if _unordered(keys):  # keys would meet the wrong slots
            raise TypeError(f"keys must be an ordered sequence (a list or tuple), paired with chunk_ids by "
                            f"position; got a {type(keys).__name__}")  # fmt: skip
        out = list(keys)
        for k in out:
            if type(k) is not bytes:
                raise TypeError(f"each key must be bytes; got {type(k).__name__} {k!r:.60}")
            if not k or len(k) > MAX_KEY_BYTES:
                raise ValueError(f"each key must be 1..{MAX_KEY_BYTES} bytes long; got {len(k)} bytes")
        if len(set(out)) != len(out):
            raise ValueError("keys must be distinct within one call")
        return out

    def _check_pairs(
        self, keys: Sequence[bytes], chunk_ids: Sequence[int], *, load: bool
    ) -> tuple[list[bytes], list[int]]:
        ks = self._check_keys(keys)
        if isinstance(chunk_ids, (bytes, bytearray, str)) or _unordered(chunk_ids):
            raise TypeError(
                f"chunk_ids must be an ordered sequence of ints (a list or tuple); got a {type(chunk_ids).__name__}"
            )
        ids = [self.offloading_spec.check_chunk_id(c) for c in chunk_ids]
        if len(ks) != len(ids):
            raise ValueError(f"got {len(ks)} keys but {len(ids)} chunk ids; they pair up one to one")
        if load:
            if self._view.readonly:
                raise TypeError("primary_kv_view is read-only; load needs a writable buffer")
            if len(set(ids)) != len(ids):
                raise ValueError("chunk ids must be distinct within one load (two keys cannot fill one slot)")
        return ks, ids

    # -- the contract ----------------------------------------------------------------------
    async def offload(self, keys: Sequence[bytes], chunk_ids: Sequence[int]) -> TransferResult:
        ks, ids = self._check_pairs(keys, chunk_ids, load=False)
        self._check_open()
        return await self._run("offload", engines.PRIO_STORE, ks, ids)

    async def load(self, keys: Sequence[bytes], chunk_ids: Sequence[int]) -> TransferResult:
        ks, ids = self._check_pairs(keys, chunk_ids, load=True)
        self._check_open()
        return await self._run("load", engines.PRIO_LOAD, ks, ids)

    async def remove(self, keys: Sequence[bytes]) -> TransferResult:
        ks = self._check_keys(keys)
        self._check_open()
        return await self._run("remove", engines.PRIO_REMOVE, ks, [0] * len(ks))

    async def lookup(self, keys: Sequence[bytes]) -> list[bool]:
        ks = self._check_keys(keys)
        self._check_open()
        if self.index is not None:
            idx = self.index
            return [k in idx for k in ks]
        res = await self._run("lookup", engines.PRIO_LOOKUP, ks, [0] * len(ks))
        # an unreachable medium answers "not stored": lookup is a hint, load is the truth
        return [k in res.succeeded for k in ks]

    async def touch(self, keys: Sequence[bytes]) -> None:
        ks = self._check_keys(keys)
        self._check_open()
        if self.index is not None:
            self.index.touch(ks)

    async def stored_keys(self) -> list[bytes]:
        """Every key the tier holds (from the index, else by listing the medium)."""
        self._check_open()
        if self.index is not None:
            return self.index.keys()
        return await self._list_chunks()

    async def verify_chunks(self, keys: Sequence[bytes], *, remove_bad: bool = False) -> TransferResult:
        """Read ``keys`` into scratch memory and check them (as ``fsck`` does).

        The primary buffer is not touched. A chunk that fails verification is in ``failed``
        with its :class:`IntegrityError`; it is deleted only with ``remove_bad=True``.
        Checksums are checked when the tier was built with ``verify=True`` (the default).
        """
        ks = self._check_keys(keys)
        self._check_open()
        return await self._run("verify", engines.PRIO_REMOVE, ks, [int(remove_bad)] * len(ks))

    async def _list_chunks(self) -> list[bytes]:
        raise NotImplementedError

    def stats(self) -> TierStats:
        s = self._stats
        eng = self._engine
        idx = self.index
        with s._lock:
            failures = dict(s.failures)
            extra = dict(s.extra)
            counters = (s.offloaded, s.loaded, s.skipped, s.removed, s.bytes_written, s.bytes_read, s.evictions)
        return TierStats(
            tier_type=self.tier_type,
            in_flight=eng.in_flight if eng else 0,
            peak_in_flight=eng.peak_in_flight if eng else 0,
            queued=eng.queued if eng else 0,
            max_inflight=self.max_inflight or 0,
            offloaded=counters[0],
            loaded=counters[1],
            skipped=counters[2],
            removed=counters[3],
            bytes_written=counters[4],
            bytes_read=counters[5],
            failures=failures,
            evictions=counters[6],
            stored_chunks=len(idx) if idx is not None else self._stored_chunks(),
            used_bytes=idx.used_bytes if idx is not None else self._used_bytes(),
            capacity_bytes=self.capacity_bytes,
            offload_latency=s.latency("offload"),
            load_latency=s.latency("load"),
            extra=extra,
        )

    def _stored_chunks(self) -> int | None:
        """Chunks held, for tiers without an index (None = unknown)."""
        return None

    def _used_bytes(self) -> int | None:
        """Bytes held, for tiers without an index (None = unknown)."""
        return None

    # -- the scheduler ---------------------------------------------------------------------
    async def _run(self, op: str, priority: int, keys: list[bytes], ids: list[int]) -> TransferResult:
        if not keys:
            return TransferResult("load" if op == "lookup" else op)  # type: ignore[arg-type]
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        g = self._group_size(op, len(keys))
        args: list[tuple[Any, ...]]
        if g > 1:
            fn: Callable[..., Any] = self._group_job_fn(op)
            args = [(keys[i : i + g], ids[i : i + g], t0) for i in range(0, len(keys), g)]
        else:
            fn = self._job_fn(op)
            args = [(k, c, t0) for k, c in zip(keys, ids)]
        batch = Batch(loop, len(args))
        jobs = [Job(priority, fn, a, batch) for a in args]
        engine = self._engine
        assert engine is not None and self._idle is not None
        self._active += 1
        self._idle.clear()
        timer: asyncio.TimerHandle | None = None
        try:
            engine.submit(jobs)
            if op == "offload" and self.store_backpressure == "drop":
                timer = loop.call_later(self.backpressure_timeout_s or 0.0, self._drop_waiting, jobs)
            await self._wait_all(engine, batch, jobs)
        finally:
            if timer is not None:
                timer.cancel()
            self._active -= 1
            if self._active == 0:
                self._idle.set()
                self._became_idle()
        return self._result(op, keys, jobs, time.perf_counter() - t0)

    @staticmethod
    async def _wait_all(engine: Engine, batch: Batch, jobs: list[Job]) -> None:
        try:
            # shield: a cancelled caller must not cancel the batch future it still waits on
            await asyncio.shield(batch.future)
        except asyncio.CancelledError:
            # No new I/O of this call starts; I/O already running touches the caller's
            # buffer, so the caller hears of the cancellation only once it has finished.
            engine.cancel_pending(jobs)
            while not batch.future.done():
                try:
                    await asyncio.shield(batch.future)
                except asyncio.CancelledError:
                    pass
            raise

    def _drop_waiting(self, jobs: list[Job]) -> None:
        assert self._engine is not None
        msg = f"store dropped: no I/O slot within {self.backpressure_timeout_s}s (max_inflight={self.max_inflight})"
        for j in self._engine.cancel_pending(jobs):
            if isinstance(j.args[0], list):  # a group: one failure per chunk
                errs: list[BaseException | None] = [BackpressureError(msg, k) for k in j.args[0]]
                for e in errs:
                    self._stats.record_failure(e)  # type: ignore[arg-type]
                j.result = errs
            else:
                j.exc = BackpressureError(msg, j.args[0])
                self._stats.record_failure(j.exc)

    def _result(self, op: str, keys: list[bytes], jobs: list[Job], elapsed: float) -> TransferResult:
        if op == "lookup":
            res = TransferResult("load")  # op is not user-visible for lookups
            res.succeeded = [k for k, j in zip(keys, jobs) if j.exc is None and j.result]
            return res
        res = TransferResult(op)  # type: ignore[arg-type]
        nbytes = 0
        chunk = self.offloading_spec.chunk_bytes if op != "remove" else 0
        for j in jobs:
            gk = j.args[0] if isinstance(j.args[0], list) else [j.args[0]]
            per: list[BaseException | None]
            if j.exc is not None:
                per = [j.exc] * len(gk)
            elif j.state == CANCELLED and j.result is None:  # withdrawn; only a cancelled caller gets here
                per = [asyncio.CancelledError()] * len(gk)
            elif gk is j.args[0]:
                per = j.result  # a group's outcomes (or its back-pressure drops)
                if not isinstance(per, list) or len(per) != len(gk):
                    # a group body that does not account for every chunk must not let the
                    # unaccounted ones pass as stored or loaded
                    bad = RuntimeError(f"group job returned {per!r:.80} for {len(gk)} chunks")
                    per = [bad] * len(gk)
            else:
                per = [None]
            for k, e in zip(gk, per):
                if e is None:
                    res.succeeded.append(k)
                    nbytes += chunk
                else:
                    res.failed[k] = e
        res.bytes_transferred = nbytes
        res.elapsed_s = elapsed
        return res

    # -- bookkeeping shared by the blocking and async job bodies ---------------------------
    def _chunk(self, cid: int) -> memoryview:
        return self.offloading_spec.chunk_view(self._view, cid)

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

    def _begin_load(self, key: bytes) -> object | None:
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
            if exc is not None and (_is_not_found(exc) or isinstance(exc, IntegrityError)):
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
        await asyncio.to_thread(self._wait_removal, pending)  # rare: a key re-stored as it is evicted

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
            return self._begin_load(key)
        except BaseException as e:
            self._stats.record_failure(e)
            raise

    async def _async_store(self, key: bytes, t0: float, write: Callable[[list[bytes]], Awaitable[None]]) -> None:
        """One store run as a coroutine: reserve (or skip a key already stored),
        ``write(victims)`` (evict them, then write), commit or abort."""
        victims = await self._after_removal_async(self._reserve_store, key, t0)
        if victims is None:
            return
        try:
            await write(victims)
        except BaseException as e:
            self._end_store(key, t0, e)
            raise
        finally:
            self._removed(victims)  # write() deleted them (or failed to): re-stores of them may go on
        self._end_store(key, t0, None)

    async def _async_load(
        self,
        key: bytes,
        t0: float,
        read: Callable[[], Awaitable[None]],
        delete: Callable[[], Awaitable[object]],
        entry: object | None = None,
    ) -> None:
        """One load run as a coroutine, after :meth:`_pin_for_load`: ``read()``, account it,
        and drop a copy that failed verification with ``delete()``."""
        try:
            await read()
        except BaseException as e:
            if self._end_load(key, t0, e, entry):
                try:
                    await delete()
                except Exception as de:
                    log.warning("%s: removing bad chunk %s failed: %r", self.tier_type, key.hex()[:32], de)
                finally:
                    self._removed([key])
            raise
        self._end_load(key, t0, None, entry)

    def _evicted(self, key: bytes, exc: BaseException | None) -> None:
        self._stats.incr("evictions")
        if exc is not None and not _is_not_found(exc):
            log.warning("%s: evicting %s failed: %r", self.tier_type, key.hex()[:32], exc)


class BlockingChunkTier(ChunkTier):
    """A tier whose primitives block; they run on ``max_inflight`` worker threads.

    Subclasses implement :meth:`write_chunk`, :meth:`read_chunk`, :meth:`chunk_exists`,
    :meth:`delete_chunk`, and optionally :meth:`open_medium` / :meth:`close_medium`.
    Primitives are called from several threads at once.
    """

    # -- primitives ------------------------------------------------------------------------
    def write_chunk(self, key: bytes, data: memoryview) -> None:
        """Store ``data`` (read-only, ``chunk_bytes`` long) under ``key``, atomically."""
        raise NotImplementedError

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        """Fill ``out`` with the chunk stored under ``key``.

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

    # -- wiring ----------------------------------------------------------------------------
    def _make_engine(self) -> Engine:
        return engines.ThreadEngine(self.max_inflight or 1, name=f"asynctier-{self.tier_type}")

    async def _open_medium(self) -> None:
        loop = asyncio.get_running_loop()
        setup = loop.run_in_executor(None, self.open_medium)
        try:
            await asyncio.shield(setup)
        except asyncio.CancelledError:
            # The thread cannot be stopped: let it finish, and undo what it set up (descriptors,
            # locks, threads) before the cancellation goes on; else they outlive the tier.
            await engines.wait_to_end(setup)
            if not setup.cancelled() and setup.exception() is None:
                undo = loop.run_in_executor(None, self.close_medium)
                await engines.wait_to_end(undo)
                if not undo.cancelled() and undo.exception() is not None:
                    log.warning("%s: closing after a cancelled open failed: %r", self.tier_type, undo.exception())
            raise

    async def _list_chunks(self) -> list[bytes]:
        return await asyncio.to_thread(self.list_chunks)

    async def _close_medium(self) -> None:
        await asyncio.to_thread(self.close_medium)

    def _job_fn(self, op: str) -> Callable[..., Any]:
        return {
            "offload": self._store_job,
            "load": self._load_job,
            "remove": self._remove_job,
            "lookup": self._lookup_job,
            "verify": self._verify_job,
        }[op]

    def _coroutine_job_fn(
        self,
        op: str,
        offload: Callable[..., Awaitable[Any]],
        load: Callable[..., Awaitable[Any]],
        run: Callable[..., Awaitable[Any]] | None = None,
    ) -> Callable[..., Any]:
        """Job bodies for a blocking tier whose engine is async (an io_uring served by the
        event loop): the ``offload``/``load`` coroutines on the hot path; the blocking bodies
        of the other operations (remove, lookup, verify: rare) on a thread, through ``run``
        (default :func:`asyncio.to_thread`)."""
        if op == "offload":
            return offload
        if op == "load":
            return load
        blocking = BlockingChunkTier._job_fn(self, op)
        runner = run or asyncio.to_thread

        async def on_thread(*args: Any) -> Any:
            return await runner(blocking, *args)

        return on_thread

    def _verify_job(self, key: bytes, remove_bad: int, t0: float) -> None:
        try:
            from .posix_io import aligned_buffer  # page-aligned: read as a load is (O_DIRECT)

            self.read_chunk(key, aligned_buffer(self.offloading_spec.chunk_bytes))
        except BaseException as e:
            if self._end_verify(key, e, bool(remove_bad)):
                try:
                    self._delete_bad_copy(key, e)
                except Exception as de:  # the chunk's failure stays the verification's
                    log.warning("%s: removing bad chunk %s failed: %r", self.tier_type, key.hex()[:32], de)
                finally:
                    self._removed([key])
            raise

    def _store_job(self, key: bytes, cid: int, t0: float) -> None:
        victims = self._reserve_store_blocking(key, t0)
        if victims is None:
            return
        try:
            try:
                for v in victims:
                    self._evict(v)
            finally:
                self._removed(victims)
            self.write_chunk(key, self._chunk(cid))
        except BaseException as e:
            self._end_store(key, t0, e)
            raise
        self._end_store(key, t0, None)

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
            self.read_chunk(key, self._chunk(cid))
        except BaseException as e:
            if self._end_load(key, t0, e, entry):
                try:
                    self._delete_bad_copy(key, e)
                except Exception as de:
                    log.warning("%s: removing bad chunk %s failed: %r", self.tier_type, key.hex()[:32], de)
                finally:
                    self._removed([key])
            raise
        self._end_load(key, t0, None, entry)

    def _delete_bad_copy(self, key: bytes, exc: BaseException) -> None:
        """Delete the copy of ``key`` that failed verification with ``exc``: by key here; a
        tier that can name the copy it read (``IntegrityError.copy``) drops that one only."""
        self.delete_chunk(key)

    def _remove_job(self, key: bytes, cid: int, t0: float) -> None:
        if self._after_removal(self._begin_remove, key):
            try:
                self.delete_chunk(key)
            except BaseException as e:
                if not _is_not_found(e):
                    self._end_remove(key, t0, e)
                    raise
            finally:
                self._removed([key])
        self._end_remove(key, t0, None)

    def _lookup_job(self, key: bytes, cid: int, t0: float) -> bool:
        return self.chunk_exists(key)


class AsyncChunkTier(ChunkTier):
    """A tier whose primitives are coroutines; they run on ``max_inflight`` asyncio tasks.

    Same primitives as :class:`BlockingChunkTier`, as ``async def``. ``timeout_s`` bounds each
    chunk I/O (a late one fails with :class:`ChunkTimeoutError`). The tier is bound to the
    event loop that opened it.
    """

    async def write_chunk(self, key: bytes, data: memoryview) -> None:
        """Store ``data`` under ``key``, atomically."""
        raise NotImplementedError

    async def read_chunk(self, key: bytes, out: memoryview) -> None:
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

    def _make_engine(self) -> Engine:
        return engines.AsyncEngine(self.max_inflight or 1, name=f"asynctier-{self.tier_type}")

    async def _deadline(self, coro: Awaitable[T]) -> T:
        """Run one primitive under ``timeout_s``; on expiry it is cancelled (its I/O stops) first."""
        if self.timeout_s is None:
            return await coro
        try:
            return await asyncio.wait_for(coro, self.timeout_s)
        except asyncio.TimeoutError:
            raise ChunkTimeoutError(f"chunk I/O exceeded timeout_s={self.timeout_s}") from None

    async def _open_medium(self) -> None:
        await self.open_medium()

    async def _list_chunks(self) -> list[bytes]:
        return await self.list_chunks()

    async def _close_medium(self) -> None:
        await self.close_medium()

    def _job_fn(self, op: str) -> Callable[..., Any]:
        return {
            "offload": self._store_job,
            "load": self._load_job,
            "remove": self._remove_job,
            "lookup": self._lookup_job,
            "verify": self._verify_job,
        }[op]

    async def _verify_job(self, key: bytes, remove_bad: int, t0: float) -> None:
        try:
            await self._deadline(self.read_chunk(key, memoryview(bytearray(self.offloading_spec.chunk_bytes))))
        except BaseException as e:
            if self._end_verify(key, e, bool(remove_bad)):
                try:
                    await self._deadline(self.delete_chunk(key))
                except Exception as de:  # the chunk's failure stays the verification's
                    log.warning("%s: removing bad chunk %s failed: %r", self.tier_type, key.hex()[:32], de)
                finally:
                    self._removed([key])
            raise

    async def _store_job(self, key: bytes, cid: int, t0: float) -> None:
        async def evict_then_write(victims: list[bytes]) -> None:
            for v in victims:
                try:
                    await self._deadline(self.delete_chunk(v))
                except Exception as e:
                    self._evicted(v, e)
                else:
                    self._evicted(v, None)
            self._removed(victims)  # re-stores of them may go on (_async_store repeats this harmlessly)
            await self._deadline(self.write_chunk(key, self._chunk(cid)))

        await self._async_store(key, t0, evict_then_write)

    async def _load_job(self, key: bytes, cid: int, t0: float) -> None:
        entry = self._pin_for_load(key)
        await self._async_load(
            key,
            t0,
            lambda: self._deadline(self.read_chunk(key, self._chunk(cid))),
            lambda: self._deadline(self.delete_chunk(key)),  # a stalled server must not hang the load
            entry,
        )

    async def _remove_job(self, key: bytes, cid: int, t0: float) -> None:
        if await self._after_removal_async(self._begin_remove, key):
            try:
                await self._deadline(self.delete_chunk(key))
            except BaseException as e:
                if not _is_not_found(e):
                    self._end_remove(key, t0, e)
                    raise
            finally:
                self._removed([key])
        self._end_remove(key, t0, None)

    async def _lookup_job(self, key: bytes, cid: int, t0: float) -> bool:
        return await self._deadline(self.chunk_exists(key))
