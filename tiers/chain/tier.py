"""``chain``: several tiers as one, fastest first (docs/tiers/chain.md).

Stores cascade down (``write="back"``: the call returns once the first tier that admits the
chunk has it, the tiers below are written in the background; ``"through"``: once every tier
has it or failed it). Loads take each key from the fastest tier holding it and promote a hit
in a lower tier to the tiers above in the background. Every tier sits behind its own
admission policy, deadline and circuit breaker, and the chain's results say which tier failed
which key (:attr:`~asynctier.stats.TransferResult.tier_failures`).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import anyio

from asynctier.buffers import allocate_buffer, fault_in
from asynctier.contract import SecondaryTierManager
from asynctier.core.backend import current_loop, in_this_process, loop_caller, run_on_thread_to_end, run_to_completion
from asynctier.core.base import release_view
from asynctier.core.lifecycle import Lifecycle
from asynctier.core.validation import check_keys, check_pairs
from asynctier.engines.base import refuse_close_elsewhere
from asynctier.errors import (
    BackpressureError,
    TierConfigError,
    failure_kind,
)
from asynctier.factory import SecondaryTierFactory
from asynctier.spec import OffloadingSpec
from asynctier.stats import StatsRecorder, TierStats, TransferResult

from .admission import make_policy
from .background import Backlog, RemovalFence
from .config import ChainConfig
from .demotion import Demoter
from .member import COUNTERS, Member
from .staging import StagingPool
from .transfers import ChainTransfers

__all__ = ["ChainTier"]

log = logging.getLogger("asynctier.chain")

#: Parallel batches per call at most (each holds the staging slots it was granted).
_WORKERS_PER_CALL = 1


def _media(tier: object) -> list[str]:
    """Where a member keeps its chunks, as the tier names it (``media``, docs/writing-a-tier.md):
    an fs root, nvme slabs, an obj directory or bucket and prefix, valkey servers and prefix."""
    media = getattr(tier, "media", ())
    return [m for m in media if isinstance(m, str)] if isinstance(media, (tuple, list)) else []


def _leaves(members: list[Member], path: str = "") -> Iterator[tuple[str, object]]:
    """Each tier of ``members`` by name, the tiers of a chain among them too ("kv/fs")."""
    for m in members:
        inner = getattr(m.tier, "members", None) if isinstance(m.tier, ChainTier) else None
        if inner is not None:
            yield from _leaves(inner, f"{path}{m.name}/")
        else:
            yield f"{path}{m.name}", m.tier


def _refuse_shared_media(members: list[Member]) -> None:
    """Two tiers on one medium each evict the other's chunks unseen (the other's index still
    lists them): refused by name, at any depth of chains."""
    seen: dict[str, str] = {}
    for name, tier in _leaves(members):
        for where in _media(tier):
            if where in seen:
                raise TierConfigError(
                    f"chain: tiers {seen[where]!r} and {name!r} both keep their chunks in {where}: each would "
                    "evict and overwrite the other's unseen; give each tier a medium of its own"
                )
            seen[where] = name


def _abandon(backlog: Backlog, demoter: Demoter | None) -> Callable[[], None]:
    """What ends the background tasks of a chain dropped without ``aclose()`` (its finalizer
    runs it on the event loop): they write what is queued, then let go of the tiers."""

    def abandon() -> None:
        backlog.abandon()
        if demoter is not None:
            demoter.abandon()

    return abandon


class ChainTier(ChainTransfers, Lifecycle, SecondaryTierManager):
    """Tiers as one tier, fastest first.

    Args:
        tiers: the tiers' configs, fastest first (each may add ``name``, ``admit``,
            ``deadline_s`` and ``breaker``; see :mod:`.config`).
        write: ``"back"`` (default) or ``"through"``.
        backlog_chunks: chunks background work may hold at once (write-back, promotion,
            demotion); beyond it the newest background writes are dropped and counted
            (default 1024).
        promote: copy a chunk a lower tier served into the tiers above it (default True).
        refresh_below: a chunk a tier served is touched, in the background, in the tiers
            below it, so their LRU sees the use (default True).
        demote: keep the first tier below its capacity by moving its least recently used
            chunks into the second tier before it evicts them (default False).
        demote_headroom_chunks: how far below capacity demotion keeps the first tier (8).
        background_batch: chunks per background write call at most (default 32).
        max_inflight: chunks of calls in progress at once (staging slots; default 16).
        store_backpressure, backpressure_timeout_s: as every tier (``"drop"``: a store that
            gets no staging slot within the timeout fails with BackpressureError).
        verify: passed to every tier that does not set its own (default: their own default).
    """

    default_type = "chain"

    def __init__(
        self,
        *,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str | None = None,
        tiers: Sequence[dict[str, Any]],
        write: Literal["back", "through"] = "back",
        backlog_chunks: int = 1024,
        promote: bool = True,
        refresh_below: bool = True,
        demote: bool = False,
        demote_headroom_chunks: int = 8,
        background_batch: int = 32,
        max_inflight: int = 16,
        store_backpressure: Literal["wait", "drop"] = "wait",
        backpressure_timeout_s: float = 0.05,
        verify: bool | None = None,
    ) -> None:
        if not isinstance(offloading_spec, OffloadingSpec):
            raise TypeError(f"offloading_spec must be an OffloadingSpec; got {type(offloading_spec).__name__}")
        self.offloading_spec = offloading_spec
        self.tier_type = tier_type or self.default_type
        self._view = offloading_spec.check_view(primary_kv_view, writable=False)
        self._own_view = self._view is not primary_kv_view  # a cast of the caller's: released at close
        self.config = cfg = ChainConfig.parse(
            tiers=tiers, write=write, backlog_chunks=backlog_chunks, promote=promote,
            refresh_below=refresh_below, demote=demote,
            demote_headroom_chunks=demote_headroom_chunks, background_batch=background_batch,
            max_inflight=max_inflight, store_backpressure=store_backpressure,
            backpressure_timeout_s=backpressure_timeout_s, verify=verify,
        )  # fmt: skip
        self.max_inflight = cfg.max_inflight
        self._pool = StagingPool(cfg.max_inflight, cfg.backlog_chunks)
        staging_spec = OffloadingSpec(offloading_spec.chunk_bytes, self._pool.size, offloading_spec.namespace)
        # page-aligned, so tiers that use O_DIRECT move chunks straight from and into it, and on
        # huge pages where the system has them: fewer segments per request (asynctier.buffers).
        # The calls' slots are faulted in at open, on a worker thread (faulted in by the first
        # chunks, on the event loop, they made a fresh chain's first stores 0.74x as fast);
        # the background's stay untouched until used (1024 of them by default)
        try:
            self._staging = allocate_buffer(staging_spec.total_bytes, populate=False)
        except (OSError, MemoryError, OverflowError) as e:
            raise TierConfigError(
                f"chain: its staging buffer of (max_inflight + backlog_chunks) = {self._pool.size} chunks "
                f"({staging_spec.total_bytes} bytes) cannot be allocated ({e}); lower max_inflight or backlog_chunks"
            ) from e
        self.members: list[Member] = []
        self._home_loop: object = None  # the loop it was opened on
        for i, entry in enumerate(cfg.entries):
            tc = dict(entry.tier_config)
            if cfg.verify is not None:
                tc.setdefault("verify", cfg.verify)
            where = f"chain: tiers[{i}] ({entry.name!r})"
            try:
                tier = SecondaryTierFactory.create_secondary_tier(tc, self._staging, staging_spec)
            except TierConfigError as e:
                raise TierConfigError(f"{where}: {e}") from e
            self.members.append(Member(i, entry, tier, make_policy(entry.admit, offloading_spec, where)))
        _refuse_shared_media(self.members)
        self._fence = RemovalFence()
        self._backlog = Backlog(
            self._pool, self._fence, self.members, cfg.background_batch, offloading_spec.chunk_bytes
        )
        self._demoter = (
            Demoter(self.members, self._pool, self._fence, offloading_spec.chunk_bytes, cfg.demote_headroom_chunks)
            if cfg.demote
            else None
        )
        if self._demoter is not None:
            self._backlog.after_top_write = self._demoter.poke
        self._stats = StatsRecorder()
        self._queued = 0
        self._init_lifecycle()
        self._active = 0
        self._idle: anyio.Event | None = None
        self._finalizer: weakref.finalize[[Callable[[], object]], ChainTier] | None = None

    # -- lifecycle (asynctier.core.lifecycle: open once, close once) ------------------------
    async def open(self) -> ChainTier:
        await self._open_once()
        return self

    async def _opening(self) -> None:
        # the slots calls take first (the pool hands out the lowest free ones, last freed first)
        calls = self._staging[: self.max_inflight * self.offloading_spec.chunk_bytes]
        # on a slow-path thread (whatever the event loop; it leaves once idle), once started
        # run to its end
        await run_on_thread_to_end(fault_in, calls)
        opened: list[Member] = []
        try:
            for m in self.members:
                await m.tier.open()
                opened.append(m)
        except BaseException:  # a failed or cancelled open leaves no tier open
            for m in reversed(opened):
                await run_to_completion(m.tier.aclose)
            raise
        self._home_loop = current_loop()  # (the background writers are its coroutines)
        self._backlog.start()
        if self._demoter is not None:
            self._demoter.start()
        self._finalizer = weakref.finalize(self, in_this_process(loop_caller()), _abandon(self._backlog, self._demoter))
        self._finalizer.atexit = False
        self._idle = anyio.Event()
        self._idle.set()

    def _check_close(self) -> None:
        refuse_close_elsewhere("chain tier", self._home_loop)
        for m in self.members:  # (a tier of its own may lack the check)
            check: Callable[[], None] | None = getattr(m.tier, "_check_close", None)
            if check is not None:
                check()

    async def _closing_down(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
        # on another loop once the chain's own is gone (_check_close refuses it while it runs):
        # its calls, and the background writers with what they held, ended with that loop
        gone = self._home_loop is not None and current_loop() is not self._home_loop
        try:
            if not gone:
                await self._calls_done()
                await self._pool.settled()  # late tier calls end before their tier closes
                if self._demoter is not None:
                    await self._demoter.stop()
                await self._backlog.stop()  # what is queued is written before the tiers close
        except BaseException:
            await self._close_members()
            raise
        failed = await self._close_members()
        if failed:  # (a flush or a sync that failed on close is the caller's to know, as with one tier)
            raise failed[0]

    async def _close_members(self) -> list[Exception]:
        """Close every tier, the last first; the errors (each logged), the others closed all the same."""
        failed: list[Exception] = []
        for m in reversed(self.members):
            try:
                await m.tier.aclose()
            except Exception as e:
                log.exception("closing chain tier %r failed", m.name)
                failed.append(e)
        return failed

    def _closed(self) -> None:
        self._release_view()

    def _release_view(self) -> None:
        """A closed chain the caller still references must not keep the caller's buffer
        exported (vLLM could not unmap its region); the tiers hold only the staging buffer."""
        if self._own_view:
            self._own_view = False
            self._view = release_view(self._view)

    async def _calls_done(self) -> None:
        while self._idle is not None and not self._idle.is_set():
            await self._idle.wait()

    async def drain(self) -> None:
        """Until every call in progress has returned and every background write queued is done
        (in the tiers too: a chain inside this one drains its own background writes)."""
        self._refuse_if_forked()
        await self._calls_done()
        await self._pool.settled()
        await self._backlog.drain()
        if self._demoter is not None:
            await self._demoter.drain()
            await self._backlog.drain()
        for m in self.members:
            await m.tier.drain()

    def _enter(self) -> None:
        self._active += 1
        if self._active == 1:
            self._idle = anyio.Event()

    def _leave(self) -> None:
        self._active -= 1
        if self._active == 0 and self._idle is not None:
            self._idle.set()

    # -- calls -----------------------------------------------------------------------------
    async def offload(self, keys: Sequence[bytes], chunk_ids: Sequence[int]) -> TransferResult:
        ks, ids = check_pairs(self.offloading_spec, self._view, keys, chunk_ids, load=False)
        self._check_open()
        return await self._call("offload", ks, ids)

    async def load(self, keys: Sequence[bytes], chunk_ids: Sequence[int]) -> TransferResult:
        ks, ids = check_pairs(self.offloading_spec, self._view, keys, chunk_ids, load=True)
        self._check_open()
        return await self._call("load", ks, ids)

    async def _call(self, op: Literal["offload", "load"], ks: list[bytes], ids: list[int]) -> TransferResult:
        t0 = time.perf_counter()
        res = TransferResult(op)
        if not ks:
            return res
        outcome: dict[bytes, BaseException | None] = {}
        pairs = list(zip(ks, ids))
        done = 0  # pairs[:done] have had their batch
        self._queued += len(pairs)
        drop = op == "offload" and self.config.store_backpressure == "drop"
        deadline = t0 + self.config.backpressure_timeout_s
        self._enter()
        try:
            # one batch after the other, each as large as the pool grants (up to max_inflight):
            # every batch is one call into a tier, and a tier's cost is mostly per call
            while done < len(pairs):
                # with "drop", every key of the call has waited for a slot since the call began
                timeout = deadline - time.perf_counter() if drop else None
                if timeout is not None and timeout < 0 and done:
                    held = []
                else:
                    held = await self._pool.acquire(len(pairs) - done, load=op == "load", timeout_s=timeout)
                if not held:  # a dropped store: every key still waiting now, at once
                    msg = f"store dropped: no staging slot within {self.config.backpressure_timeout_s}s"
                    for k, _ in pairs[done:]:
                        outcome[k] = BackpressureError(msg, k)
                    break
                batch = pairs[done : done + len(held)]
                done += len(held)
                self._queued -= len(held)
                epoch = self._fence.open()  # (the background work this batch prepares: promotions, write-backs)
                try:
                    if op == "load":
                        await self._load_batch(batch, held, res, outcome, t0, epoch)
                    else:
                        await self._store_batch(batch, held, res, outcome, t0, epoch)
                finally:
                    self._fence.close(epoch)
                    self._pool.release([s for s in held if s >= 0])
        finally:
            self._queued -= len(pairs) - done
            self._leave()
        for k in ks:
            e = outcome[k]
            if e is None:
                res.succeeded.append(k)
            else:
                res.failed[k] = e
                self._stats.record_failure(e)
        res.bytes_transferred = (len(res.succeeded) - len(res.skipped)) * self.offloading_spec.chunk_bytes
        res.elapsed_s = time.perf_counter() - t0
        return res

    # -- lookups, removal, touch -----------------------------------------------------------
    async def lookup(self, keys: Sequence[bytes]) -> list[bool]:
        ks = check_keys(keys)
        self._check_open()
        found = [self._backlog.has(k) for k in ks]  # loads serve these from the write-back queue
        self._enter()
        try:
            for m in self.members:
                m.observe(ks)
                idx = [i for i, f in enumerate(found) if not f]
                if not idx:
                    break
                got = await m.lookup([ks[i] for i in idx])
                assert isinstance(got, list)
                for i, hit in zip(idx, got):
                    found[i] = found[i] or hit
        finally:
            self._leave()
        return found

    async def lookup_prefix(self, keys: Sequence[bytes]) -> int:
        """How many leading ``keys`` some tier of the chain holds. Every tier but the last is
        asked :meth:`lookup` for the keys the tiers above lack (from memory on tiers with an
        index); the last is asked only :meth:`lookup_prefix` of what is still missing, in order,
        so a remote last tier stops at its first miss."""
        ks = check_keys(keys)
        self._check_open()
        if not ks:
            return 0
        has = self._backlog.has  # loads serve these from the write-back queue
        missing = [i for i, k in enumerate(ks) if not has(k)]
        if not missing:
            return len(ks)
        self._enter()
        try:
            for m in self.members:
                m.observe(ks)
            for m in self.members[:-1]:
                got = await m.lookup([ks[i] for i in missing])
                assert isinstance(got, list)
                missing = [i for i, hit in zip(missing, got) if not hit]
                if not missing:
                    return len(ks)
            n = await self.members[-1].lookup([ks[i] for i in missing], prefix=True)
            assert isinstance(n, int)
        finally:
            self._leave()
        return missing[n] if n < len(missing) else len(ks)

    async def remove(self, keys: Sequence[bytes]) -> TransferResult:
        ks = check_keys(keys)
        self._check_open()
        t0 = time.perf_counter()
        res = TransferResult("remove")
        if not ks:
            return res
        self._enter()
        try:
            # background writes of these keys queued before now are dropped, and none prepared
            # before the removal ends is queued; one running is awaited
            self._backlog.removing(ks)
            try:
                await self._fence.wait_running(ks)
                results: list[tuple[Member, TransferResult]] = []

                async def remove_on(m: Member) -> None:
                    results.append((m, await m.call("remove", ks, [])))

                async with anyio.create_task_group() as tg:
                    for m in self.members:
                        tg.start_soon(remove_on, m)
            finally:
                self._fence.removed(ks)
        finally:
            self._leave()
        failed: dict[bytes, BaseException] = {}
        for m, got in sorted(results, key=lambda r: r[0].index):
            self._note(res, m, got.failed)
            for k, e in got.failed.items():
                if failure_kind(e) != "not_found":
                    failed.setdefault(k, e)
        for k in ks:
            if k in failed:
                res.failed[k] = failed[k]
                self._stats.record_failure(failed[k])
            else:
                res.succeeded.append(k)
                self._stats.record_success("remove", 0, 0.0)
        res.elapsed_s = time.perf_counter() - t0
        return res

    async def touch(self, keys: Sequence[bytes]) -> None:
        ks = check_keys(keys)
        self._check_open()
        for m in self.members:
            if m.available:
                with anyio.move_on_after(m.deadline_s if m.deadline_s is not None else float("inf")):
                    try:
                        await m.tier.touch(ks)
                    except Exception:  # a hint: a tier that cannot take it misses nothing else
                        pass

    # -- stats -----------------------------------------------------------------------------
    def stats(self) -> TierStats:
        s = self._stats
        children = {m.name: m.snapshot() for m in self.members}
        counts = s.counters()
        totals = {name: sum(m.counts[name] for m in self.members) for name in COUNTERS}
        extra = {
            "promotions": totals["promotions"],
            "demotions": totals["demotions"],
            "written_back": totals["written_back"],
            "background_drops": totals["drops"],
            "not_admitted": totals["not_admitted"],
            "backlog": self._backlog.depth,
            "backlog_chunks": self.config.backlog_chunks,
            "backlog_peak": self._pool.peak_bg,
            "backlog_hits": self._backlog.hits,
            "background_in_flight": sum(m.background_in_flight for m in self.members),
            "late_slots": self._pool.quarantined,
        }
        used = [c.used_bytes for c in children.values()]
        return TierStats(
            tier_type=self.tier_type,
            in_flight=self._pool.fg_used,
            peak_in_flight=self._pool.peak_fg,
            queued=self._queued,
            max_inflight=self.max_inflight,
            offloaded=counts["offloaded"],
            loaded=counts["loaded"],
            skipped=counts["skipped"],
            removed=counts["removed"],
            bytes_written=counts["bytes_written"],
            bytes_read=counts["bytes_read"],
            failures=s.failure_counts(),
            evictions=sum(c.evictions for c in children.values()),
            stored_chunks=None,
            used_bytes=sum(u for u in used if u is not None) if all(u is not None for u in used) else None,
            capacity_bytes=None,
            offload_latency=s.latency("offload"),
            load_latency=s.latency("load"),
            extra=extra,
            children=children,
        )

    def member(self, name: str) -> Member:
        """The tier of the chain called ``name`` (its ``.tier``, ``.breaker``, counters)."""
        for m in self.members:
            if m.name == name:
                return m
        raise KeyError(f"no tier named {name!r} in this chain; it has {[m.name for m in self.members]}")
