"""Bound, priority, back-pressure, cancellation and deadlines, made deterministic with gates.

The tiers here block inside their primitives until the test opens a gate, so every
ordering claim is checked exactly, with no timing involved.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import Any

import anyio
import pytest

from asynctier import (
    AsyncChunkTier,
    BackpressureError,
    BlockingChunkTier,
    ChunkNotFoundError,
    ChunkTimeoutError,
    IntegrityError,
    OffloadingSpec,
    TierClosedError,
    TierConfigError,
    TierStateError,
)

SPEC = OffloadingSpec(4096, 16)


class GatedTier(BlockingChunkTier):
    """Stores chunks in a dict; every primitive records itself, then waits for the gate."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data: dict[bytes, bytes] = {}
        self.log: list[tuple[str, bytes]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.barrier: threading.Barrier | None = None
        self.lock = threading.Lock()

    def _enter(self, op: str, key: bytes) -> None:
        with self.lock:
            self.log.append((op, key))
        if self.barrier is not None:
            self.barrier.wait()
        assert self.gate.wait(30), "test gate never opened"

    def write_chunk(self, key: bytes, data: memoryview) -> None:
        self._enter("store", key)
        self.data[key] = bytes(data)

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        self._enter("load", key)
        if key not in self.data:
            raise ChunkNotFoundError("absent", key)
        out[:] = self.data[key]

    def chunk_exists(self, key: bytes) -> bool:
        return key in self.data

    def delete_chunk(self, key: bytes) -> bool:
        return self.data.pop(key, None) is not None


def make(**kw: Any) -> tuple[GatedTier, memoryview]:
    view = memoryview(bytearray(SPEC.total_bytes))
    return GatedTier(offloading_spec=SPEC, primary_kv_view=view, **kw), view


async def wait_until(pred: Any) -> None:
    for _ in range(5_000):
        if pred():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never became true")


async def test_one_call_runs_up_to_the_bound_in_parallel() -> None:
    tier, _ = make(max_inflight=4)
    tier.barrier = threading.Barrier(4, timeout=20)  # breaks unless 4 chunks run at once
    async with tier:
        res = await tier.offload([b"k%d" % i for i in range(8)], list(range(8)))
        assert res.ok, res.failed
        s = tier.stats()
        assert s.peak_in_flight == 4 and s.in_flight == 0


async def test_loads_jump_ahead_of_queued_stores() -> None:
    tier, _ = make(max_inflight=1)
    async with tier:
        assert (await tier.offload([b"hot"], [0])).ok
        tier.log.clear()
        tier.gate.clear()
        stores = asyncio.ensure_future(tier.offload([b"s%d" % i for i in range(6)], list(range(6))))
        await wait_until(lambda: len(tier.log) == 1)  # first store holds the only slot
        assert tier.stats().queued == 5
        load = asyncio.ensure_future(tier.load([b"hot"], [9]))
        await wait_until(lambda: tier.stats().queued == 6)
        tier.gate.set()
        assert (await load).ok and (await stores).ok
        assert [op for op, _ in tier.log] == ["store", "load"] + ["store"] * 5


async def test_drop_policy_fails_stores_that_get_no_slot_and_never_drops_loads() -> None:
    tier, _ = make(max_inflight=1, store_backpressure="drop", backpressure_timeout_s=0.01)
    async with tier:
        assert (await tier.offload([b"hot"], [0])).ok
        tier.gate.clear()
        call = asyncio.ensure_future(tier.offload([b"a", b"b", b"c"], [1, 2, 3]))
        await wait_until(lambda: tier.stats().in_flight == 1)  # "a" holds the only slot
        load = asyncio.ensure_future(tier.load([b"hot"], [4]))
        await wait_until(lambda: tier.stats().failures["backpressure"] == 2)
        tier.gate.set()
        res = await call
        assert res.succeeded == [b"a"]
        assert set(res.failed) == {b"b", b"c"}
        assert all(isinstance(e, BackpressureError) for e in res.failed.values())
        assert (await load).ok, "a load was dropped"
        assert await tier.lookup([b"a", b"b", b"c"]) == [True, False, False]


async def test_cancel_waits_for_running_io_and_withdraws_queued_io() -> None:
    tier, _ = make(max_inflight=2)
    async with tier:
        keys = [b"k%d" % i for i in range(6)]
        assert (await tier.offload(keys, list(range(6)))).ok
        tier.log.clear()
        tier.gate.clear()
        task = asyncio.ensure_future(tier.load(keys, list(range(10, 16))))
        await wait_until(lambda: tier.stats().in_flight == 2)
        task.cancel()
        for _ in range(20):
            await asyncio.sleep(0.001)
        assert not task.done(), "the caller regained control while two reads were writing into its buffer"
        assert tier.stats().queued == 0, "queued chunks of the cancelled call were not withdrawn"
        tier.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert tier.stats().in_flight == 0
        assert len(tier.log) == 2, "a chunk I/O started after the cancellation"


async def test_drain_and_close_wait_for_the_calls_in_flight_and_no_longer() -> None:
    """drain() returns at once with no call in flight; else once the last has ended (two
    overlapping calls: not at the first's end); aclose() waits for them too."""
    tier, _ = make(max_inflight=4)
    async with tier:
        await tier.drain()
        tier.gate.clear()
        first = asyncio.ensure_future(tier.offload([b"a"], [0]))
        second = asyncio.ensure_future(tier.offload([b"b"], [1]))
        await wait_until(lambda: tier.stats().in_flight == 2)
        drained = asyncio.ensure_future(tier.drain())
        for _ in range(10):
            await asyncio.sleep(0.001)
        assert not drained.done()
        tier.gate.set()
        await drained
        assert first.done() and second.done() and first.result().ok and second.result().ok
        await tier.drain()
        tier.gate.clear()
        third = asyncio.ensure_future(tier.offload([b"c"], [2]))
        await wait_until(lambda: tier.stats().in_flight == 1)
        asyncio.get_running_loop().call_later(0.02, tier.gate.set)
    assert third.done() and third.result().ok  # the close waited for it


class _OwnEngine:
    """An engine of a tier's own: the ``Engine`` protocol and nothing more (no ``new_batch``),
    here around the threads engine."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.calls = 0

    in_flight = property(lambda self: self._inner.in_flight)
    peak_in_flight = property(lambda self: self._inner.peak_in_flight)
    queued = property(lambda self: self._inner.queued)
    workers = property(lambda self: self._inner.workers)

    def start(self) -> None:
        self._inner.start()

    async def run(self, jobs: Any, **kw: Any) -> None:
        self.calls += 1
        await self._inner.run(jobs, **kw)

    def cancel_pending(self, jobs: Any) -> Any:
        return self._inner.cancel_pending(jobs)

    async def stop(self) -> None:
        await self._inner.stop()

    def stop_nowait(self) -> None:
        self._inner.stop_nowait()


async def test_an_engine_of_a_tiers_own_needs_only_the_engine_protocol() -> None:
    """new_batch is the built-in engines' (their loop's own event): an engine without it runs
    calls with a plain batch."""
    from asynctier.engines.threads import ThreadEngine

    class OwnTier(GatedTier):
        def make_engine(self) -> Any:
            return _OwnEngine(ThreadEngine(2))

    view = memoryview(bytearray(SPEC.total_bytes))
    tier = OwnTier(offloading_spec=SPEC, primary_kv_view=view, max_inflight=2)
    async with tier:
        assert not hasattr(tier._engine, "new_batch")
        view[:4096] = b"x" * 4096
        assert (await tier.offload([b"a", b"b"], [0, 1])).ok
        view[:] = bytes(len(view))
        assert (await tier.load([b"a"], [2])).ok and bytes(view[8192:12288]) == b"x" * 4096
        assert tier._engine.calls == 2


async def test_cancel_under_timeout_context_also_waits() -> None:
    tier, _ = make(max_inflight=1)
    async with tier:
        tier.gate.clear()
        releaser = asyncio.get_running_loop().call_later(0.05, tier.gate.set)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(tier.offload([b"x", b"y"], [0, 1]), 0.01)
        assert tier.gate.is_set(), "wait_for returned before the running store finished"
        assert tier.stats().in_flight == 0
        releaser.cancel()


class SlowAsyncTier(AsyncChunkTier):
    """Coroutine primitives that never finish, to exercise ``timeout_s``."""

    async def write_chunk(self, key: bytes, data: memoryview) -> None:
        await asyncio.Event().wait()

    async def read_chunk(self, key: bytes, out: memoryview) -> None:
        await asyncio.Event().wait()

    async def chunk_exists(self, key: bytes) -> bool:
        await asyncio.Event().wait()
        return False

    async def delete_chunk(self, key: bytes) -> bool:
        return False


async def test_async_tier_deadline_fails_the_chunk_with_timeout() -> None:
    view = memoryview(bytearray(SPEC.total_bytes))
    async with SlowAsyncTier(offloading_spec=SPEC, primary_kv_view=view, timeout_s=0.02, max_inflight=2) as tier:
        res = await tier.offload([b"a", b"b", b"c"], [0, 1, 2])
        assert set(res.failed) == {b"a", b"b", b"c"}
        assert all(isinstance(e, ChunkTimeoutError) for e in res.failed.values())
        assert tier.stats().failures["timeout"] == 3
        assert await tier.lookup([b"a"]) == [False]  # an unreachable medium answers "not stored"


async def test_primitive_exceptions_become_that_chunks_failure() -> None:
    class Flaky(GatedTier):
        def write_chunk(self, key: bytes, data: memoryview) -> None:
            if key == b"bad":
                raise OSError(28, "No space left on device")
            super().write_chunk(key, data)

    view = memoryview(bytearray(SPEC.total_bytes))
    async with Flaky(offloading_spec=SPEC, primary_kv_view=view) as tier:
        res = await tier.offload([b"ok", b"bad"], [0, 1])
        assert res.succeeded == [b"ok"]
        assert isinstance(res.failed[b"bad"], OSError) and res.failed[b"bad"].errno == 28
        assert tier.stats().failures["io"] == 1
        with pytest.raises(Exception, match="1 of 2 chunks failed"):
            res.raise_for_failures()


async def test_readonly_view_offloads_but_cannot_load() -> None:
    view = memoryview(bytes(SPEC.total_bytes))
    async with GatedTier(offloading_spec=SPEC, primary_kv_view=view) as tier:
        assert (await tier.offload([b"a"], [0])).ok
        with pytest.raises(TypeError, match="read-only"):
            await tier.load([b"a"], [1])


async def test_close_stops_worker_threads() -> None:
    before = {t.name for t in threading.enumerate()}
    tier, _ = make(max_inflight=3)
    async with tier:
        assert sum(t.name.startswith("asynctier-GatedTier-io") for t in threading.enumerate()) == 3
    after = {t.name for t in threading.enumerate() if t.name.startswith("asynctier")} - before
    assert not after, f"threads left running: {after}"


async def test_a_tier_dropped_without_close_does_not_leak_threads() -> None:
    import gc

    tier, _ = make(max_inflight=3)
    await tier.open()
    assert (await tier.offload([b"a"], [0])).ok
    threads = [t for t in threading.enumerate() if t.name.startswith("asynctier-GatedTier-io")]
    assert len(threads) == 3
    del tier
    gc.collect()
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)


async def test_a_group_job_that_misreports_fails_its_chunks_never_succeeds_them() -> None:
    """A tier's group body must account for every chunk; one that does not cannot pass them off as done."""

    class ShortGroups(GatedTier):
        def group_size(self, op: str, n: int) -> int:
            return 4 if op == "offload" else 1

        def group_body(self, op: str) -> Any:
            def body(keys: list[bytes], ids: list[int], t0: float) -> list[BaseException | None]:
                return [None] * (len(keys) - 1)  # forgets the last chunk of each group

            return body

    view = memoryview(bytearray(SPEC.total_bytes))
    async with ShortGroups(offloading_spec=SPEC, primary_kv_view=view) as tier:
        res = await tier.offload([b"k%d" % i for i in range(8)], list(range(8)))
        assert res.succeeded == [] and len(res.failed) == 8
        assert all(isinstance(e, RuntimeError) for e in res.failed.values())


