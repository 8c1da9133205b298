"""The obj tier (tiers/obj.py): conformance on memory://, file:// and a real S3 server (moto on
127.0.0.1), faults through a loopback proxy, exit safety, configuration, integrity."""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.errors import failure_kind
from asynctier.testing import TierConformance

sys.path.insert(0, str(Path(__file__).parent))
from s3_helpers import CREDS, FaultProxy, MotoS3, create_bucket, env

BUCKET = "asynctier-test"
_MOTO: MotoS3 | None = None


def moto() -> MotoS3:
    """One moto server for the whole module (started on first use, stopped at exit)."""
    global _MOTO
    if _MOTO is None:
        _MOTO = MotoS3()
        create_bucket(_MOTO.endpoint, BUCKET)
    return _MOTO


def s3_config(endpoint: str | None = None, **extra: Any) -> dict[str, Any]:
    ep = endpoint or moto().endpoint
    return {
        "type": "obj",
        "url": f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}",
        "endpoint": ep,
        "region": "us-east-1",
        "credentials": {
            "access_key_id": CREDS["AWS_ACCESS_KEY_ID"],
            "secret_access_key": CREDS["AWS_SECRET_ACCESS_KEY"],
        },
        "client_options": {"allow_http": True},
        **extra,
    }


# -- conformance ------------------------------------------------------------------------------
class TestObjMemoryConformance(TierConformance):
    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "obj", "url": "memory://"}


class TestObjFileConformance(TierConformance):
    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "obj", "url": f"file://{tmp_path}/store"}


SLOW = os.environ.get("ASYNCTIER_SLOW_TESTS") == "1"


class TestObjS3Conformance(TierConformance):
    """The suite against moto's S3 server on 127.0.0.1, on the stock asyncio loop only.

    moto serves about 200 requests/s here, so the two checks that make 1200-2000 requests
    (30 s each) run only with ``ASYNCTIER_SLOW_TESTS=1``; they test the scheduler, which is
    the same code for this tier on every URL and runs above on memory:// and file://.
    """

    @pytest.fixture(params=["asyncio"])
    def loop_factory(self, request: pytest.FixtureRequest) -> Iterator[Any]:
        yield asyncio.new_event_loop

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return s3_config()

    @pytest.mark.skipif(not SLOW, reason="2000 requests to moto (~20 s); set ASYNCTIER_SLOW_TESTS=1")
    def test_loads_not_starved_by_store_flood(self, tmp_path: Path, loop_factory: Any) -> None:
        super().test_loads_not_starved_by_store_flood(tmp_path, loop_factory)

    @pytest.mark.skipif(not SLOW, reason="1200 requests to moto (~10 s); set ASYNCTIER_SLOW_TESTS=1")
    def test_inflight_bound_under_1000_concurrent_calls(self, tmp_path: Path, loop_factory: Any) -> None:
        super().test_inflight_bound_under_1000_concurrent_calls(tmp_path, loop_factory)


# -- helpers for the direct tests -----------------------------------------------------------------
CHUNK = 64 * 1024


class Rig:
    """A spec, a primary buffer with random chunks, and tiers built on it."""

    def __init__(self, chunk_bytes: int = CHUNK, num_chunks: int = 16, namespace: str = "obj/test") -> None:
        self.spec = OffloadingSpec(chunk_bytes, num_chunks, namespace=namespace)
        self.buf = bytearray(os.urandom(self.spec.total_bytes))
        self.orig = bytes(self.buf)

    def tier(self, config: dict[str, Any]) -> Any:
        return SecondaryTierFactory.create_secondary_tier(dict(config), memoryview(self.buf), self.spec)

    def chunk(self, cid: int) -> bytes:
        c = self.spec.chunk_bytes
        return bytes(self.buf[cid * c : (cid + 1) * c])

    def orig_chunk(self, cid: int) -> bytes:
        c = self.spec.chunk_bytes
        return self.orig[cid * c : (cid + 1) * c]

    def zero(self) -> None:
        self.buf[:] = bytes(len(self.buf))


