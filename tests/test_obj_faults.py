"""The obj tier when the store misbehaves (through a loopback proxy in front of moto): refused
connections and the breaker, slow answers and deadlines, 5xx and retries, a server killed
mid-transfer; and no abort at interpreter exit with requests in flight.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from s3_helpers import BUCKET, FAST_FAULTS, FaultProxy, Rig, keys, kinds, moto, on_asyncio_only, s3_config, until_ok


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    p = FaultProxy(moto().port)
    yield p
    p.close()


async def test_a_probe_that_raises_a_base_exception_still_ends_its_turn() -> None:
    """The half-open breaker lets one request through as a probe; one that ends in a
    BaseException that is no answer (obstore's pyo3 PanicException is one) must still end
    the probe, else the breaker refuses every request of the tier from then on."""

    class Panic(BaseException):
        pass

    rig = Rig()
    tier = rig.tier({"type": "obj", "url": "memory://", "breaker_threshold": 1, "breaker_cooldown_s": 0.05})
    async with tier:
        tier._breaker.failure(False)  # one failure opens it (threshold 1)
        assert tier.breaker_state == "open"
        await asyncio.sleep(0.1)  # the cooldown passes
        with pytest.raises(Panic), tier._guarded(b"probe"):
            raise Panic("range start must not be greater than end")
        ks = keys(1)
        res = await until_ok(lambda: tier.offload(ks, [0]))
        assert res.ok


# -- faults through the loopback proxy -------------------------------------------------------------
@on_asyncio_only
async def test_connection_refused_opens_breaker_then_recovers(proxy: FaultProxy) -> None:
    rig = Rig()
    tier = rig.tier(s3_config(endpoint=proxy.endpoint, **FAST_FAULTS))
    async with tier:
        ks = keys(8)
        assert (await tier.offload(ks[:4], [0, 1, 2, 3])).ok
        proxy.kill()
        res = await tier.offload(ks[4:], [4, 5, 6, 7])
        assert set(res.failed) == set(ks[4:]) and kinds(res) == {"unavailable"}
        res = await tier.load(ks[:4], [8, 9, 10, 11])
        assert set(res.failed) == set(ks[:4]) and kinds(res) == {"unavailable"}
        s = tier.stats()
        assert s.extra["breaker_opened"] >= 1 and s.extra["breaker_fast_failed"] >= 1
        assert await tier.lookup(ks[4:]) == [False] * 4  # a dead store answers "not stored"
        proxy.revive()
        await until_ok(lambda: tier.offload(ks[4:], [4, 5, 6, 7]))
        rig.zero()
        await until_ok(lambda: tier.load(ks, list(range(8))))
        assert all(rig.chunk(i) == rig.orig_chunk(i) for i in range(8))
        assert tier.breaker_state == "closed"


@on_asyncio_only
async def test_loads_the_store_did_not_answer_leave_the_capacity_account_alone(proxy: FaultProxy) -> None:
    """A load adds a key it does not know to the account before its GET (another server may
    have stored it). Loads of keys never stored, failed as unavailable, left their entries
    there: once the store was back, a store "evicted" them by deleting real chunks."""
    from asynctier.integrity import ChunkHeader

    rig = Rig()
    ks = keys(3)
    per = rig.spec.chunk_bytes + ChunkHeader.packed_size(len(ks[0]))
    config = s3_config(endpoint=proxy.endpoint, capacity_bytes=4 * per, lookup_ttl_s=0, **FAST_FAULTS)
    tier = rig.tier(config)
    async with tier:
        assert (await tier.offload(ks[:2], [0, 1])).ok
        proxy.kill()
        res = await tier.load(keys(6, "absent"), list(range(2, 8)))
        assert kinds(res) == {"unavailable"}
        assert tier.stats().stored_chunks == 2
        proxy.revive()
        await until_ok(lambda: tier.load(ks[:1], [8]))
        assert (await tier.offload(ks[2:], [2])).ok
        assert await tier.lookup(ks) == [True] * 3 and tier.stats().evictions == 0


@on_asyncio_only
async def test_responses_slower_than_the_deadline_time_out(proxy: FaultProxy) -> None:
    rig = Rig()
    deadline = {"timeout_s": 0.5, "retry_timeout_s": 0.5, "breaker_threshold": 100}
    tier = rig.tier(s3_config(endpoint=proxy.endpoint, **{**FAST_FAULTS, **deadline}))
    async with tier:
        ks = keys(4)
        assert (await tier.offload(ks[:2], [0, 1])).ok
        proxy.delay_s = 1.5  # every response piece waits longer than timeout_s=0.5
        res = await tier.load(ks[:2], [8, 9])
        assert set(res.failed) == set(ks[:2]) and kinds(res) == {"timeout"}
        res = await tier.offload(ks[2:], [2, 3])
        assert set(res.failed) == set(ks[2:]) and kinds(res) == {"timeout"}
        assert tier.stats().failures["timeout"] == 4
        proxy.delay_s = 0.0
        proxy.drop_connections()
        await until_ok(lambda: tier.offload(ks[2:], [2, 3]))
        rig.zero()
        await until_ok(lambda: tier.load(ks, [4, 5, 6, 7]))
        assert [rig.chunk(4 + i) for i in range(4)] == [rig.orig_chunk(i) for i in range(4)]


@on_asyncio_only
async def test_5xx_answers_are_retried_then_fail_then_recover(proxy: FaultProxy) -> None:
    rig = Rig()
    tier = rig.tier(s3_config(endpoint=proxy.endpoint, **{**FAST_FAULTS, "max_inflight": 1}))
    async with tier:
        ks = keys(6)
        proxy.inject_503 = 2  # fewer than max_retries: obstore's retries absorb them
        proxy.drop_connections()
        res = await tier.offload(ks[:1], [0])
        assert res.ok, res.failed
        assert proxy.injected_503 == 2
        proxy.inject_503 = 10_000  # a store that keeps answering 503
        proxy.drop_connections()
        res = await tier.offload(ks[1:4], [1, 2, 3])
        assert set(res.failed) == set(ks[1:4]) and kinds(res) == {"unavailable"}
        assert "503" in str(next(iter(res.failed.values()))) or tier.stats().extra["breaker_fast_failed"]
        proxy.inject_503 = 0
        proxy.drop_connections()
        await until_ok(lambda: tier.offload(ks[1:], [1, 2, 3, 4, 5]))
        rig.zero()
        await until_ok(lambda: tier.load(ks, list(range(6))))
        assert all(rig.chunk(i) == rig.orig_chunk(i) for i in range(6))


@on_asyncio_only
async def test_server_killed_mid_transfer(proxy: FaultProxy) -> None:
    rig = Rig(chunk_bytes=512 * 1024, num_chunks=8)
    tier = rig.tier(s3_config(endpoint=proxy.endpoint, **FAST_FAULTS))
    async with tier:
        ks = keys(8)
        assert (await tier.offload(ks[:4], [0, 1, 2, 3])).ok
        # every connection dies after 100 KB: loads and stores of 512 KiB are cut mid-body
        proxy.kill_after_bytes = 100_000
        proxy.drop_connections()
        res = await tier.load(ks[:4], [4, 5, 6, 7])
        assert set(res.failed) == set(ks[:4]) and kinds(res) <= {"io", "unavailable"}, res.failed
        res = await tier.offload(ks[4:], [4, 5, 6, 7])
        assert set(res.failed) == set(ks[4:]) and kinds(res) <= {"io", "unavailable"}, res.failed
        proxy.revive()
        # now the server dies for good while a load is streaming slowly
        proxy.delay_s = 0.05
        task = asyncio.ensure_future(tier.load(ks[:4], [4, 5, 6, 7]))
        while proxy.bytes_down < 200_000 and not task.done():  # noqa: ASYNC110 - waits for the transfer
            await asyncio.sleep(0.01)
        proxy.kill()
        res = await task
        assert res.failed and kinds(res) <= {"io", "unavailable", "timeout"}
        proxy.revive()
        await until_ok(lambda: tier.offload(ks[4:], [4, 5, 6, 7]))
        rig.zero()
        await until_ok(lambda: tier.load(ks, list(range(8))))
        assert all(rig.chunk(i) == rig.orig_chunk(i) for i in range(8))


# -- exit safety ---------------------------------------------------------------------------------
CHILD = textwrap.dedent(
    """
    import asyncio, os, sys
    from asynctier import OffloadingSpec, SecondaryTierFactory

    url, mode = sys.argv[1], sys.argv[2]
    spec = OffloadingSpec(256 * 1024, 16, namespace="exit-test")
    buf = bytearray(os.urandom(spec.total_bytes))
    cfg = {"type": "obj", "url": url, "max_inflight": 8}
    if url.startswith("s3://"):
        cfg.update(endpoint=os.environ["TEST_S3_ENDPOINT"], region="us-east-1", client_options={"allow_http": True},
                   credentials={"access_key_id": "a", "secret_access_key": "b"})
    tier = SecondaryTierFactory.create_secondary_tier(cfg, memoryview(buf), spec)
    keys = [os.urandom(16) for _ in range(16)]

    async def main():
        await tier.open()
        assert (await tier.offload(keys, list(range(16)))).ok
        assert (await tier.load(keys[:8], list(range(8, 16)))).ok
        assert await tier.lookup(keys[:2]) == [True, True]
        if mode == "aclose":
            await tier.aclose()

    if mode == "inflight":
        # leave stores running in the worker threads and exit without waiting for them
        loop = asyncio.new_event_loop()
        loop.run_until_complete(tier.open())
        for i in range(4):
            loop.create_task(tier.offload([os.urandom(8) for _ in range(16)], list(range(16))))
        loop.run_until_complete(asyncio.sleep(0.005))
    else:
        asyncio.run(main())
    print("done", flush=True)
    """
)


def test_no_abort_at_exit_in_many_child_processes(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    runs = []
    for i in range(24):
        url = f"s3://{BUCKET}/exit-{i}" if i % 2 else f"file://{tmp_path}/exit-{i}"
        runs.append((url, ("noclose", "aclose", "inflight")[i % 3]))
    child_env = {**os.environ, "TEST_S3_ENDPOINT": moto().endpoint, "PYTHONPATH": str(Path(__file__).parent.parent)}

    def run(arg: tuple[str, str]) -> tuple[str, str, int, str]:
        p = subprocess.run(
            [sys.executable, str(script), *arg], capture_output=True, text=True, timeout=60, env=child_env
        )
        return arg[0], arg[1], p.returncode, p.stdout + p.stderr[-500:]

    with ThreadPoolExecutor(4) as ex:
        results = list(ex.map(run, runs))
    bad = [r for r in results if r[2] != 0 or "done" not in r[3]]
    assert not bad, bad