async def test_finish_on_thread_lets_a_cancelled_caller_go_only_after_the_thread_is_done() -> None:
    """A thread touching the caller's buffer cannot be stopped: cancellation waits for it."""
    from asynctier.core.backend import run_on_thread_to_end as finish_on_thread

    release = threading.Event()
    done: list[bool] = []

    def touch_buffer() -> int:
        release.wait(10)
        done.append(True)
        return 1

    task = asyncio.ensure_future(finish_on_thread(touch_buffer))
    await asyncio.sleep(0.01)
    task.cancel()
    for _ in range(20):
        await asyncio.sleep(0.005)
    assert not task.done() and not done  # still waiting for the thread
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert done == [True]
    assert await finish_on_thread(lambda a, b: a + b, 2, 3) == 5


async def test_finish_on_thread_keeps_the_cancellation_when_the_thread_then_fails() -> None:
    """Cancelled while the thread runs, and the thread then raises: the caller still hears
    the cancellation (the thread's error used to replace it, and the task went on)."""
    from asynctier.core.backend import run_on_thread_to_end as finish_on_thread

    release = threading.Event()

    def fails_late() -> None:
        release.wait(10)
        raise OSError(5, "EIO")

    task = asyncio.ensure_future(finish_on_thread(fails_late))
    await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.sleep(0.02)
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