def keys(n: int, tag: str = "k") -> list[bytes]:
    salt = uuid.uuid4().hex[:8]
    return [f"{tag}-{salt}-{i}".encode() for i in range(n)]


def kinds(res: Any) -> set[str]:
    return {failure_kind(e) for e in res.failed.values()}


async def until_ok(make_call: Any, attempts: int = 100, pause: float = 0.1) -> Any:
    """Retry a call until it fully succeeds (bounded attempts; no timing assertion)."""
    res = None
    for _ in range(attempts):
        res = await make_call()
        if res.ok:
            return res
        await asyncio.sleep(pause)
    raise AssertionError(f"never recovered: {res.failed if res is not None else None}")


def on_asyncio_only(fn: Any) -> Any:
    """Run an async test once, on the stock asyncio loop (not once per loop: these tests are
    about the server, not the loop, and moto is slow)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    p = FaultProxy(moto().port)
    yield p
    p.close()


FAST_FAULTS = {
    "timeout_s": 1.0,
    "connect_timeout_s": 0.5,
    "max_retries": 2,
    "retry_timeout_s": 1.0,
    "retry_backoff_s": 0.02,
    "retry_max_backoff_s": 0.1,
    "breaker_threshold": 3,
    "breaker_cooldown_s": 0.2,
    "max_inflight": 4,
}


# -- sharing, integrity, large chunks, capacity, lookup cache -------------------------------------
@pytest.mark.parametrize("where", ["s3", "file", "memory-store"])
async def test_two_tiers_on_one_prefix_see_each_others_chunks(where: str, tmp_path: Path) -> None:
    from obstore.store import MemoryStore

    a_rig, b_rig = Rig(), Rig()
    if where == "s3":
        cfg = s3_config()
    elif where == "file":
        cfg = {"type": "obj", "url": f"file://{tmp_path}/shared"}
    else:  # one obstore store object handed to both tiers
        cfg = {"type": "obj", "url": "memory://", "store": MemoryStore()}
    a, b = a_rig.tier(cfg), b_rig.tier({**cfg, "lookup_negative_ttl_s": 0})
    async with a, b:
        ks = keys(4)
        assert await b.lookup(ks) == [False] * 4
        assert (await a.offload(ks, [0, 1, 2, 3])).ok
        assert await b.lookup(ks) == [True] * 4  # no stale negative answer (TTL 0)
        res = await b.load(ks, [8, 9, 10, 11])
        assert res.ok, res.failed
        for i in range(4):
            assert b_rig.chunk(8 + i) == a_rig.orig_chunk(i)
        assert (await b.remove(ks[:1])).ok
        assert failure_kind((await a.load(ks[:1], [5])).failed[ks[0]]) == "not_found"
        assert set(ks[1:]) <= set(await a.stored_keys())


async def test_corrupt_truncated_and_foreign_objects_fail_their_key(tmp_path: Path) -> None:
    rig = Rig()
    root = tmp_path / "store"
    tier = rig.tier({"type": "obj", "url": f"file://{root}"})
    async with tier:
        ks = keys(4)
        assert (await tier.offload(ks, [0, 1, 2, 3])).ok
        files = {p.name: p for p in root.rglob("*") if p.is_file()}
        assert len(files) == 4
        from asynctier.integrity import key_token

        def path(k: bytes) -> Path:
            return files[key_token(k)]

        blob = bytearray(path(ks[0]).read_bytes())
        blob[-10] ^= 0xFF  # payload bit flip
        path(ks[0]).write_bytes(bytes(blob))
        path(ks[1]).write_bytes(path(ks[1]).read_bytes()[:-100])  # truncated
        path(ks[2]).write_bytes(path(ks[3]).read_bytes())  # another key's object
        rig.zero()
        res = await tier.load(ks, [4, 5, 6, 7])
        assert res.succeeded == [ks[3]] and rig.chunk(7) == rig.orig_chunk(3)
        assert set(res.failed) == set(ks[:3])
        assert kinds(res) == {"checksum"}
        assert await tier.lookup(ks) == [False, False, False, True]  # bad copies deleted
        assert not path(ks[0]).exists()
        assert tier.stats().failures["checksum"] == 3


async def test_other_layout_never_collides(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    r1, r2 = Rig(namespace="model-a"), Rig(namespace="model-b")
    t1, t2 = r1.tier({"type": "obj", "url": url}), r2.tier({"type": "obj", "url": url})
    async with t1, t2:
        ks = keys(2)
        assert (await t1.offload(ks, [0, 1])).ok
        assert await t2.lookup(ks) == [False, False]
        assert kinds(await t2.load(ks, [0, 1])) == {"not_found"}


@on_asyncio_only
async def test_large_chunks_go_in_parallel_parts_and_ranges() -> None:
    mib = 1 << 20
    rig = Rig(chunk_bytes=11 * mib, num_chunks=3)
    tier = rig.tier(s3_config(part_size=5 * mib, part_concurrency=3))
    async with tier:
        ks = keys(2)
        res = await tier.offload(ks, [0, 1])
        assert res.ok, res.failed
        rig.zero()
        res = await tier.load(ks, [2, 0])
        assert res.ok, res.failed
        assert rig.chunk(2) == rig.orig_chunk(0) and rig.chunk(0) == rig.orig_chunk(1)
        extra = tier.stats().extra
        assert extra["multipart_uploads"] == 2 and extra["ranged_downloads"] == 2


@on_asyncio_only
@pytest.mark.parametrize("where", ["file", "s3"])
async def test_short_objects_on_the_ranged_path_fail_their_key_as_bad_and_are_deleted(
    where: str, tmp_path: Path
) -> None:
    """A chunk larger than part_size is fetched in ranges; an object cut short (in the last
    part, in a middle part, down to its header) fails its key as a bad copy and is deleted.
    A range past the end of a short object used to make obstore panic: the load failed as
    "other", the object stayed, and every later load failed the same way."""
    import obstore

    mib = 1 << 20
    if where == "s3":
        rig = Rig(chunk_bytes=11 * mib, num_chunks=6)
        tier = rig.tier(s3_config(part_size=5 * mib, lookup_ttl_s=0, lookup_negative_ttl_s=0))
        cuts = [11 * mib - 1000, 7 * mib, 200]
    else:
        rig = Rig(chunk_bytes=CHUNK, num_chunks=6)
        tier = rig.tier({"type": "obj", "url": f"file://{tmp_path}/store", "part_size": 16 * 1024})
        cuts = [CHUNK - 1000, 40 * 1024, 200]
    async with tier:
        ks = keys(3)
        assert (await tier.offload(ks, [0, 1, 2])).ok
        st = tier._st()
        for k, keep in zip(ks, cuts):
            body = obstore.get(st, tier._path(k)).bytes()
            obstore.put(st, tier._path(k), bytes(body)[:keep])
        res = await tier.load(ks, [3, 4, 5])
        assert set(res.failed) == set(ks) and kinds(res) == {"checksum"}, res.failed
        assert await tier.lookup(ks) == [False] * 3  # deleted
        assert kinds(await tier.load(ks, [3, 4, 5])) == {"not_found"}
        assert tier.breaker_state == "closed"


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


async def test_verify_without_remove_keeps_a_bad_object_accounted() -> None:
    """fsck without --remove: a bad object found by verify_chunks stays in the store, so it
    stays in the capacity account (it used to be dropped from it, left untracked)."""
    import obstore

    rig = Rig()
    tier = rig.tier({"type": "obj", "url": "memory://", "capacity_bytes": 1 << 30})
    async with tier:
        ks = keys(3)
        assert (await tier.offload(ks, [0, 1, 2])).ok
        st = tier._st()
        body = bytearray(obstore.get(st, tier._path(ks[0])).bytes())
        body[-1] ^= 1
        obstore.put(st, tier._path(ks[0]), bytes(body))
        before = tier.stats()
        res = await tier.verify_chunks(ks, remove_bad=False)
        assert set(res.failed) == {ks[0]}
        after = tier.stats()
        assert (
            (after.used_bytes, after.stored_chunks)
            == (before.used_bytes, before.stored_chunks)
            == (
                before.used_bytes,
                3,
            )
        )
        res = await tier.verify_chunks(ks, remove_bad=True)
        assert set(res.failed) == {ks[0]}
        assert tier.stats().stored_chunks == 2 and tier.stats().used_bytes == before.used_bytes * 2 // 3


async def test_capacity_evicts_least_recently_used_by_delete(tmp_path: Path) -> None:
    rig = Rig()
    url = f"file://{tmp_path}/store"
    from asynctier.integrity import ChunkHeader

    per = CHUNK + ChunkHeader.packed_size(len(keys(1)[0]))
    tier = rig.tier({"type": "obj", "url": url, "capacity_bytes": 3 * per, "max_inflight": 1})
    async with tier:
        ks = keys(5)
        assert (await tier.offload(ks[:3], [0, 1, 2])).ok
        await tier.touch([ks[0]])  # ks[1] is now least recently used
        assert (await tier.offload(ks[3:4], [3])).ok
        assert await tier.lookup(ks[:4]) == [True, False, True, True]
        assert (await tier.load([ks[2]], [9])).ok  # a load makes ks[2] recent: ks[0] goes next
        assert (await tier.offload(ks[4:], [4])).ok
        assert await tier.lookup(ks) == [False, False, True, True, True]
        s = tier.stats()
        assert s.evictions == 2 and s.stored_chunks == 3 and s.used_bytes == 3 * per
    # a restarted server accounts what is already there, and evicts to fit a smaller bound
    tier2 = Rig().tier({"type": "obj", "url": url, "capacity_bytes": 2 * per})
    async with tier2:
        s = tier2.stats()
        assert s.stored_chunks == 2 and s.evictions == 1
        assert sum(await tier2.lookup(ks)) == 2


async def test_a_key_stored_again_while_its_old_object_is_evicted_stays_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-offload of a chunk that was just evicted waits for the eviction's DELETE: else
    that DELETE could land after the new PUT and take the new copy (offload ok, load not found)."""
    from asynctier.integrity import ChunkHeader

    rig = Rig()
    victim, other, newer = b"victim", b"others", b"newers"
    per = CHUNK + ChunkHeader.packed_size(len(victim))
    tier = rig.tier({"type": "obj", "url": f"file://{tmp_path}/store", "capacity_bytes": 2 * per, "max_inflight": 4})
    stopped, go_on = threading.Event(), threading.Event()
    delete_object = tier._delete_object

    def held(key: bytes) -> bool:
        if key == victim and not stopped.is_set():
            stopped.set()
            go_on.wait(30)
        return bool(delete_object(key))

    monkeypatch.setattr(tier, "_delete_object", held)
    async with tier:
        assert (await tier.offload([victim], [0])).ok  # one at a time: the victim is the oldest
        assert (await tier.offload([other], [1])).ok
        evicting = asyncio.ensure_future(tier.offload([newer], [2]))  # evicts the victim (LRU)
        assert await asyncio.to_thread(stopped.wait, 30)
        again = asyncio.ensure_future(tier.offload([victim], [0]))
        await asyncio.wait([again], timeout=0.3)  # without the wait it was stored by now
        go_on.set()
        assert (await evicting).ok and (await again).ok
        rig.zero()
        res = await tier.load([victim, newer], [5, 6])
        assert res.ok, res.failed
        assert rig.chunk(5) == rig.orig_chunk(0) and rig.chunk(6) == rig.orig_chunk(2)
        assert tier.stats().stored_chunks == 2


