"""The runtime every helper-based tier inherits: common parameters, lifecycle, the contract's
argument checks, the scheduler, stats.

:class:`ChunkTier` runs each call as jobs on the tier's engine (:mod:`asynctier.engines.base`)
and turns their outcomes into a :class:`~asynctier.stats.TransferResult`. Tier authors subclass
:class:`~asynctier.core.blocking.BlockingChunkTier` or :class:`~asynctier.core.coroutine.AsyncChunkTier`
instead; the hooks a subclass may override are listed in docs/writing-a-tier.md.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

import anyio

from ..contract import SecondaryTierManager
from ..engines.base import Engine, new_batch_of
from ..engines.threads import EngineStoppedError
from ..errors import BackpressureError, TierClosedError, TierConfigError
from ..lru import LRUIndex
from ..spec import OffloadingSpec
from ..stats import StatsRecorder, TierStats, TransferResult
from .backend import LoopCaller, in_this_process, loop_caller, run_to_completion
from .bookkeeping import Bookkeeping
from .framing import Framing
from .jobs import CANCELLED, SKIPPED, Batch, Job, Outcomes, Skipped
from .lifecycle import Lifecycle
from .ops import Op
from .validation import check_keys, check_pairs, positive_int, seconds

__all__ = ["ChunkTier", "MAX_INFLIGHT"]

log = logging.getLogger("asynctier.core")

#: The most chunk I/Os a tier may keep in flight (each is a worker thread or task).
MAX_INFLIGHT = 1024


class ChunkTier(Bookkeeping, Lifecycle, SecondaryTierManager):
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
    #: ``capacity_bytes`` sizes what the tier makes (a slab) rather than bounding what it
    #: holds: ``asynctier fsck`` keeps it (it opens other tiers unbounded, so that nothing
    #: it checks is evicted at open).
    capacity_sizes_medium: ClassVar[bool] = False
    #: ``timeout_s`` bounds the tier's chunk I/O (the engine does for async tiers; a blocking
    #: tier's own client, as the obj tier's does). A tier whose I/O nothing cuts off sets False:
    #: ``timeout_s`` is then refused rather than accepted and ignored.
    applies_timeout: ClassVar[bool] = True
    #: The tier stores and checks the project's chunk header itself (the built-in tiers do, in
    #: their own formats). Otherwise the base class frames each chunk for ``write_chunk`` and
    #: checks what ``read_chunk`` returns (:mod:`asynctier.core.framing`).
    frames_own_bytes: ClassVar[bool] = False
    #: What the tier stores outlives the process: a later process built with the same config
    #: sees it. False for a tier in process memory (``asynctier fsck`` skips it in a chain).
    persistent: bool = True  # (a class attribute; an instance may say otherwise: obj's memory://)
    #: The tier fills its index itself as it opens (the fs tier scans its directories).
    #: Otherwise a persistent tier with ``uses_index`` has its index filled from
    #: ``list_chunks()`` at open: chunks stored by an earlier process are served, counted
    #: against ``capacity_bytes`` and evicted like the others.
    recovers_index: ClassVar[bool] = False

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
        self._own_view = self._view is not primary_kv_view  # a cast of the caller's: released at close
        self.max_inflight = positive_int("max_inflight", max_inflight)
        if self.max_inflight is not None and self.max_inflight > MAX_INFLIGHT:
            raise TierConfigError(f"max_inflight must be at most {MAX_INFLIGHT}; got {max_inflight!r}")
        if store_backpressure not in ("wait", "drop"):
            raise TierConfigError(f"store_backpressure must be 'wait' or 'drop'; got {store_backpressure!r}")
        self.store_backpressure = store_backpressure
        self.backpressure_timeout_s = seconds("backpressure_timeout_s", backpressure_timeout_s, zero_ok=True)
        self.capacity_bytes = positive_int("capacity_bytes", capacity_bytes, allow_none=True)
        if self.capacity_bytes is not None and not (self.uses_index or self.handles_capacity):
            raise TierConfigError(
                f"the {self.tier_type!r} tier does not bound what it holds: capacity_bytes is accepted only by "
                "tiers with uses_index = True (or handles_capacity = True); leave it out (None)"
            )
        # (every store then failed)
        if self.capacity_bytes is not None and self.capacity_bytes < offloading_spec.chunk_bytes:
            raise TierConfigError(
                f"capacity_bytes={self.capacity_bytes} is less than one chunk ({offloading_spec.chunk_bytes} bytes)"
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
        if timeout_s is not None and not self.applies_timeout:
            raise TierConfigError(
                f"the {self.tier_type!r} tier's chunk I/O is not cut off by a deadline: timeout_s is accepted only "
                "by tiers that apply it (obj, valkey, an AsyncChunkTier); leave it out (None)"
            )
        # (0 failed every chunk)
        self.timeout_s = None if timeout_s is None else seconds("timeout_s", timeout_s, zero_ok=False)
        if self.uses_index:
            self.index: LRUIndex | None = LRUIndex(self.capacity_bytes, track_removals=True)
        else:
            self.index = None
        self._stats = StatsRecorder()
        self._framing = Framing(offloading_spec, verify)
        self._init_lifecycle()
        self._engine: Engine | None = None
        self._new_batch: Callable[[int, Op], Batch] = lambda size, op: Batch(size)  # the engine's, once open
        # calls in progress, from any loop (a tier on the threads engine serves several): counted
        # under a lock, and each drain() is woken on its own loop
        self._active = 0
        self._active_lock = threading.Lock()
        self._idle: list[tuple[anyio.Event, LoopCaller, int]] = []  # the drain()s waiting (not per call)

    # -- hooks for subclasses (docs/writing-a-tier.md) -------------------------------------
    def make_engine(self) -> Engine:
        raise NotImplementedError

    async def _open_medium(self) -> None:
        raise NotImplementedError

    async def _close_medium(self) -> None:
        raise NotImplementedError

    def job_body(self, op: Op) -> Callable[..., Any]:
        """The body of a one-chunk job of ``op``: ``fn(key, chunk_id, t0)``."""
        raise NotImplementedError

    def group_size(self, op: Op, n: int) -> int:
        """Chunks per job for a call of ``n`` chunks (default 1: one job per chunk).

        A tier that can move several chunks in one I/O (adjacent slots, say) returns more
        than 1 for stores and loads and implements :meth:`group_body`. A group job holds one
        in-flight slot, runs ahead of or behind others by the same priorities, is dropped or
        withdrawn as a whole, and returns one outcome per chunk.
        """
        return 1

    def group_body(self, op: Op) -> Callable[[list[bytes], list[int], float], Any]:
        """The body of a group job: ``fn(keys, chunk_ids, t0)`` -> each chunk's failure or None
        (a coroutine function where the tier's engine awaits its job bodies, as
        :meth:`job_body`)."""
        raise NotImplementedError

    def on_idle(self) -> None:
        """Called on the event-loop thread when the last call in progress returns (default:
        nothing). For background work that must keep off the loop's way while calls run."""

    async def _list_chunks(self) -> list[bytes]:
        raise NotImplementedError

    @property
    def media(self) -> tuple[str, ...]:
        """Where the tier keeps its chunks, as another tier on the same place names it (a
        resolved path; a server and key prefix): a chain refuses two members that share one.
        Empty: unknown, or a place of its own. Set it in ``__init__``; asked by a chain's
        constructor only (the built-in tiers work theirs out then: resolving a path is I/O,
        which a constructor must not do)."""
        given: tuple[str, ...] | None = getattr(self, "_media", None)
        return self._places() if given is None else given

    @media.setter
    def media(self, places: tuple[str, ...]) -> None:
        self._media = tuple(places)

    def _places(self) -> tuple[str, ...]:
        """:attr:`media` worked out when asked (the built-in tiers')."""
        return ()

    def stored_chunk_count(self) -> int | None:
        """Chunks held, for tiers without an index (None = unknown)."""
        return None

    def used_byte_count(self) -> int | None:
        """Bytes held, for tiers without an index (None = unknown)."""
        return None

    # -- lifecycle (core/lifecycle.py: open once, close once) ------------------------------
    async def open(self) -> ChunkTier:
        await self._open_once()
        return self

    async def _opening(self) -> None:
        engine = self.make_engine()
        try:
            engine.start()
            await self._open_medium()
        except BaseException:
            await run_to_completion(engine.stop)  # a failed or cancelled open leaves nothing running
            raise
        self._engine = engine
        self._new_batch = new_batch_of(engine)
        # a tier dropped without aclose() must not leave its workers behind
        weakref.finalize(self, in_this_process(engine.stop_nowait))

    def _check_close(self) -> None:
        # an engine bound to the loop it was opened on stops on it, or once it is gone
        check: Callable[[], None] | None = getattr(self._engine, "check_stop_here", None)
        if check is not None:
            check()

    async def _closing_down(self) -> None:
        try:
            await self.drain()
            await self._close_medium()
        finally:
            if self._engine is not None:
                await self._engine.stop()

    def _closed(self) -> None:
        self._release_view()

    def _release_view(self) -> None:
        """Let go of the caller's buffer once closed: a closed tier the caller still references
        must not keep it exported (an mmap could not be unmapped). A stand-in of the same
        writability keeps the argument checks' errors as they were (then: closed)."""
        if not self._own_view:
            return  # the caller's own view object: theirs to release
        self._own_view = False
        self._view = release_view(self._view)

    async def drain(self) -> None:
        self._refuse_if_forked()  # (the parent's calls are not this process's to wait for)
        while True:
            with self._active_lock:
                if not self._active:
                    return
                idle = anyio.Event()
                self._idle.append((idle, loop_caller(), threading.get_ident()))
            await idle.wait()

    # -- the contract ----------------------------------------------------------------------
    async def offload(self, keys: Sequence[bytes], chunk_ids: Sequence[int]) -> TransferResult:
        ks, ids = check_pairs(self.offloading_spec, self._view, keys, chunk_ids, load=False)
        self._check_open()
        return await self._run(Op.STORE, ks, ids)

    async def load(self, keys: Sequence[bytes], chunk_ids: Sequence[int]) -> TransferResult:
        ks, ids = check_pairs(self.offloading_spec, self._view, keys, chunk_ids, load=True)
        self._check_open()
        return await self._run(Op.LOAD, ks, ids)

    async def remove(self, keys: Sequence[bytes]) -> TransferResult:
        ks = check_keys(keys)
        self._check_open()
        return await self._run(Op.REMOVE, ks, [0] * len(ks))

    async def lookup(self, keys: Sequence[bytes]) -> list[bool]:
        ks = check_keys(keys)
        self._check_open()
        if self.index is not None:
            idx = self.index
            return [k in idx for k in ks]
        res = await self._run(Op.LOOKUP, ks, [0] * len(ks))
        # an unreachable medium answers "not stored": lookup is a hint, load is the truth
        return [k in res.succeeded for k in ks]

    async def lookup_prefix(self, keys: Sequence[bytes]) -> int:
        ks = check_keys(keys)
        self._check_open()
        if self.index is not None:  # from memory, stopping at the first miss
            idx = self.index
            n = 0
            for k in ks:
                if k not in idx:
                    break
                n += 1
            return n
        return await super().lookup_prefix(ks)

    async def touch(self, keys: Sequence[bytes]) -> None:
        ks = check_keys(keys)
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
        ks = check_keys(keys)
        if not isinstance(remove_bad, bool):  # (2 and 0.5 were read as flags, "no" as a ValueError)
            raise TypeError(f"remove_bad must be True or False; got {remove_bad!r:.80}")
        self._check_open()
        return await self._run(Op.VERIFY, ks, [int(remove_bad)] * len(ks))

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
            stored_chunks=len(idx) if idx is not None else self.stored_chunk_count(),
            used_bytes=idx.used_bytes if idx is not None else self.used_byte_count(),
            capacity_bytes=self.capacity_bytes,
            offload_latency=s.latency("offload"),
            load_latency=s.latency("load"),
            extra=extra,
        )

    # -- the scheduler ---------------------------------------------------------------------
    def _jobs(self, op: Op, keys: list[bytes], ids: list[int]) -> list[Job]:
        t0 = time.perf_counter()
        g = self.group_size(op, len(keys))
        if g > 1:
            gfn = self.group_body(op)
            batch = self._new_batch(-(-len(keys) // g), op)
            prio = op.priority
            if g >= len(keys):  # one job: the call's lists are its own copies already (check_pairs)
                return [Job(op, gfn, (keys, ids, t0), keys, batch, grouped=True, priority=prio)]
            jobs = []
            for i in range(0, len(keys), g):
                ks = keys[i : i + g]  # (a group body reads its keys, never changes them)
                jobs.append(Job(op, gfn, (ks, ids[i : i + g], t0), ks, batch, grouped=True, priority=prio))
            return jobs
        fn = self.job_body(op)
        batch = self._new_batch(len(keys), op)
        prio = op.priority
        return [Job(op, fn, (k, c, t0), (k,), batch, priority=prio) for k, c in zip(keys, ids)]

    async def _run(self, op: Op, keys: list[bytes], ids: list[int]) -> TransferResult:
        if not keys:
            return TransferResult("load" if op is Op.LOOKUP else op.value)
        t0 = time.perf_counter()
        jobs = self._jobs(op, keys, ids)
        engine = self._engine
        assert engine is not None
        with self._active_lock:
            self._active += 1
        drop = op is Op.STORE and self.store_backpressure == "drop"
        try:
            await engine.run(
                jobs,
                drop_after=(self.backpressure_timeout_s or 0.0) if drop else None,
                on_drop=self._dropped if drop else None,
            )
        except EngineStoppedError:  # its workers were told to end: the process is exiting
            raise TierClosedError(f"{self!r} is closed (its I/O workers have stopped)") from None
        finally:
            with self._active_lock:
                self._active -= 1
                last = self._active == 0
                waiting = self._idle if last and self._idle else None
                if waiting:
                    self._idle = []
            if waiting:  # drain()s wait, each on its own loop
                here = threading.get_ident()
                for idle, call, thread in waiting:
                    if thread == here:
                        idle.set()
                    else:
                        call(idle.set)
            if last:
                self.on_idle()
        return self._result(op, jobs, time.perf_counter() - t0)

    def _dropped(self, jobs: list[Job]) -> None:
        msg = f"store dropped: no I/O slot within {self.backpressure_timeout_s}s (max_inflight={self.max_inflight})"
        for j in jobs:
            errs: list[BaseException | None] = [BackpressureError(msg, k) for k in j.keys]
            for e in errs:
                self._stats.record_failure(e)  # type: ignore[arg-type]
            if j.grouped:
                j.result = errs
            else:
                j.exc = errs[0]

    def _result(self, op: Op, jobs: list[Job], elapsed: float) -> TransferResult:
        if op is Op.LOOKUP:
            res = TransferResult("load")  # op is not user-visible for lookups
            res.succeeded = [j.keys[0] for j in jobs if j.exc is None and j.result]
            return res
        res = TransferResult(op.value)
        nbytes = 0
        chunk = self.offloading_spec.chunk_bytes if op is not Op.REMOVE else 0
        for j in jobs:
            per: Outcomes
            if j.exc is not None:
                per = [j.exc] * len(j.keys)
            elif j.state == CANCELLED and j.result is None:  # withdrawn; only a cancelled caller gets here
                per = [anyio.get_cancelled_exc_class()()] * len(j.keys)
            elif j.grouped:
                per = j.result  # a group's outcomes (or its back-pressure drops)
                if not isinstance(per, list) or len(per) != len(j.keys):
                    # a group body that does not account for every chunk must not let the
                    # unaccounted ones pass as stored or loaded
                    bad = RuntimeError(f"group job returned {per!r:.80} for {len(j.keys)} chunks")
                    per = [bad] * len(j.keys)
                elif per.count(None) == len(per):  # the usual case, in bulk: every chunk done
                    res.succeeded += j.keys
                    nbytes += chunk * len(per)
                    continue
            else:
                per = [SKIPPED if j.result is SKIPPED else None]
            for k, e in zip(j.keys, per):
                if e is None:
                    res.succeeded.append(k)
                    nbytes += chunk
                elif isinstance(e, Skipped):  # stored already: a success that moved nothing
                    res.succeeded.append(k)
                    res.skipped.append(k)
                else:
                    res.failed[k] = e
        res.bytes_transferred = nbytes
        res.elapsed_s = elapsed
        return res


def release_view(view: memoryview) -> memoryview:
    """Release a view a tier made of the caller's buffer (a cast or a slice) and return an
    empty stand-in of the same writability, so argument checks still fail as before; if
    something still exports from it, return it as it is (it then goes with the tier)."""
    stand_in = memoryview(b"") if view.readonly else memoryview(bytearray())
    try:
        view.release()  # chunk slices taken from it are gone with the calls that took them
    except BufferError:
        return view
    return stand_in