class StrayCancelTier(AsyncChunkTier):
    """Stores in a dict; writing b"stray" awaits a future someone else cancelled, writing
    b"odd" raises a BaseException that is not an Exception."""

    class Odd(BaseException):
        pass

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data: dict[bytes, bytes] = {}

    async def write_chunk(self, key: bytes, data: memoryview) -> None:
        if key == b"stray":
            fut = asyncio.get_running_loop().create_future()
            fut.cancel()
            await fut
        if key == b"odd":
            raise self.Odd("not an Exception")
        self.data[key] = bytes(data)

    async def read_chunk(self, key: bytes, out: memoryview) -> None:
        out[:] = self.data[key]

    async def chunk_exists(self, key: bytes) -> bool:
        return key in self.data

    async def delete_chunk(self, key: bytes) -> bool:
        return self.data.pop(key, None) is not None


@pytest.mark.skipif(not hasattr(asyncio.Task, "cancelling"), reason="Task.cancelling() is Python 3.11+")
async def test_a_stray_cancellation_inside_a_primitive_fails_its_chunk_not_the_engine() -> None:
    """An async primitive that awaits a future cancelled elsewhere fails its chunk; the
    engine's one worker lives on (it used to end, and every later call hung)."""
    view = memoryview(bytearray(SPEC.total_bytes))
    async with StrayCancelTier(offloading_spec=SPEC, primary_kv_view=view, max_inflight=1) as tier:
        for bad in (b"stray", b"odd"):
            res = await tier.offload([bad], [0])
            assert set(res.failed) == {bad}
            res = await asyncio.wait_for(tier.offload([b"fine"], [1]), 30)
            assert res.ok
            assert tier.stats().queued == 0 and tier.stats().in_flight == 0
            await tier.remove([b"fine"])