@on_asyncio_only
async def test_lookup_is_cached_and_batched() -> None:
    rig = Rig()
    tier = rig.tier(s3_config(lookup_ttl_s=60, lookup_negative_ttl_s=60, max_inflight=8))
    async with tier:
        present, absent = keys(8, "p"), keys(8, "a")
        assert (await tier.offload(present, list(range(8)))).ok  # own stores prime the cache
        assert await tier.lookup(present + absent) == [True] * 8 + [False] * 8
        heads = tier.stats().extra["head_requests"]
        assert heads == 8  # only the unknown keys went out, in one batch
        assert tier.stats().peak_in_flight > 1
        assert await tier.lookup(present + absent) == [True] * 8 + [False] * 8
        assert tier.stats().extra["head_requests"] == heads  # all answered from the cache
        assert (await tier.offload(absent[:1], [0])).ok  # own store fixes a negative entry
        assert (await tier.remove(present[:1])).ok  # own remove fixes a positive one
        assert (await tier.lookup([absent[0], present[0]])) == [True, False]
        assert tier.stats().extra["head_requests"] == heads


@pytest.mark.parametrize("where", ["s3", "file"])
@on_asyncio_only
async def test_no_python_copy_of_chunks(where: str, tmp_path: Path) -> None:
    """Python's allocator never holds a chunk-sized block while chunks go up and come back."""
    import tracemalloc

    rig = Rig(chunk_bytes=1 << 20, num_chunks=8)
    cfg = s3_config() if where == "s3" else {"type": "obj", "url": f"file://{tmp_path}/store"}
    tier = rig.tier(cfg)
    async with tier:
        ks = keys(8)
        warm = keys(1, "warm")
        assert (await tier.offload(warm, [0])).ok and (await tier.load(warm, [0])).ok  # warm up
        peaks = []
        for op in ("offload", "load"):
            if op == "load":
                rig.zero()
            tracemalloc.start()
            try:
                if op == "offload":
                    assert (await tier.offload(ks, list(range(8)))).ok
                else:
                    assert (await tier.load(ks, list(range(8))[::-1])).ok
                peaks.append(tracemalloc.get_traced_memory()[1])
            finally:
                tracemalloc.stop()
        # one copy of one chunk alone would reach 1 MiB; leave the rest as headroom for the
        # small objects a busy machine's retries and timers allocate
        assert max(peaks) < (1 << 20), f"Python allocated {peaks}-byte peaks moving 1 MiB chunks"
        assert all(rig.chunk(7 - i) == rig.orig_chunk(i) for i in range(8))


