"""Any asynctier tier as a secondary tier of vLLM's KV-offload tiering layer (vLLM 0.33).

vLLM's ``TieringOffloadingManager`` drives its secondary tiers synchronously from the scheduler
thread: ``submit_store``/``submit_load`` must return at once, completions are polled with
``get_finished_jobs``, lookups may answer ``RETRY`` until known. :class:`AsynctierTier` is
such a tier wrapping an asynctier tier (built from a nested asynctier config) that runs on an
event loop of its own, on one background thread the adapter owns::

    "secondary_tiers": [{
        "type": "AsynctierTier",
        "module_path": "asynctier.integrations.vllm",
        "tier": {"type": "fs", "root": "/mnt/nvme/kv"},
    }]

Every scheduler-side method only hands work to that loop (``call_soon_threadsafe``) or drains
a queue it fills, so it returns in microseconds; ``drain_jobs`` and ``shutdown`` are the only
calls that block, as vLLM specifies. See docs/vllm.md.

This module imports vLLM; ``import asynctier`` does not import it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import hashlib
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.v1.kv_offload.base import (
    ConfigInfoMapping,
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.base import OffloadingSpec as VllmOffloadingSpec
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from ..contract import SecondaryTierManager as AsyncTier
from ..errors import TierClosedError, TierConfigError
from ..factory import SecondaryTierFactory as AsyncTierFactory
from ..spec import OffloadingSpec
from ..stats import TierStats

__all__ = ["AsynctierTier", "namespace_for"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Metric names this tier adds to vLLM's (label ``asynctier_tier``: the wrapped tier's type).
CHUNK_FAILURES = "vllm:kv_offload_asynctier_chunk_failures"
EVICTIONS = "vllm:kv_offload_asynctier_evictions"
STORED_CHUNKS = "vllm:kv_offload_asynctier_stored_chunks"
IN_FLIGHT = "vllm:kv_offload_asynctier_in_flight_chunks"
QUEUED = "vllm:kv_offload_asynctier_queued_chunks"
_LABEL = "asynctier_tier"

_MAX_NAMESPACE = 256
#: how often the loop takes new work from the scheduler thread while it is busy
_POLL_S = 0.0005
#: how long the loop keeps polling after its last job: an engine steps every few to tens of
#: milliseconds, so in steady serving the scheduler thread never has to wake it
_LINGER_S = 0.1


def namespace_for(offloading_spec: VllmOffloadingSpec) -> str:
    """The asynctier namespace of a vLLM offloading configuration.

    Built from what vLLM's own ``FileMapper`` hashes to tell layouts apart (model, dtype,
    tokens per hash, blocks per chunk, KV-cache groups, parallelism unless the bytes are
    parallelism-agnostic), so two models or layouts never share chunks; the chunk size is
    part of asynctier's layout digest already.
    """
    if getattr(offloading_spec, "config", None) is None:
        raise TierConfigError(
            "AsynctierTier: this vLLM offloading spec carries no OffloadingConfig to derive a namespace from; "
            "give one in the tier config ('namespace': 'model/dtype/...')"
        )
    mapper = FileMapper.from_offloading_spec(
        root_dir="vllm",
        offloading_spec=offloading_spec,
        blocks_per_file=offloading_spec.blocks_per_chunk,
        parallel_agnostic=True,
    )
    namespace = f"{mapper.base_path}/r{mapper.rank}"
    if len(namespace) > _MAX_NAMESPACE or not namespace.isprintable():
        # a long local model path: keep the namespace a fixed-size digest of it
        namespace = "vllm/" + hashlib.sha256(namespace.encode()).hexdigest()[:32]
    return namespace


_labels_lock = threading.Lock()
_labels_taken: set[str] = set()


def _metric_label(tier_type: str, name: str | None) -> str:
    """A tier's ``asynctier_tier`` label, unique among the live tiers of this process: ``name``
    (refused if taken), else its type, then ``type-1``, ``type-2`` (vLLM keeps the last value of
    a gauge per label and sums counters: two tiers under one label showed one tier's figures).
    :func:`_release_label` gives it back when the tier shuts down or fails to start (one dropped
    without ``shutdown()`` keeps it: its loop thread, which holds it, runs on)."""
    with _labels_lock:
        if name is not None:
            if name in _labels_taken:
                raise TierConfigError(f"AsynctierTier: 'name' {name!r} is another live tier's; give each its own")
            label = name
        else:
            label, n = tier_type, 0
            while label in _labels_taken:
                n += 1
                label = f"{tier_type}-{n}"
        _labels_taken.add(label)
        return label


def _release_label(label: str) -> None:
    with _labels_lock:
        _labels_taken.discard(label)


@dataclass(frozen=True)
class _Done:
    """One finished job, as the loop thread hands it to the scheduler thread."""

    job_id: int
    ok: bool
    succeeded: Sequence[bytes]
    elapsed_s: float
    nbytes: int


class _Lookups(AsyncLookupManager):
    """vLLM's async lookup state machine, answering each batch with one ``tier.lookup`` on the loop."""

    def __init__(self, owner: AsynctierTier, tier_type: str) -> None:
        self._owner = owner
        super().__init__(tier_type=tier_type)

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        # runs on vLLM's lookup worker thread: blocking here delays only lookups
        return self._owner._lookup_blocking(list(keys))


class AsynctierTier(SecondaryTierManager):
    """A vLLM secondary tier backed by any asynctier tier.

    Config keys (besides vLLM's ``type``, ``module_path``, ``backpressure``):

    * ``tier`` (dict, required): the asynctier tier config, ``{"type": "fs", "root": ...}``
      (any registered type, an out-of-tree one by ``module_path``, the chain).
    * ``namespace`` (str): the asynctier namespace; default derived from vLLM's layout
      (:func:`namespace_for`).
    * ``locality`` (``"LOCAL"``/``"REMOTE"``): as vLLM's own tiers, for KV events and filters.
    * ``drain`` (``"wait"`` or ``"cancel"``): what ``drain_jobs`` does with jobs still
      running: wait for them (default), or cancel them (chunk I/Os already started finish;
      the jobs are reported failed).
    * ``stats_interval_s`` (default 1.0): how often ``get_stats`` refreshes the tier's figures.
    * ``name`` (str): the tier's ``asynctier_tier`` label in vLLM's metrics; default its type,
      then ``fs-1``, ``fs-2`` for more tiers of one type in the process.
    """

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: VllmOffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        tier: Mapping[str, Any] | None = None,
        namespace: str | None = None,
        locality: str | None = None,
        drain: Literal["wait", "cancel"] = "wait",
        stats_interval_s: float = 1.0,
        name: str | None = None,
        backpressure_detector: BackpressureDetector | None = None,
        **unknown: Any,
    ) -> None:
        if unknown:  # (else a bare TypeError from the call, naming no accepted key)
            raise TierConfigError(
                f"AsynctierTier: unknown key(s) {', '.join(map(repr, sorted(unknown)))}; accepted: 'tier', "
                "'namespace', 'locality', 'drain', 'stats_interval_s', 'name' (and vLLM's own 'backpressure')"
            )
        if name is not None and (not isinstance(name, str) or not name or not name.isprintable()):
            raise TierConfigError(f"AsynctierTier: 'name' must be a non-empty printable str; got {name!r}")
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        if not isinstance(tier, Mapping) or not tier.get("type"):
            raise TierConfigError(
                "AsynctierTier needs 'tier': the asynctier tier config as a dict with a 'type', "
                f"for example {{'type': 'fs', 'root': '/mnt/kv'}}; got {tier!r}"
            )
        if drain not in ("wait", "cancel"):
            raise TierConfigError(f"AsynctierTier: 'drain' must be 'wait' or 'cancel'; got {drain!r}")
        if namespace is not None and not isinstance(namespace, str):
            raise TierConfigError(f"AsynctierTier: 'namespace' must be a str; got {namespace!r}")
        if (
            isinstance(stats_interval_s, bool)
            or not isinstance(stats_interval_s, (int, float))
            or not 0 <= stats_interval_s < math.inf  # (NaN compared false: no stats were ever reported)
        ):
            raise TierConfigError(
                f"AsynctierTier: 'stats_interval_s' must be a number of seconds >= 0; got {stats_interval_s!r}"
            )
        accepted = [m.value for m in Locality]
        if locality is not None and locality not in accepted:
            raise TierConfigError(f"AsynctierTier: 'locality' must be one of {accepted}; got {locality!r}")
        self.locality = Locality(locality) if locality is not None else None
        self._drain_mode = drain
        chunk_bytes = self.block_size_bytes
        if chunk_bytes <= 0 or primary_kv_view.nbytes % chunk_bytes:
            raise ValueError(
                f"primary_kv_view must be 2-D with strides[0] = chunk bytes; got shape {primary_kv_view.shape} "
                f"strides {primary_kv_view.strides}"
            )
        self.spec = OffloadingSpec(
            chunk_bytes,
            primary_kv_view.nbytes // chunk_bytes,
            namespace if namespace is not None else namespace_for(offloading_spec),
        )
        self._inner_type = str(tier["type"])
        self._label = _metric_label(self._inner_type, name)
        try:
            self._tier: AsyncTier | None = AsyncTierFactory.create_secondary_tier(
                dict(tier), primary_kv_view, self.spec
            )
        except BaseException:
            _release_label(self._label)
            raise

        # scheduler-thread state (vLLM calls tier methods under its manager lock)
        self._closed = False
        self._outstanding = 0  # jobs submitted and not yet returned by get_finished_jobs
        self._load_keys: dict[int, list[OffloadKey]] = {}
        self._reported: TierStats | None = None
        self._stats_interval_s = stats_interval_s
        self._stats_asked = -math.inf
        # loop-thread state
        self._jobs: set[asyncio.Task[None]] = set()
        self._side_tasks: set[asyncio.Task[None]] = set()
        # loop thread -> scheduler thread; SimpleQueue is safe for one writer and one reader
        self._finished: queue.SimpleQueue[_Done] = queue.SimpleQueue()
        self._snapshot: TierStats | None = None  # replaced whole by the loop thread
        # scheduler -> loop: work the loop picks up. Waking the loop is a socket write, and a
        # system call gives the GIL away: while the loop thread runs the tier's Python code the
        # scheduler thread would wait a switch interval (5 ms) to get it back. So while jobs
        # run, the loop polls this deque itself and the scheduler thread wakes it only when idle.
        self._inbox: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = collections.deque()
        self._loop_polls = False  # written by the loop thread only
        self._last_busy = 0.0  # loop time of the last job or inbox item

        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name=f"asynctier-{tier_type}", daemon=True)
        self._thread.start()
        try:
            self._call(self.tier.open())
        except BaseException:
            # vLLM unmaps the primary region when the spec fails: the tier lets go of its views
            # now (the exception's traceback keeps the tier itself)
            with contextlib.suppress(Exception):
                self._call(self.tier.aclose())
            self._stop_loop()
            self._tier = None
            _release_label(self._label)
            raise
        self._lookups = _Lookups(self, tier_type)

    @property
    def tier(self) -> AsyncTier:
        """The wrapped asynctier tier (every call to it runs on :attr:`loop`); gone after shutdown."""
        if self._tier is None:
            raise TierClosedError(f"AsynctierTier {self.tier_type!r} is shut down")
        return self._tier

    # -- the loop thread ------------------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def _call(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the loop and block this (non-loop) thread until it is done."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        """Have the loop thread run ``fn(*args)`` soon (from the scheduler thread)."""
        self._inbox.append((fn, args))
        if not self._loop_polls:
            self.loop.call_soon_threadsafe(self._woken)

    def _woken(self) -> None:
        # the scheduler thread that woke us gave the GIL away in that socket write: hand it back
        # before running the tier's code, or it waits up to a switch interval (5 ms) for it
        time.sleep(0)
        self._take_inbox()

    def _take_inbox(self) -> None:
        if self._inbox:
            self._last_busy = self.loop.time()
        while self._inbox:
            fn, args = self._inbox.popleft()
            try:
                fn(*args)
            except Exception as e:  # (a tier's stats() that raised): the items after it still run
                log.warning("asynctier %s: %s raised: %r", self._label, getattr(fn, "__name__", fn), e)

    def _poll_inbox(self) -> None:
        try:
            self._take_inbox()
        finally:  # polling goes on, or stops saying so: else _post never woke the loop again
            if self._jobs or self._side_tasks:
                self._last_busy = self.loop.time()
            if self.loop.time() - self._last_busy < _LINGER_S:
                self.loop.call_later(_POLL_S, self._poll_inbox)
            else:
                self._loop_polls = False
                self._take_inbox()  # what was posted while the scheduler thread still saw us polling

    def _track(self, tasks: set[asyncio.Task[None]], coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = self.loop.create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        self._last_busy = self.loop.time()
        if not self._loop_polls:
            self._loop_polls = True
            self.loop.call_later(_POLL_S, self._poll_inbox)
        return task

    def _start_job(self, job_id: int, load: bool, keys: list[OffloadKey], chunk_ids: list[int]) -> None:
        task = self._track(self._jobs, self._run_job(job_id, load, keys, chunk_ids))

        def unstarted(t: asyncio.Task[None]) -> None:
            # cancelled before its first step (drain="cancel", shutdown): _run_job never ran to
            # report it, and vLLM waits for every job it submitted (reset_cache asserts none is left)
            if t.cancelled():
                self._finished.put(_Done(job_id, False, (), 0.0, 0))

        task.add_done_callback(unstarted)

    async def _run_job(self, job_id: int, load: bool, keys: list[OffloadKey], chunk_ids: list[int]) -> None:
        t0 = time.perf_counter()
        try:
            res = await (self.tier.load(keys, chunk_ids) if load else self.tier.offload(keys, chunk_ids))
        except asyncio.CancelledError:
            # asynctier returns CancelledError only once no I/O of the call touches the slots
            self._finished.put(_Done(job_id, False, (), time.perf_counter() - t0, 0))
        except Exception as e:  # a programmer error inside the tier: the job fails, the loop lives on
            log.warning("asynctier %s job %d (%d chunks) raised: %r", "load" if load else "store", job_id, len(keys), e)
            self._finished.put(_Done(job_id, False, (), time.perf_counter() - t0, 0))
        else:
            if res.failed:
                first = next(iter(res.failed.values()))
                log.debug(
                    "asynctier job %d: %d of %d chunks failed, first: %r", job_id, len(res.failed), len(keys), first
                )
            self._finished.put(_Done(job_id, not res.failed, res.succeeded, res.elapsed_s, res.bytes_transferred))

    def _start_touch(self, keys: list[OffloadKey]) -> None:
        self._track(self._side_tasks, self._touch(keys))

    async def _touch(self, keys: list[OffloadKey]) -> None:
        try:
            await self.tier.touch(keys)
        except Exception as e:
            log.debug("asynctier touch of %d keys failed: %r", len(keys), e)

    def _refresh_stats(self) -> None:
        try:
            self._snapshot = self.tier.stats()
        except Exception as e:  # (a tier's own stored_chunk_count() asking its medium): figures wait
            log.warning("asynctier %s: stats() raised: %r", self._label, e)

    async def _lookup(self, keys: list[OffloadKey]) -> list[bool]:
        return await self.tier.lookup(keys)

    def _lookup_blocking(self, keys: list[OffloadKey]) -> list[bool]:
        if self._closed:
            return [False] * len(keys)
        return self._call(self._lookup(keys))

    async def _wait_jobs(self, cancel: bool) -> None:
        self._take_inbox()  # jobs submitted before this call start (and are waited for) too
        while self._jobs:
            if cancel:
                for task in self._jobs:
                    task.cancel()
            await asyncio.wait(set(self._jobs))

    async def _close(self) -> None:
        await self._wait_jobs(cancel=True)
        if self._side_tasks:
            await asyncio.wait(set(self._side_tasks))
        await self.tier.aclose()

    # -- vLLM's SecondaryTierManager (scheduler thread) -------------------------------------

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._lookups.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, load=False)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, load=True)

    def _submit(self, job: TransferJob, *, load: bool) -> None:
        keys = list(job.keys)
        chunk_ids = job.chunk_ids.tolist()
        self._outstanding += 1
        if load:
            self._load_keys[job.job_id] = keys
        if self._closed:
            self._finished.put(_Done(job.job_id, False, (), 0.0, 0))
            return
        self._post(self._start_job, job.job_id, load, keys, chunk_ids)

    def get_finished_jobs(self) -> list[JobResult]:
        results = []
        while True:
            try:
                done = self._finished.get_nowait()
            except queue.Empty:
                break
            self._outstanding -= 1
            load_keys = self._load_keys.pop(done.job_id, None)
            successful = None
            if load_keys is not None and not done.ok:
                # a failed promotion keeps the chunks that did load; the rest are a miss from
                # now on, or the scheduler would look them up and promote them again forever
                ok = set(done.succeeded)
                self._lookups.mark_miss([k for k in load_keys if k not in ok])
                successful = tuple(done.succeeded) or None
            results.append(
                JobResult(
                    job_id=done.job_id,
                    success=done.ok,
                    successful_keys=successful,
                    transfer_time=done.elapsed_s,
                    transfer_bytes=done.nbytes,
                )
            )
        return results

    def has_pending_work(self) -> bool:
        return self._outstanding > 0

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        if not self._closed and keys:
            self._post(self._start_touch, list(keys))

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.cleanup(req_context.req_id)

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.flush()

    def drain_jobs(self) -> None:
        """Block until every submitted job has finished (``drain="cancel"``: been cancelled)."""
        if not self._closed:
            self._call(self._wait_jobs(cancel=self._drain_mode == "cancel"))

    def shutdown(self) -> None:
        """Cancel jobs still running (reported failed), close the tier, stop the loop thread.

        Returns only once no I/O touches the primary view any more.
        """
        if self._closed:
            return
        self._closed = True
        self._lookups.shutdown()
        try:
            self._call(self._close())
        finally:
            _release_label(self._label)
            self._stop_loop()
            # vLLM unmaps the primary region next: a closed tier releases its own views of it,
            # but a chunk's failure leaves a traceback in a reference cycle whose frames hold
            # chunk slices of it, until a collection
            self._tier = None
            gc.collect()

    # -- metrics ----------------------------------------------------------------------------

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        labels = (_LABEL,)
        return {
            CHUNK_FAILURES: OffloadingCounterMetadata(
                documentation="Chunks an asynctier tier failed to store or load, by failure kind.",
                labelnames=(_LABEL, "kind"),
            ),
            EVICTIONS: OffloadingCounterMetadata(
                documentation="Chunks an asynctier tier evicted to stay within its capacity.", labelnames=labels
            ),
            STORED_CHUNKS: OffloadingGaugeMetadata(documentation="Chunks an asynctier tier holds.", labelnames=labels),
            IN_FLIGHT: OffloadingGaugeMetadata(
                documentation="Chunk I/Os an asynctier tier is running.", labelnames=labels
            ),
            QUEUED: OffloadingGaugeMetadata(
                documentation="Chunk I/Os waiting for a slot of an asynctier tier's bound.", labelnames=labels
            ),
        }

    def get_stats(self) -> OffloadingConnectorStats | None:
        """The wrapped tier's counters since the last report. Its snapshot is taken on the loop
        at most every ``stats_interval_s`` (it summarises latency reservoirs), so what this
        returns lags by up to that."""
        now = time.monotonic()
        if not self._closed and now - self._stats_asked >= self._stats_interval_s:
            self._stats_asked = now
            self._post(self._refresh_stats)
        snap = self._snapshot
        if snap is None or snap is self._reported:
            return None
        prev = self._reported
        self._reported = snap
        stats = OffloadingConnectorStats()
        label = (self._label,)
        for kind, n in snap.failures.items():
            delta = n - (prev.failures.get(kind, 0) if prev else 0)
            if delta:
                stats.increase_counter(CHUNK_FAILURES, delta, (self._label, kind))
        evicted = snap.evictions - (prev.evictions if prev else 0)
        if evicted:
            stats.increase_counter(EVICTIONS, evicted, label)
        if snap.stored_chunks is not None:
            stats.set_gauge(STORED_CHUNKS, snap.stored_chunks, label)
        stats.set_gauge(IN_FLIGHT, snap.in_flight, label)
        stats.set_gauge(QUEUED, snap.queued, label)
        return stats

    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return ("asynctier_tier", "asynctier_layout")

    def config_info(self) -> ConfigInfoMapping:
        return {"asynctier_tier": self._inner_type, "asynctier_layout": self.spec.layout_id}