class StallingDeleteTier(AsyncChunkTier):
    """Serves one bad copy; deleting it never returns (a stalled server)."""

    uses_index = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.data: dict[bytes, bytes] = {}

    async def write_chunk(self, key: bytes, data: memoryview) -> None:
        self.data[key] = bytes(data)

    async def read_chunk(self, key: bytes, out: memoryview) -> None:
        raise IntegrityError("chunk payload checksum mismatch", key)

    async def chunk_exists(self, key: bytes) -> bool:
        return key in self.data

    async def delete_chunk(self, key: bytes) -> bool:
        await asyncio.Event().wait()
        return True


@pytest.mark.parametrize("bad", [0, -1, True, float("nan")])
def test_a_deadline_is_a_number_of_seconds_above_zero(bad: object) -> None:
    """``timeout_s=0`` was accepted, and every chunk then failed its deadline."""
    view = memoryview(bytearray(SPEC.total_bytes))
    with pytest.raises(TierConfigError, match=r"timeout_s must be a number of seconds > 0"):
        SlowAsyncTier(offloading_spec=SPEC, primary_kv_view=view, timeout_s=bad)


async def test_deleting_a_bad_copy_is_under_the_deadline_too() -> None:
    """A load (or verify) that finds a bad copy deletes it within ``timeout_s``: a stalled
    server fails the delete, not the call forever; the chunk's failure stays the checksum's."""
    view = memoryview(bytearray(SPEC.total_bytes))
    tier = StallingDeleteTier(offloading_spec=SPEC, primary_kv_view=view, timeout_s=0.05, capacity_bytes=8 * 4096)
    async with tier:
        assert (await tier.offload([b"a", b"b"], [0, 1])).ok
        res = await asyncio.wait_for(tier.load([b"a"], [2]), 30)
        assert isinstance(res.failed[b"a"], IntegrityError)
        assert tier.index is not None and not tier.index.being_removed(b"a")
        res = await asyncio.wait_for(tier.verify_chunks([b"b"], remove_bad=True), 30)
        assert isinstance(res.failed[b"b"], IntegrityError)
        assert tier.stats().in_flight == 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_non_finite_or_negative_durations_are_refused(bad: float) -> None:
    view = memoryview(bytearray(SPEC.total_bytes))
    cases = (("backpressure_timeout_s", "a number of seconds >= 0"), ("timeout_s", "a number of seconds > 0"))
    for name, says in cases:
        with pytest.raises(TierConfigError, match=f"{name} must be {says}"):
            GatedTier(offloading_spec=SPEC, primary_kv_view=view, **{name: bad})