# -- configuration and secrets ----------------------------------------------------------------------
async def test_standard_env_configuration_keeps_allow_http_with_client_options() -> None:
    ep = moto().endpoint
    secret = "env-secret-" + uuid.uuid4().hex
    rig = Rig()
    # obstore alone drops AWS_ALLOW_HTTP once client_options are given (the trap); the tier
    # always passes client options (its deadline) and adds explicit ones here too
    with env(
        AWS_ENDPOINT=ep,
        AWS_ACCESS_KEY_ID="env-akid",
        AWS_SECRET_ACCESS_KEY=secret,
        AWS_REGION="us-east-1",
        AWS_ALLOW_HTTP="true",
    ):
        tier = rig.tier(
            {"type": "obj", "url": f"s3://{BUCKET}/env-{uuid.uuid4().hex[:8]}", "client_options": {"user_agent": "t"}}
        )
        async with tier:
            ks = keys(2)
            assert (await tier.offload(ks, [0, 1])).ok
            rig.zero()
            assert (await tier.load(ks, [2, 3])).ok
            assert rig.chunk(2) == rig.orig_chunk(0)
            assert secret not in repr(tier) and secret not in str(tier.stats())


@on_asyncio_only
async def test_credentials_never_in_reprs_errors_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    secret = "explicit-secret-" + uuid.uuid4().hex
    rig = Rig()
    cfg = s3_config(endpoint="http://127.0.0.1:9", **FAST_FAULTS)  # nothing listens on port 9
    cfg["credentials"] = {"access_key_id": "akid-" + secret, "secret_access_key": secret}
    cfg["url"] += "?sas=" + secret
    caplog.set_level("DEBUG")
    tier = rig.tier(cfg)
    async with tier:
        res = await tier.offload(keys(2), [0, 1])
        assert not res.ok
        text = " ".join(
            [repr(tier), str(tier.stats()), *map(str, res.failed.values()), *map(repr, res.failed.values())]
        )
        text += caplog.text
        assert secret not in text
        assert kinds(res) == {"unavailable"}


