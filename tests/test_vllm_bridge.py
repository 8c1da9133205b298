"""asynctier tiers inside vLLM 0.33's own tiering layer (asynctier.integrations.vllm).

Everything vLLM here is the installed wheel's real code: ``SharedOffloadRegion`` (the shared
mmap), ``CPUPrimaryTierOffloadingManager``, ``SecondaryTierFactory`` (which builds the adapter
from its config) and ``TieringOffloadingManager``, driven the way vLLM's offloading connector
drives them from the scheduler: prepare_store / write / complete_store (which cascades),
lookup (which promotes), on_schedule_end once per step, prepare_load / complete_load.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "vllm.v1.kv_offload.tiering.manager",
    reason="vLLM 0.33 is not installed (python -m pip install --no-deps vllm==0.33.0 -r requirements/vllm.txt)",
)

import numpy as np
from s3_helpers import FAST_FAULTS, FaultProxy, moto, s3_config
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingConfig,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.manager import (
    CPUPrimaryTierOffloadingManager,
    TieringOffloadingManager,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from asynctier.errors import TierConfigError
from asynctier.integrations.vllm import AsynctierTier

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import bench_vllm

CHUNK = 64 * 1024
PRIMARY_CHUNKS = 8
STEP = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())
CASCADE_FAILURES = "vllm:kv_offload_tiering_cascade_job_failures"


def adapter_config(tier: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "AsynctierTier", "module_path": "asynctier.integrations.vllm", "tier": tier, **extra}


def offloading_config(secondary_tiers: list[dict[str, Any]]) -> OffloadingConfig:
    """What vLLM builds from an engine config (the bench's builder), ``CHUNK`` bytes a chunk."""
    return bench_vllm.offloading_config(
        CHUNK, PRIMARY_CHUNKS, secondary_tiers, model="test/tiny-model", dtype="float16"
    )


class Scheduler:
    """vLLM's scheduler side: the tiering manager over the shared region, called under its lock."""

    def __init__(self, tier_config: dict[str, Any]) -> None:
        self.spec = TieringOffloadingSpec(offloading_config([tier_config]))
        self.region = region = SharedOffloadRegion(
            engine_id=self.spec.config.engine_id,
            num_chunks=self.spec.num_chunks,
            rank=None,
            kv_bytes_per_chunk=self.spec.kv_bytes_per_chunk,
            cpu_page_size=self.spec.cpu_page_size_per_worker,
        )
        self.primary = CPUPrimaryTierOffloadingManager(num_chunks=self.spec.num_chunks, mmap_region=region)
        view = self.primary.get_kv_memoryview()
        self.rows: Any = np.asarray(view)  # the same memory, as (num_chunks, chunk bytes) int8
        try:
            self.tier = SecondaryTierFactory.create_secondary_tier(tier_config, view, self.spec)
        except BaseException:
            self.rows = None
            self.primary.shutdown()
            raise
        assert isinstance(self.tier, AsynctierTier)
        self.mgr = TieringOffloadingManager(primary_tier=self.primary, secondary_tiers=[self.tier])
        self._req = 0
        self.counters: dict[str, float] = {}

    def close(self) -> None:
        self.rows = None  # our own view of the region goes first, as vLLM's worker would
        self.mgr.shutdown()

    def new_request(self) -> ReqContext:
        self._req += 1
        req = ReqContext(req_id=f"req-{self._req}")
        with self.mgr.lock:
            self.mgr.on_new_request(req)
        return req

    def finish(self, req: ReqContext) -> None:
        with self.mgr.lock:
            self.mgr.on_request_finished(req)

    def step(self) -> None:
        with self.mgr.lock:
            self.mgr.on_schedule_end(STEP)

    def steps_until(self, done: Callable[[], bool], what: str, limit_s: float = 60.0) -> None:
        """Step the engine (a step every 2 ms, as a busy engine would) until ``done()``."""
        deadline = time.monotonic() + limit_s
        while not done():
            assert time.monotonic() < deadline, f"vLLM never saw {what}"
            self.step()
            time.sleep(0.002)

    def store(self, req: ReqContext, data: dict[bytes, bytes]) -> None:
        """GPU -> primary for ``data``'s keys; complete_store cascades them to the tier."""
        keys = list(data)
        with self.mgr.lock:
            out = self.mgr.prepare_store(keys, req)
        assert out is not None, "the primary tier had no room"
        for key, cid in zip(out.keys_to_store, out.store_spec.chunk_ids):
            self.rows[cid] = np.frombuffer(data[key], dtype=np.int8)
        with self.mgr.lock:
            self.mgr.complete_store(out.keys_to_store, req)
        self.step()

    def settle(self) -> None:
        """Every cascade and promotion finished and processed by the manager."""
        self.steps_until(lambda: not self.mgr.has_pending_work(), "its transfers finish")

    def lookup(self, req: ReqContext, key: bytes) -> LookupResult:
        with self.mgr.lock:
            return self.mgr.lookup(key, req)

    def lookup_until_settled(self, req: ReqContext, keys: list[bytes]) -> dict[bytes, LookupResult]:
        """What the scheduler does for a prompt: look its chunks up each step until none is
        pending (RETRY: the tier has not answered; HIT_PENDING: a promotion is running)."""
        results: dict[bytes, LookupResult] = {}

        def settled() -> bool:
            for key in keys:
                results[key] = self.lookup(req, key)
            return all(r in (LookupResult.HIT, LookupResult.MISS) for r in results.values())

        self.steps_until(settled, "its lookups settle")
        return results

    def read(self, req: ReqContext, keys: list[bytes]) -> list[bytes]:
        """Primary -> GPU: the bytes vLLM's worker would copy for ``keys``."""
        with self.mgr.lock:
            spec = self.mgr.prepare_load(keys, req)
        try:
            return [self.rows[cid].tobytes() for cid in spec.chunk_ids]
        finally:
            with self.mgr.lock:
                self.mgr.complete_load(keys, req)

    def counter(self, name: str) -> float:
        """A counter of vLLM's metrics (the tiering manager's and the tier's), summed over labels
        and over every get_stats() so far (each call returns what is new since the last)."""
        stats = self.mgr.get_stats()
        if stats is not None:
            types, values = stats.metric_sections()
            for metric, kind in types.items():
                if kind == "counter":
                    self.counters[metric] = self.counters.get(metric, 0) + sum(values.get(metric, {}).values())
        return self.counters.get(name, 0)


def chunks(n: int) -> dict[bytes, bytes]:
    return {make_offload_key(os.urandom(16), 0): os.urandom(CHUNK) for _ in range(n)}


def cascade_evict_promote(s: Scheduler) -> None:
    """Store a prompt's chunks, push them out of the primary tier, promote them back."""
    first = chunks(PRIMARY_CHUNKS)
    req = s.new_request()
    s.store(req, first)
    s.settle()
    # a second prompt fills the primary tier: the first one's chunks are evicted from it
    second = chunks(PRIMARY_CHUNKS)
    s.store(req, second)
    s.settle()
    s.finish(req)
    assert all(s.primary.lookup(k, req) is LookupResult.MISS for k in first)

    req = s.new_request()
    keys = list(first)
    results = s.lookup_until_settled(req, keys)
    assert set(results.values()) == {LookupResult.HIT}, results
    assert s.read(req, keys) == [first[k] for k in keys]
    s.finish(req)
    s.settle()


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    yield moto().endpoint


def tier_config(kind: str, tmp_path: Path) -> dict[str, Any]:
    if kind == "fs":
        return {"type": "fs", "root": str(tmp_path / "fs")}
    if kind == "nvme":
        return {"type": "nvme", "path": str(tmp_path / "slab"), "capacity_bytes": 64 * (CHUNK + 4096) + 4096}
    if kind == "obj":
        return s3_config(**FAST_FAULTS)
    if kind == "chain":
        return {"type": "chain", "tiers": [{"type": "memory"}, {"type": "fs", "root": str(tmp_path / "fs")}]}
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["fs", "nvme", "obj", "chain"])
def test_cascade_evict_promote_every_byte(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if kind == "obj":
        request.getfixturevalue("s3")
    s = Scheduler(adapter_config(tier_config(kind, tmp_path)))
    try:
        cascade_evict_promote(s)
        assert s.counter(CASCADE_FAILURES) == 0
    finally:
        s.close()
    # the tier let go of the primary region: vLLM could unmap it (else it keeps it mapped)
    assert s.region.mmap_obj is None


def test_partly_failed_promotion_keeps_what_loaded(tmp_path: Path) -> None:
    """One chunk file rots on disk: its promotion fails, vLLM keeps the chunks that did load
    (JobResult.successful_keys) and the bad one becomes a miss, so it is recomputed."""
    root = tmp_path / "fs"
    s = Scheduler(adapter_config({"type": "fs", "root": str(root)}))
    try:
        first = chunks(PRIMARY_CHUNKS)
        req = s.new_request()
        s.store(req, first)
        s.settle()
        s.store(req, chunks(PRIMARY_CHUNKS))  # evicts the first prompt from the primary tier
        s.settle()
        s.finish(req)
        # the oldest chunk file is one of the first prompt's (the second was stored after it)
        files = [p for p in root.rglob("*") if p.is_file() and CHUNK <= p.stat().st_size < CHUNK + 16384]
        victim = min(files, key=lambda p: p.stat().st_mtime_ns)
        with open(victim, "r+b") as f:  # flip the last byte of its payload
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
            f.seek(-1, os.SEEK_END)
            f.write(bytes([last[0] ^ 0xFF]))

        req = s.new_request()
        keys = list(first)
        results = s.lookup_until_settled(req, keys)
        hits = [k for k in keys if results[k] is LookupResult.HIT]
        assert len(hits) == PRIMARY_CHUNKS - 1, results
        assert s.read(req, hits) == [first[k] for k in hits]
        s.finish(req)
        s.settle()
        assert s.counter("vllm:kv_offload_tiering_promotion_job_failures") == 1
        assert s.counter("vllm:kv_offload_tiering_read_bytes") == (PRIMARY_CHUNKS - 1) * CHUNK
        # the good chunks were read once: vLLM kept them, none was promoted a second time
        assert s.tier.tier.stats().loaded == PRIMARY_CHUNKS - 1
    finally:
        s.close()


def test_touch_reaches_the_tier(tmp_path: Path) -> None:
    """vLLM's touch() marks chunks used in the asynctier tier too: at capacity, the tier evicts
    the chunks nobody touched."""
    half = PRIMARY_CHUNKS // 2
    # room for three prompts of ``half`` chunks (the slack covers chunk headers, not a chunk)
    capacity = 3 * half * CHUNK + 3 * half * 4096
    s = Scheduler(adapter_config({"type": "fs", "root": str(tmp_path), "capacity_bytes": capacity}))
    try:
        req = s.new_request()
        a, b, c, d = (chunks(half) for _ in range(4))
        for prompt in (a, b):
            s.store(req, prompt)
            s.settle()
        with s.mgr.lock:
            s.mgr.touch(list(a), req)  # a is used again: b is now the least recently used
        for prompt in (c, d):  # c fills the tier; d makes it evict; both push a and b out of the primary
            s.store(req, prompt)
            s.settle()
        s.finish(req)

        req = s.new_request()
        results = s.lookup_until_settled(req, [*a, *b])
        assert [results[k] for k in a] == [LookupResult.HIT] * half, results
        assert [results[k] for k in b] == [LookupResult.MISS] * half, results
        assert s.read(req, list(a)) == list(a.values())
        s.finish(req)
        s.settle()
    finally:
        s.close()


def test_a_stats_call_that_raises_stalls_nothing() -> None:
    """A tier's stats() that raised inside the loop's inbox ended its polling without saying
    so: every later job stayed in the inbox and vLLM never saw it finish."""
    s = Scheduler(adapter_config({"type": "memory"}, stats_interval_s=0))
    inner = s.tier.tier
    real, failed = inner.stats, []

    def flaky() -> Any:
        if not failed:
            failed.append(True)
            raise OSError("stats backend hiccup")
        return real()

    inner.stats = flaky
    try:
        req = s.new_request()
        s.store(req, chunks(2))
        s.settle()  # the loop polls its inbox for a while now
        s.mgr.get_stats()  # posts a stats refresh, which raises on the loop
        s.store(req, chunks(2))
        s.steps_until(lambda: not s.mgr.has_pending_work(), "the store after the failed stats refresh", 10)
        assert failed
        s.finish(req)
    finally:
        s.close()


def test_two_tiers_of_one_type_are_two_metric_series() -> None:
    """Both were labelled with their type: vLLM kept one tier's gauge and summed the counters."""
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory as VllmFactory

    from asynctier.integrations.vllm import _metric_label, _release_label

    assert _metric_label("fs-test", None) == "fs-test" and _metric_label("fs-test", None) == "fs-test-1"
    assert _metric_label("fs-test", "nvme-local") == "nvme-local"
    with pytest.raises(TierConfigError, match=r"'name' 'fs-test' is another live tier's"):
        _metric_label("memory", "fs-test")  # a name given, taken by a tier numbered by type
    _release_label("fs-test")  # (shut down)
    assert _metric_label("fs-test", None) == "fs-test"
    for label in ("fs-test", "fs-test-1", "nvme-local"):
        _release_label(label)
    spec = TieringOffloadingSpec(offloading_config([adapter_config({"type": "memory"}, name="near")]))
    with pytest.raises(TierConfigError, match=r"'name' must be a non-empty printable str"):
        VllmFactory.create_secondary_tier(adapter_config({"type": "memory"}, name=""), memoryview(bytearray(0)), spec)


def test_config_unchanged_through_vllm_spec(tmp_path: Path) -> None:
    """The README's snippet, as vLLM reads it from kv_connector_extra_config."""
    spec = TieringOffloadingSpec(offloading_config([adapter_config({"type": "fs", "root": str(tmp_path)})]))
    mgr = spec.get_manager()
    try:
        assert isinstance(mgr, TieringOffloadingManager)
        (tier,) = mgr.secondary_tiers
        assert isinstance(tier, AsynctierTier)
        assert tier.spec.chunk_bytes == CHUNK and tier.spec.num_chunks == PRIMARY_CHUNKS
        # the namespace comes from vLLM's layout: another model never reads these chunks
        assert tier.spec.namespace.startswith("vllm/test_tiny-model_")
        assert tier.config_info()["asynctier_tier"] == "fs"
    finally:
        mgr.shutdown()


def test_obj_server_dies_mid_run(s3: str, tmp_path: Path) -> None:
    """Cascades and promotions through a dead S3 endpoint fail as jobs: nothing hangs, the
    primary slots are released, the keys become misses."""
    proxy = FaultProxy(int(s3.rsplit(":", 1)[1]))
    s = Scheduler(adapter_config(s3_config(proxy.endpoint, **FAST_FAULTS), stats_interval_s=0))
    try:
        first = chunks(PRIMARY_CHUNKS)
        req = s.new_request()
        s.store(req, first)
        s.settle()
        proxy.kill()
        second = chunks(PRIMARY_CHUNKS)
        s.store(req, second)  # evicts the first prompt from the primary tier; cascades fail
        s.settle()
        assert s.counter(CASCADE_FAILURES) >= 1
        # the failed cascades released their primary slots: a third prompt fits
        s.store(req, chunks(PRIMARY_CHUNKS))
        s.settle()
        s.finish(req)

        req = s.new_request()
        results = s.lookup_until_settled(req, list(first))
        # the tier cannot be asked (lookup fails: a miss) or its promotion fails (marked a miss)
        assert set(results.values()) == {LookupResult.MISS}, results
        s.finish(req)
        s.settle()
        # the tier's own figures reach vLLM's metrics: its chunk failures, by kind
        s.counter(CASCADE_FAILURES)  # asks the loop for a fresh snapshot ...
        s.tier.drain_jobs()  # ... which it has taken once this returns
        assert s.counter("vllm:kv_offload_asynctier_chunk_failures") >= PRIMARY_CHUNKS
    finally:
        s.close()
        proxy.close()


def test_shutdown_with_jobs_in_flight(s3: str) -> None:
    """vLLM shuts the tier down with cascades still running: it returns, no I/O is left on
    the primary region, and every job is reported (the cancelled ones as failed)."""
    proxy = FaultProxy(int(s3.rsplit(":", 1)[1]))
    proxy.delay_s = 0.2
    s = Scheduler(adapter_config(s3_config(proxy.endpoint, timeout_s=30.0, max_inflight=2)))
    tier = s.tier
    try:
        req = s.new_request()
        s.store(req, chunks(PRIMARY_CHUNKS))
        assert tier.has_pending_work()
    finally:
        s.close()
        proxy.close()
    results = tier.get_finished_jobs()
    assert len(results) == 1 and not results[0].success
    assert not tier.has_pending_work()
    tier.shutdown()  # idempotent


@pytest.mark.parametrize("drain", ["wait", "cancel"])
def test_reset_cache_drains_jobs(s3: str, drain: str) -> None:
    """vLLM's reset_cache() calls drain_jobs() and then requires every job to be finished."""
    proxy = FaultProxy(int(s3.rsplit(":", 1)[1]))
    proxy.delay_s = 0.05
    s = Scheduler(adapter_config(s3_config(proxy.endpoint, max_inflight=2), drain=drain))
    try:
        req = s.new_request()
        s.store(req, chunks(PRIMARY_CHUNKS))
        assert s.tier.has_pending_work()
        with s.mgr.lock:
            s.mgr.reset_cache()  # asserts that no job is left
        assert not s.mgr.has_pending_work()
        failures = s.counter(CASCADE_FAILURES)
        assert failures == (1 if drain == "cancel" else 0)
        s.finish(req)
    finally:
        s.close()
        proxy.close()


def test_reset_cache_reports_a_job_cancelled_before_it_started() -> None:
    """drain="cancel" cancelled a job whose task had not run a step yet (submitted while the
    loop still polled after the previous one): it was never reported, and vLLM's reset_cache()
    failed its assertion that no job is left."""
    s = Scheduler(adapter_config({"type": "memory"}, drain="cancel"))
    try:
        req = s.new_request()
        s.store(req, chunks(2))
        s.settle()  # one cascade ran: the loop polls for more for a while
        s.store(req, chunks(2))  # the next one is submitted in this step
        with s.mgr.lock:
            s.mgr.reset_cache()  # asserts that no job is left
        assert not s.mgr.has_pending_work()
        s.finish(req)
    finally:
        s.close()


def test_bad_config_is_refused(tmp_path: Path) -> None:
    spec = TieringOffloadingSpec(offloading_config([]))
    view = memoryview(np.zeros((4, CHUNK), dtype=np.int8))
    cases: list[tuple[dict[str, Any], str]] = [
        (adapter_config(None), "needs 'tier'"),  # type: ignore[arg-type]
        (adapter_config({"root": str(tmp_path)}), "needs 'tier'"),
        (adapter_config({"type": "fs", "root": str(tmp_path), "bogus": 1}), "bogus"),
        (adapter_config({"type": "fs", "root": str(tmp_path)}, drain="later"), "'drain' must be"),
        (adapter_config({"type": "fs", "root": str(tmp_path)}, namespace=5), "'namespace' must be"),
        (adapter_config({"type": "fs", "root": str(tmp_path)}, stats_interval_s=True), "'stats_interval_s' must be"),
        # NaN compared false with every time since: no tier stats ever reached vLLM
        (
            adapter_config({"type": "fs", "root": str(tmp_path)}, stats_interval_s=float("nan")),
            "'stats_interval_s' must be",
        ),
        (adapter_config({"type": "fs", "root": str(tmp_path)}, locality="nearby"), "'locality' must be one of"),
        # a misspelt key was a bare TypeError from the constructor's call
        (adapter_config({"type": "memory"}, namspace="x"), r"unknown key\(s\) 'namspace'; accepted: 'tier'"),
    ]
    for config, message in cases:
        with pytest.raises(TierConfigError, match=message):
            SecondaryTierFactory.create_secondary_tier(config, view, spec)


def test_import_asynctier_does_not_import_vllm() -> None:
    code = "import sys, asynctier, asynctier.integrations; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bench_vllm_runs_and_checks_every_byte(tmp_path: Path) -> None:
    """bench/bench_vllm.py end to end at a tiny size (a smoke test, not a measurement)."""

    out = tmp_path / "out"
    bench_vllm.main(["--dir", str(tmp_path / "scratch"), "--sizes-kib", "256", "--mib", "2", "--batch", "4",
                     "--repeat", "1", "--step-ms", "0.5", "--out", str(out)])  # fmt: skip
    report = json.loads((out / "vllm.json").read_text())
    assert [p["tier"] for p in report["points"]] == ["vllm fs", "asynctier fs", "asynctier nvme"]
    for p in report["points"]:
        assert p["store_gbps"] > 0 and p["load_gbps"] > 0
        assert p["calls"]["submit_store"]["calls"] == 2 and p["calls"]["submit_load"]["calls"] == 2
    assert "| asynctier nvme | 256 KiB |" in (out / "vllm.md").read_text()