class CountingTier(GatedTier):
    """Counts its medium's opens and closes; both can be held on events."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.opened = self.closed = 0
        self.open_gate, self.close_gate = threading.Event(), threading.Event()
        self.open_gate.set()
        self.close_gate.set()
        self.in_open = threading.Event()

    def open_medium(self) -> None:
        self.in_open.set()
        assert self.open_gate.wait(30)
        self.opened += 1

    def close_medium(self) -> None:
        assert self.close_gate.wait(30)
        self.closed += 1


def counting() -> CountingTier:
    return CountingTier(offloading_spec=SPEC, primary_kv_view=memoryview(bytearray(SPEC.total_bytes)))


def engine_threads() -> int:
    return sum(t.name.startswith("asynctier-CountingTier") or "-io-" in t.name for t in threading.enumerate())


async def test_aclose_during_open_closes_what_the_open_made() -> None:
    """aclose() while open() is setting up: the open finishes, then the close undoes it; the
    tier ends closed (it used to end open, with its workers, after aclose() had returned)."""
    threads_before = engine_threads()
    tier = counting()
    tier.open_gate.clear()
    opening = asyncio.ensure_future(tier.open())
    assert await asyncio.to_thread(tier.in_open.wait, 30)
    closing = asyncio.ensure_future(tier.aclose())
    await asyncio.sleep(0.02)
    assert not closing.done()  # it waits for the open to end
    tier.open_gate.set()
    await opening
    await closing
    assert not tier.is_open and (tier.opened, tier.closed) == (1, 1)
    assert engine_threads() == threads_before
    with pytest.raises(TierClosedError):
        await tier.offload([b"a"], [0])
    with pytest.raises(TierClosedError):
        await tier.open()


async def test_an_open_waiting_behind_another_never_opens_a_second_medium() -> None:
    """A second open() waiting while the first sets up, then aclose(): the second returns
    the open tier or, if the close came first, fails; never a second engine and medium (it
    used to open both, and the close stopped only the second engine)."""
    threads_before = engine_threads()
    tier = counting()
    tier.open_gate.clear()
    first = asyncio.ensure_future(tier.open())
    assert await asyncio.to_thread(tier.in_open.wait, 30)
    second = asyncio.ensure_future(tier.open())
    await asyncio.sleep(0.01)
    tier.open_gate.set()
    closing = asyncio.ensure_future(tier.aclose())
    await first
    await closing
    try:
        await second
    except TierClosedError:
        pass
    assert (tier.opened, tier.closed) == (1, 1)  # one medium opened, the same one closed
    assert engine_threads() == threads_before


async def test_every_aclose_returns_after_the_close_and_a_cancelled_one_still_closes() -> None:
    tier = counting()
    await tier.open()
    tier.close_gate.clear()
    a = asyncio.ensure_future(tier.aclose())
    b = asyncio.ensure_future(tier.aclose())
    await asyncio.sleep(0.02)
    assert not a.done() and not b.done()  # both wait for the medium to be released
    a.cancel()
    with pytest.raises(asyncio.CancelledError):
        await a
    assert not b.done()
    tier.close_gate.set()
    await b
    assert tier.closed == 1 and not tier.is_open
    await tier.aclose()  # and again: nothing left to do
    assert tier.closed == 1


def test_capacity_on_a_tier_that_cannot_bound_itself_is_refused() -> None:
    """A tier without an index (and not bounding itself) refuses capacity_bytes instead of
    reporting a bound it never keeps."""
    view = memoryview(bytearray(SPEC.total_bytes))
    with pytest.raises(TierConfigError, match="does not bound what it holds"):
        GatedTier(offloading_spec=SPEC, primary_kv_view=view, capacity_bytes=8 * 4096)

    class Indexed(GatedTier):
        uses_index = True

    assert Indexed(offloading_spec=SPEC, primary_kv_view=view, capacity_bytes=8 * 4096).capacity_bytes == 8 * 4096


def test_max_inflight_has_a_documented_cap() -> None:
    """100,000 workers raised "can't start new thread" from open() and left hundreds of
    threads behind; the cap refuses it at construction, naming the maximum."""
    from asynctier.core import MAX_INFLIGHT

    with pytest.raises(TierConfigError, match=f"at most {MAX_INFLIGHT}"):
        make(max_inflight=100_000)
    assert make(max_inflight=MAX_INFLIGHT)[0].max_inflight == MAX_INFLIGHT


async def test_an_open_that_cannot_start_its_workers_leaves_none_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    tier, _ = make(max_inflight=8)
    started = 0
    real_start = threading.Thread.start

    def start_some(self: threading.Thread) -> None:
        nonlocal started
        if self.name.startswith("asynctier-") and started == 3:
            raise RuntimeError("can't start new thread")
        started += self.name.startswith("asynctier-")
        real_start(self)

    before = {t for t in threading.enumerate() if t.name.startswith("asynctier-GatedTier-io")}
    monkeypatch.setattr(threading.Thread, "start", start_some)
    with pytest.raises(RuntimeError, match="can't start new thread"):
        await tier.open()
    monkeypatch.undo()
    for _ in range(200):
        left = {t for t in threading.enumerate() if t.name.startswith("asynctier-GatedTier-io")} - before
        if not left:
            break
        await asyncio.sleep(0.01)
    assert not left, left
    assert not tier.is_open


async def test_calls_after_the_workers_stopped_at_exit_raise_tier_closed() -> None:
    """At interpreter exit the tier's finalizer stops its workers; a call made then (from a
    daemon thread's loop) got a bare RuntimeError('engine is stopped')."""
    tier, _ = make()
    async with tier:
        assert tier._engine is not None
        tier._engine.stop_nowait()  # what the finalizer does at exit
        with pytest.raises(TierClosedError, match="workers have stopped"):
            await tier.offload([b"k"], [0])


@pytest.mark.parametrize("config", [{"type": "AsyncDictTier", "module_path": "async_dict_tier"}, {"type": "fs"}])
def test_a_tier_called_from_another_event_loop_says_so_instead_of_hanging(tmp_path: Any, config: Any) -> None:
    """Issue 24 item 14: opened on one loop, called from another, the fs tier on its native
    engine never completed. An engine whose workers live on the opening loop (tasks, native)
    refuses the call with a clear error; the threads engine serves any loop."""
    from asynctier import SecondaryTierFactory, TierStateError
    from asynctier.engines import native

    if config["type"] == "fs":
        if native.problem() is not None:
            pytest.skip(f"no native workers: {native.problem()}")
        config = {**config, "root": str(tmp_path), "io_engine": "native"}
    view = memoryview(bytearray(SPEC.total_bytes))
    tier = SecondaryTierFactory.create_secondary_tier(config, view, SPEC)
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        first.run_until_complete(tier.open())
        assert first.run_until_complete(tier.offload([b"k"], [0])).ok
        with pytest.raises(TierStateError, match="opened on another event loop"):
            second.run_until_complete(asyncio.wait_for(tier.load([b"k"], [1]), 10))
        assert first.run_until_complete(tier.load([b"k"], [1])).ok  # the opening loop still works
        first.run_until_complete(tier.aclose())
    finally:
        first.close()
        second.close()