async def test_config_errors_raise_at_construction(tmp_path: Path) -> None:
    from asynctier import TierConfigError

    rig = Rig()
    for bad in (
        {"url": "ftp://host/x"},
        {"url": "memory://", "part_size": 0},
        {"url": "s3://bucket/prefix", "part_size": 1 << 20},
        {"url": "memory://", "timeout_s": -1},
        {"url": "memory://", "client_options": "allow_http"},
        {"url": "memory://", "durability": "fsync"},
        {"url": "memory://", "nonsense": 1},
        # refused only at open(), or never (a breaker that never closes), before
        {"url": "memory://", "retry_timeout_s": float("inf")},
        {"url": "memory://", "retry_backoff_s": float("inf")},
        {"url": "memory://", "connect_timeout_s": float("inf")},
        {"url": "memory://", "retry_max_backoff_s": 1e300},
        {"url": "memory://", "breaker_cooldown_s": float("inf")},
        {"url": "memory://", "lookup_ttl_s": float("nan")},
        {"url": "memory://", "max_retries": 10**30},
    ):
        with pytest.raises((TierConfigError, TypeError)):
            rig.tier({"type": "obj", **bad})


def test_import_asynctier_does_not_import_obstore() -> None:
    code = "import asynctier, sys; assert 'obstore' not in sys.modules and 'asynctier.tiers.obj' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


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


# -- the capacity account against the store (review) ---------------------------------------------
async def test_a_known_key_deleted_elsewhere_is_stored_again() -> None:
    """The account says a key is stored, but another server on the prefix (or a lifecycle
    rule) deleted it: a store of it asks the store and puts it again. It used to be skipped
    on the account's word: reported stored, then not found on load."""
    import obstore

    rig = Rig()
    tier = rig.tier({"type": "obj", "url": "memory://", "capacity_bytes": 1 << 30})
    async with tier:
        ks = keys(2)
        assert (await tier.offload(ks, [0, 1])).ok
        obstore.delete(tier._st(), tier._path(ks[0]))  # gone behind this tier's back
        assert (await tier.offload(ks, [0, 1])).ok
        assert tier.stats().extra["skipped_known_stored"] == 1  # ks[1] only
        rig.zero()
        res = await tier.load(ks, [2, 3])
        assert res.ok, res.failed
        assert rig.chunk(2) == rig.orig_chunk(0) and rig.chunk(3) == rig.orig_chunk(1)


def _chattr(flag: str, path: Path) -> int:
    """Set or clear an attribute (``+i``: immutable, unlink fails even for root)."""
    return subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode


async def test_a_failed_eviction_keeps_the_chunk_counted_and_fails_the_store(tmp_path: Path) -> None:
    """The DELETE of an eviction victim fails (here its file is immutable: EPERM even for
    root): the victim is still in the store, so it stays in the account, and the store that
    needed the room fails with a capacity error. It used to be dropped from the account and
    the store went on: the bucket grew past capacity_bytes, unseen."""
    import shutil

    from asynctier.integrity import ChunkHeader, key_token

    if shutil.which("chattr") is None:
        pytest.skip("chattr not installed")
    rig = Rig()
    ks = keys(3)
    per = CHUNK + ChunkHeader.packed_size(len(ks[0]))
    root = tmp_path / "store"
    tier = rig.tier({"type": "obj", "url": f"file://{root}", "capacity_bytes": 2 * per})
    async with tier:
        for i in range(2):  # one call each: ks[0] is the least recently used
            assert (await tier.offload(ks[i : i + 1], [i])).ok
        victim = next(p for p in root.rglob("*") if p.is_file() and p.name == key_token(ks[0]))
        if _chattr("+i", victim) != 0:
            pytest.skip("this file system does not take the immutable attribute")
        try:
            res = await tier.offload(ks[2:], [2])
            assert kinds(res) == {"capacity"}, res.failed
            s = tier.stats()
            assert (s.used_bytes, s.stored_chunks) == (2 * per, 2) and s.extra["eviction_failures"] == 1
            assert await tier.lookup(ks) == [True, True, False]
        finally:
            assert _chattr("-i", victim) == 0
        assert (await tier.offload(ks[2:], [2])).ok  # the victim, tried first again, goes now
        assert not victim.exists()
        s = tier.stats()
        assert (s.used_bytes, s.stored_chunks) == (2 * per, 2)
        assert sum(1 for p in root.rglob("*") if p.is_file()) == 2