def _loop_bound_tier(tmp_path: Any, kind: str) -> Any:
    """A tier on an engine whose workers live on the loop that opens it: tasks, native."""
    from nvme_helpers import aligned

    from asynctier import SecondaryTierFactory
    from asynctier.engines import native

    if kind == "tasks":
        config: dict[str, Any] = {"type": "AsyncDictTier", "module_path": "async_dict_tier"}
    elif kind == "chain":  # (its background writers are coroutines of that loop too)
        below = {"type": "AsyncDictTier", "module_path": "async_dict_tier"}
        config = {"type": "chain", "write": "back", "tiers": [{"type": "memory", "capacity_bytes": 1 << 20}, below]}
    else:
        if native.problem() is not None:
            pytest.skip(f"no native workers: {native.problem()}")
        config = {"type": kind, "io_engine": "native"}
        config.update(
            {"root": str(tmp_path)} if kind == "fs" else {"path": str(tmp_path / "slab"), "capacity_bytes": 1 << 22}
        )
    return SecondaryTierFactory.create_secondary_tier(config, aligned(SPEC.total_bytes), SPEC)


def _run_on(library: str, fn: Any) -> Any:
    if library == "trio":
        import trio

        return trio.run(fn)
    return asyncio.run(fn())


@pytest.mark.parametrize("kind", ["tasks", "fs", "nvme", "chain"])
@pytest.mark.parametrize(("first", "second"), [("asyncio", "asyncio"), ("trio", "trio"), ("trio", "asyncio")])
def test_a_tier_closed_on_another_loop_once_its_own_is_gone_closes(tmp_path: Any, kind: str, first: str,
                                                                      second: str) -> None:  # fmt: skip
    """Opened in one ``asyncio.run`` (or ``trio.run``) and closed in the next, a tier on the
    native engine waited for ever for service coroutines that ended with the first loop.
    Once that loop is gone, the close runs without it: the workers finish and are joined, the
    files are closed."""
    import os

    def threads() -> set[str]:  # (the process-wide blocking pool outlives tiers)
        return {t.name for t in threading.enumerate() if not t.name.startswith("asynctier-blocking")}

    tier = _loop_bound_tier(tmp_path, kind)
    before, fds = threads(), len(os.listdir("/proc/self/fd"))

    async def use() -> None:
        await tier.open()
        assert (await tier.offload([b"k"], [0])).ok

    async def close() -> None:
        with anyio.fail_after(20):
            await tier.aclose()

    _run_on(first, use)
    _run_on(second, close)
    assert not tier.is_open
    with pytest.raises(TierClosedError):
        _run_on(second, lambda: tier.lookup([b"k"]))
    for _ in range(100):  # (the slow-path threads leave once idle)
        if threads() <= before:
            break
        time.sleep(0.05)
    assert threads() <= before
    assert len(os.listdir("/proc/self/fd")) <= fds


@pytest.mark.parametrize("below", ["tasks", "fs"])
def test_a_trio_run_that_ends_with_a_chains_write_back_in_flight_ends(tmp_path: Any, below: str) -> None:
    """trio cancels its system tasks as a run ends, in no order: the tier's workers (and the
    native engine's reaper) could go first, and the chain's background writer, shielded,
    then waited for ever for a write they would never run or reap: the run never ended. The
    last worker out now fails what is left, and the reaper reaps what is in flight first."""
    import trio
    from nvme_helpers import aligned

    from asynctier import SecondaryTierFactory
    from asynctier.engines import native

    if below == "fs" and native.problem() is not None:
        pytest.skip(f"no native workers: {native.problem()}")
    lower: dict[str, Any] = (
        {"type": "AsyncDictTier", "module_path": "async_dict_tier"} if below == "tasks"
        else {"type": "fs", "root": str(tmp_path), "io_engine": "native"}
    )  # fmt: skip
    for i in range(12):  # (the order varies run to run: most of these hung)
        tier = SecondaryTierFactory.create_secondary_tier(
            {"type": "chain", "write": "back", "tiers": [{"type": "memory", "capacity_bytes": 1 << 20}, lower]},
            aligned(SPEC.total_bytes), SPEC,
        )  # fmt: skip

        async def use() -> None:
            await tier.open()  # noqa: B023
            assert (await tier.offload([b"k%d" % i], [0])).ok  # noqa: B023

        trio.run(use)
        _run_on("trio", tier.aclose)  # (closes on a later run, as the test above)