async def test_a_load_neither_overrides_a_write_in_flight_nor_revives_a_removed_key() -> None:
    """A load of a key this tier has not accounted (another server stored it) takes it into
    the account, but not over a write of it in flight here (that made the write evictable:
    its object could be deleted after it was reported stored) nor while it is being removed
    (that left an entry with no object behind it)."""
    import obstore

    rig = Rig()
    tier = rig.tier({"type": "obj", "url": "memory://", "capacity_bytes": 1 << 30})
    async with tier:
        ks = keys(3)
        assert (await tier.offload(ks, [0, 1, 2])).ok
        lru = tier._lru
        assert lru is not None
        for k in ks:  # accounted by "another server" only
            lru.discard(k)
        size = len(obstore.get(tier._st(), tier._path(ks[0])).bytes())
        assert lru.reserve(ks[0], size) == []  # a write of ks[0] in flight here
        assert lru.begin_remove(ks[1])  # a removal of ks[1] in flight here
        res = await tier.load(ks, [3, 4, 5])
        assert res.ok, res.failed
        assert lru.has_entry(ks[0]) and ks[0] not in lru  # still the write's reservation
        assert not lru.has_entry(ks[1])  # the removal's: no ghost entry
        assert ks[2] in lru  # nothing in the way: taken into the account
        lru.abort(ks[0])
        lru.removed([ks[1]])
        assert tier.stats().stored_chunks == 1


@pytest.mark.parametrize("where", ["memory", "s3"])
async def test_deleting_a_bad_copy_leaves_a_copy_stored_since(where: str) -> None:
    """A load finds a bad object, and a good copy is stored under the same name before the
    bad one is deleted (a racing offload here or on another server): the good one stays.
    The delete went by name: the offload was reported stored and its copy was gone."""
    import obstore

    from asynctier import IntegrityError

    rig = Rig()
    cfg = s3_config(lookup_ttl_s=0, lookup_negative_ttl_s=0) if where == "s3" else {"type": "obj", "url": "memory://"}
    tier = rig.tier(cfg)
    async with tier:
        ks = keys(2)
        assert (await tier.offload(ks, [0, 1])).ok
        st = tier._st()
        for k in ks:
            body = bytearray(obstore.get(st, tier._path(k)).bytes())
            body[-1] ^= 1
            obstore.put(st, tier._path(k), bytes(body))
        out = memoryview(bytearray(CHUNK))
        errs = []
        for k in ks:
            with pytest.raises(IntegrityError) as info:
                await asyncio.to_thread(tier._get_into, k, out)
            errs.append(info.value)
        assert (await tier.offload(ks[:1], [0])).ok  # a good copy of ks[0], after the bad GET
        for k, e in zip(ks, errs):
            await asyncio.to_thread(tier._delete_bad_copy, k, e)
        assert tier.stats().extra["bad_copy_replaced"] == 1
        rig.zero()
        res = await tier.load(ks[:1], [2])
        assert res.ok and rig.chunk(2) == rig.orig_chunk(0)
        assert await tier.lookup(ks[1:]) == [False]  # the bad one nobody replaced is gone