@pytest.mark.parametrize("kind", ["fs", "nvme"])
@pytest.mark.parametrize("library", ["asyncio", "trio"])
def test_a_tier_dropped_open_after_its_loop_is_gone_leaves_no_descriptor(tmp_path: Any, kind: str,
                                                                          library: str) -> None:  # fmt: skip
    """Never closed, a native tier's finalizer tears its pool down: on the loop's thread while
    that loop runs, and at once once it is gone. It used to leave that to the gone loop: each
    tier dropped so kept its eventfd open (and its workers unjoined)."""
    import gc
    import os

    def ours() -> tuple[int, set[str]]:
        """Descriptors of the tier's files, and the ids of the process's eventfds (the pool's is
        one): told apart by id, not counted, since a thread another test left may open or close
        some meanwhile."""
        files, events = 0, set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
                if "eventfd" in target:
                    with open(f"/proc/self/fdinfo/{fd}") as f:
                        info = dict(line.split(":", 1) for line in f if ":" in line)
                    # eventfd-id: unique per eventfd (Linux 6.0); else the fd and its count
                    events.add(info.get("eventfd-id", f"fd {fd}").strip())
            except OSError:  # closed meanwhile
                continue
            files += target.startswith(str(tmp_path))
        return files, events

    held = [_loop_bound_tier(tmp_path, kind)]
    _, events_before = ours()

    async def use() -> None:
        await held[0].open()
        assert (await held[0].offload([b"k"], [0])).ok

    _run_on(library, use)
    files, events = ours()
    pools = events - events_before
    assert files > 0 and pools  # (the tier's files, the pool's eventfd)
    held.clear()
    gc.collect()
    files, events = ours()
    assert files == 0 and not pools & events


@pytest.mark.parametrize("kind", ["tasks", "fs", "nvme", "chain"])
def test_a_tier_closed_from_another_loop_while_its_own_runs_is_refused_and_stays_open(tmp_path: Any,
                                                                                     kind: str) -> None:  # fmt: skip
    """The loop a tier was opened on still runs: a close from another loop is refused before
    anything changes (the workers serve that loop), and the tier goes on serving it."""
    tier = _loop_bound_tier(tmp_path, kind)
    home, other = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        home.run_until_complete(tier.open())
        with pytest.raises(
            TierStateError, match="opened on another event loop, which still runs: close it on that loop"
        ):
            other.run_until_complete(asyncio.wait_for(tier.aclose(), 20))
        assert tier.is_open
        assert home.run_until_complete(tier.offload([b"k"], [0])).ok
        home.run_until_complete(tier.aclose())
        assert not tier.is_open
    finally:
        home.close()
        other.close()


# -- the native engine's batches (issue 28 item 1) ------------------------------------------------
def _native_fs(tmp_path: Any, nchunks: int, **kw: Any) -> tuple[Any, memoryview]:
    from asynctier import SecondaryTierFactory
    from asynctier.engines import native

    if native.problem() is not None:
        pytest.skip(f"no native workers: {native.problem()}")
    spec = OffloadingSpec(4096, nchunks)
    view = memoryview(bytearray(spec.total_bytes))
    config = {"type": "fs", "root": str(tmp_path), "io_engine": "native", **kw}
    return SecondaryTierFactory.create_secondary_tier(config, view, spec), view


async def test_a_native_call_wakes_the_loop_per_batch_not_per_chunk(tmp_path: Any) -> None:
    """A 64-chunk offload or load on the native engine reaches the workers in batches and is
    reported back in batches: the workers wake the event loop far fewer times than once per
    chunk (stats().extra["loop_wakeups"]), and every chunk still round-trips."""
    tier, view = _native_fs(tmp_path, 128, max_inflight=16)
    for i in range(64):
        view[i * 4096 : (i + 1) * 4096] = bytes([i]) * 4096
    keys = [b"w-%d" % i for i in range(64)]
    async with tier:
        before = tier.stats().extra["loop_wakeups"]
        res = await tier.offload(keys, list(range(64)))
        stored = tier.stats().extra["loop_wakeups"]
        assert res.ok and len(res.succeeded) == 64
        assert 1 <= stored - before <= 32
        res = await tier.load(keys, list(range(64, 128)))
        loaded = tier.stats().extra["loop_wakeups"]
        assert res.ok and 1 <= loaded - stored <= 32
        assert bytes(view[64 * 4096 :]) == bytes(view[: 64 * 4096])
        s = tier.stats()
        assert (s.offloaded, s.loaded, s.in_flight, s.queued) == (64, 64, 0, 0)


async def test_a_cancelled_native_call_withdraws_its_queued_chunks_and_leaves_each_key_whole(tmp_path: Any) -> None:
    """Cancelled while most of its chunks wait (one I/O at a time): the call returns only with
    nothing of it running or queued; each key is stored whole or not at all, and the stored
    ones load back."""
    n = 512
    tier, view = _native_fs(tmp_path, 2 * n, max_inflight=1)
    for i in range(n):
        view[i * 4096 : (i + 1) * 4096] = i.to_bytes(2, "big") * 2048
    keys = [b"c-%d" % i for i in range(n)]
    async with tier:
        call = asyncio.ensure_future(tier.offload(keys, list(range(n))))
        await wait_until(lambda: tier.stats().offloaded > 0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        s = tier.stats()
        assert (s.in_flight, s.queued) == (0, 0)
        assert 0 < s.offloaded < n  # withdrawn, not run to the end
        present = [k for k, hit in zip(keys, await tier.lookup(keys)) if hit]
        assert len(present) == s.offloaded
        ids = [n + keys.index(k) for k in present]
        assert (await tier.load(present, ids)).ok
        for cid in ids:
            i = cid - n
            assert bytes(view[cid * 4096 : (cid + 1) * 4096]) == bytes(view[i * 4096 : (i + 1) * 4096])


@pytest.mark.parametrize(("home", "other"), [("asyncio", "asyncio"), ("trio", "trio"), ("trio", "asyncio")])
def test_a_threads_engine_tier_closes_while_another_loop_has_a_call_in_flight(home: str, other: str) -> None:
    """The threads engine serves any loop. A call from a second loop's thread was counted
    without a lock, and the close's drain() was woken from that thread with its own loop's
    Event: aclose() on the opening loop never returned (or trio's Event raised in the other
    thread, losing that call's result)."""
    from asynctier import SecondaryTierFactory

    spec = OffloadingSpec(1 << 20, 8, namespace="test/two-loops")
    buf = bytearray(spec.total_bytes)
    tier = SecondaryTierFactory.create_secondary_tier({"type": "memory", "max_inflight": 1}, memoryview(buf), spec)
    started, got = threading.Event(), []

    def elsewhere() -> None:
        async def call() -> None:
            started.set()
            got.append(await tier.offload([b"k%d" % i for i in range(8)], list(range(8))))

        _run_on(other, call)

    async def main() -> None:
        await tier.open()
        t = threading.Thread(target=elsewhere)
        t.start()
        await anyio.to_thread.run_sync(started.wait)
        with anyio.fail_after(20):
            # (started is set just before the call begins: a close before it refused the call)
            while not (tier._active or got):  # noqa: ASYNC110 (a count of the tier's)
                await anyio.sleep(0.001)
            await tier.aclose()
        await anyio.to_thread.run_sync(t.join)

    _run_on(home, main)
    assert len(got) == 1 and got[0].ok, got


class InterruptingTier(GatedTier):
    """Its first read raises SIGINT in the process, from its worker thread: the interrupt
    comes while the load is in flight, whatever the machine's speed."""

    interrupted = False

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        if not self.interrupted:
            self.interrupted = True
            signal.raise_signal(signal.SIGINT)
        super().read_chunk(key, out)


def test_a_keyboard_interrupt_on_trio_returns_only_once_no_io_touches_the_buffer() -> None:
    """trio raises a KeyboardInterrupt into the task blocked in a call: the call let it
    through at once, with its queued jobs left to run into the caller's buffer after."""
    import trio

    spec = OffloadingSpec(1 << 20, 64, namespace="test/ki")
    buf = bytearray(spec.total_bytes)
    tier = InterruptingTier(offloading_spec=spec, primary_kv_view=memoryview(buf), max_inflight=1)
    keys = [b"k%d" % i for i in range(64)]
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with tier:
            assert (await tier.offload(keys, list(range(64)))).ok
            try:
                await tier.load(keys, list(range(64)))
            except KeyboardInterrupt:
                seen["interrupted"] = True
                s = tier.stats()
                seen["at_return"] = (s.in_flight, s.queued)
                buf[:] = b"\xee" * len(buf)
                await trio.sleep(0.3)
                seen["untouched"] = buf.count(b"\xee") == len(buf)
                seen["reads"] = sum(op == "load" for op, _ in tier.log)

    trio.run(main)
    # the read in flight ended before the call returned, the 63 queued behind it never ran
    assert seen.get("interrupted") and seen["at_return"] == (0, 0) and seen["untouched"], seen
    assert seen["reads"] < 64, seen


def test_a_breaker_closed_by_another_answer_counts_the_late_probes_failure_as_one_of_many() -> None:
    """A success of a request admitted before the breaker opened closed it but left it
    "probing": the probe's failure then reopened it at once, after one failure, not
    ``threshold``."""
    from asynctier.core.breaker import Breaker

    b = Breaker(threshold=3, cooldown_s=0.0)
    for _ in range(3):
        b.failure(probe=False)
    assert b.state == "half-open"  # (no cooldown: the next request is the probe)
    assert b.before() is True
    b.success(probe=False)  # an older request's answer: reachable
    assert b.state == "closed"
    b.failure(probe=True)  # the probe's late failure
    assert b.state == "closed" and b.before() is False


def test_a_breaker_lets_one_probe_out_at_a_time_even_after_another_answer_closed_it() -> None:
    """Clearing the probe's flag when another request's answer closed the breaker let a
    second probe out while the first was still out (a re-review's sequence)."""
    from asynctier.core.breaker import Breaker
    from asynctier.errors import TierUnavailableError

    b = Breaker(threshold=2, cooldown_s=0.0)
    b.failure(probe=False)
    b.failure(probe=False)
    assert b.before() is True  # P1, the probe, goes out
    b.success(probe=False)  # an older request's answer closes the breaker
    b.failure(probe=False)
    b.failure(probe=False)  # open again
    with pytest.raises(TierUnavailableError):
        b.before()  # P1 is still out: no second probe
    b.neutral(probe=True)  # P1 ends
    assert b.before() is True
