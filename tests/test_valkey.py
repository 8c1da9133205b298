"""The valkey tier beyond the conformance suite, on real valkey-server processes: config and
credentials, the stored value, lookups and pipelining, the server's capacity (eviction, OOM),
faults (refused, restart, a server that never answers) and the breaker, and a clean exit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from valkey_helpers import (
    ValkeyProcess,
    free_port,
    silent_listener,
    valkey_single,
)

from asynctier import OffloadingSpec, SecondaryTierFactory, TierConfigError
from asynctier.errors import failure_kind
from asynctier.integrity import checksum, pack_header
from asynctier.tiers.valkey.errors import ValkeyIOError

__all__ = ["valkey_single"]

CHUNK = 16 * 1024
N = 32
SPEC = OffloadingSpec(CHUNK, N, namespace="valkey/test")
SECRET = "pw-Very$ecret/42"


class Rig:
    """A primary buffer with distinct chunk contents, and the tier built on it."""

    def __init__(self, spec: OffloadingSpec = SPEC, **config: Any) -> None:
        self.spec = spec
        self.buf = bytearray(os.urandom(spec.total_bytes))
        self.tier: Any = SecondaryTierFactory.create_secondary_tier(
            {"type": "valkey", **config}, memoryview(self.buf), spec
        )

    def chunk(self, cid: int) -> bytes:
        return bytes(self.spec.chunk_view(memoryview(self.buf), cid))

    def zero(self) -> None:
        self.buf[:] = bytes(len(self.buf))


def keys(n: int, tag: str = "k") -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(n)]


def run(fn: Any, *args: Any) -> Any:
    return anyio.run(fn, *args, backend="asyncio")


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> str:
    return "t-" + request.node.name.replace("[", "-").replace("]", "")


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[ValkeyProcess]:
    """A server of the test's own, for tests that restart it or change its memory settings."""
    server = ValkeyProcess(tmp_path / "own")
    yield server
    server.stop()


# -- configuration ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("config", "names"),
    [
        ({"url": 6379}, "url"),
        ({"url": "http://127.0.0.1"}, "scheme"),
        ({"url": "redis://127.0.0.1:6379?db=1"}, "query"),
        ({"url": "redis://127.0.0.1:99999"}, "port"),
        ({"url": "redis://:6379"}, "no host"),
        ({"url": "redis://127.0.0.1/x"}, "database"),
        ({"url": "redis://a:1,b:2/3"}, "database 0"),
        # not ASCII digits: '²' failed with a bare ValueError, fullwidth ones were read as 6379 and 3
        ({"url": "redis://127.0.0.1:\u00b2"}, "port"),
        ({"url": "redis://127.0.0.1:\uff16\uff13\uff17\uff19"}, "port"),
        ({"url": "redis://127.0.0.1/\u0663"}, "database"),
        # accepted, then every request failed as unreachable (and counted against the breaker)
        ({"url": "redis://127.0.0.1\x00:6379"}, "control character"),
        ({"url": "redis:// 127.0.0.1:6379"}, "whitespace"),
        # read as no password: VALKEY_PASSWORD ignored, no AUTH sent
        ({"url": "redis://:@127.0.0.1:6379"}, "password after ':' is empty"),
        ({"url": "redis://default:@127.0.0.1:6379"}, "password after ':' is empty"),
        ({"url": "redis://127.0.0.1", "cluster": 1}, "cluster"),
        ({"url": "redis://127.0.0.1", "key_prefix": "a{b}"}, "key_prefix"),
        ({"url": "redis://127.0.0.1", "key_prefix": ""}, "key_prefix"),
        ({"url": "redis://127.0.0.1", "ttl_s": 0}, "ttl_s"),
        ({"url": "redis://127.0.0.1", "ttl_s": True}, "ttl_s"),
        ({"url": "redis://127.0.0.1", "timeout_s": None}, "timeout_s"),
        ({"url": "redis://127.0.0.1", "pipeline_bytes": True}, "pipeline_bytes"),
        ({"url": "redis://127.0.0.1", "thread_min_bytes": 0}, "thread_min_bytes"),
        ({"url": "redis://127.0.0.1", "thread_min_bytes": True}, "thread_min_bytes"),
        ({"url": "redis://127.0.0.1", "max_retries": -1}, "max_retries"),
        ({"url": "redis://127.0.0.1", "breaker_threshold": 0}, "breaker_threshold"),
        ({"url": "redis://127.0.0.1", "capacity_bytes": 1 << 30}, "capacity_bytes"),
        ({"url": "redis://127.0.0.1", "tls_ca_file": "/etc/ca.pem"}, "TLS"),
        ({"url": "rediss://127.0.0.1", "tls_ca_file": 5}, "tls_ca_file"),
    ],
)
def test_bad_config_is_refused_naming_the_parameter(config: dict[str, Any], names: str) -> None:
    with pytest.raises(TierConfigError, match=names):
        Rig(**config)


def test_a_tls_ca_file_that_cannot_be_read_is_refused_at_open(tmp_path: Path) -> None:
    """Once reported at each call as the server unreachable (and counted by the breaker)."""
    t = Rig(url="rediss://127.0.0.1:1", tls_ca_file=str(tmp_path / "missing.pem")).tier

    async def main() -> None:
        with pytest.raises(TierConfigError, match=r"tls_ca_file .*missing.pem.* is not a file this process can read"):
            await t.open()

    anyio.run(main)


def test_a_tls_ca_file_without_a_certificate_is_refused_at_open(tmp_path: Path) -> None:
    """A readable file that holds no certificate failed each connect, reported as the server
    unreachable, and opened the breaker."""
    bad = tmp_path / "ca.pem"
    bad.write_text("garbage\n")
    t = Rig(url="rediss://127.0.0.1:1", tls_ca_file=str(bad)).tier

    async def main() -> None:
        with pytest.raises(TierConfigError, match=r"tls_ca_file .*ca.pem.* holds no certificate"):
            await t.open()

    anyio.run(main)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_timeouts_of_one_chunk_calls_open_the_breaker(backend: str) -> None:
    """Calls whose chunks go one per job (as few keys as max_inflight, or chunks as large as
    pipeline_bytes) ran under two deadlines of one length; the outer always fired first and
    the timeout was booked as no answer: the breaker never opened on a server that never
    answers."""
    with silent_listener() as lst:
        r = Rig(url=lst.url, timeout_s=0.2, breaker_threshold=2, breaker_cooldown_s=60, max_inflight=4)

        async def main() -> None:
            async with r.tier:
                for _ in range(2):
                    res = await r.tier.load(keys(1), [0])
                    assert {failure_kind(e) for e in res.failed.values()} == {"timeout"}
                assert r.tier.breaker_state == "open"

        anyio.run(main, backend=backend)


def test_seeds_make_a_cluster_and_credentials_are_never_shown(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    quoted = SECRET.replace("$", "%24").replace("/", "%2F")
    t = Rig(url=f"rediss://user:{quoted}@h1:7000,[::1]:7001").tier
    assert t.cluster and t.url == "rediss://h1:7000,[::1]:7001"
    assert SECRET not in repr(t) and quoted not in repr(t)
    monkeypatch.setenv("VALKEY_PASSWORD", SECRET)
    t = Rig(url="redis://127.0.0.1:1", breaker_threshold=1, timeout_s=2).tier

    async def main() -> None:
        async with t:
            res = await t.offload([b"k"], [0])
            (err,) = res.failed.values()
            assert failure_kind(err) == "unavailable", repr(err)
            res = await t.load([b"k"], [0])  # the breaker is open now
            for text in (str(err), repr(err), str(res.failed[b"k"]), repr(t), str(t.stats())):
                assert SECRET not in text

    with caplog.at_level(logging.DEBUG):
        run(main)
    assert SECRET not in caplog.text


def test_bench_reports_show_no_url_password() -> None:
    from asynctier.cli.tierfile import redact

    cfg = {"type": "valkey", "url": f"redis://user:{SECRET}@h1:7000,h2:7001/0", "key_prefix": "p"}
    assert redact(cfg) == {**cfg, "url": "redis://***@h1:7000,h2:7001/0"}


def test_wrong_password_fails_each_key_without_showing_it(own_server: ValkeyProcess) -> None:
    with contextlib.closing(own_server.client()) as c:
        c.config_set("requirepass", "right-one")
    try:
        for url in (own_server.url.replace("//", f"//:{SECRET}@"), own_server.url.replace("//", "//:right-one@")):
            r = Rig(url=url, key_prefix="auth")

            async def main(r: Rig = r, url: str = url) -> None:
                async with r.tier:
                    res = await r.tier.offload(keys(2), [0, 1])
                    if "right-one" in url:
                        assert res.ok, res.failed
                    else:
                        assert set(res.failed) == set(keys(2))
                        for e in res.failed.values():
                            assert failure_kind(e) == "io" and SECRET not in str(e)

            run(main)
    finally:
        with contextlib.closing(own_server.client(password="right-one")) as c:
            c.config_set("requirepass", "")


def test_an_acl_without_exists_or_scan_is_said_not_mistaken_for_an_empty_tier(own_server: ValkeyProcess) -> None:
    """A user allowed GET and SET only: lookups answered "not stored" without a word (a prefix
    cache then never loads), and stored_keys raised the client's own exception (fsck crashed)."""
    with contextlib.closing(own_server.client()) as c:
        c.execute_command("ACL", "SETUSER", "cache", "on", ">pw-cache", "~*", "+get", "+set", "+ping", "+hello")
    r = Rig(url=own_server.url.replace("//", "//cache:pw-cache@"), key_prefix="acl")

    async def main() -> None:
        async with r.tier:
            assert (await r.tier.offload(keys(2), [0, 1])).ok
            assert await r.tier.lookup(keys(2)) == [False, False]
            assert r.tier.stats().extra["lookup_errors"] == 1
            with pytest.raises(ValkeyIOError, match=r"listing the tier's keys: the server refused .*scan"):
                await r.tier.stored_keys()
            assert r.tier.breaker_state == "closed"

    run(main)


def test_touch_without_ttl_is_a_use_for_the_servers_eviction(own_server: ValkeyProcess) -> None:
    """Without ``ttl_s`` touch() did nothing, so the server's LRU or LFU never saw the prefixes
    a server touches; now it sends TOUCH (an access: LFU's counter goes up)."""
    with contextlib.closing(own_server.client()) as c:
        c.config_set("maxmemory-policy", "allkeys-lfu")
        r = Rig(url=own_server.url, key_prefix="touch")

        async def main() -> None:
            async with r.tier:
                assert (await r.tier.offload(keys(1), [0])).ok
                name = r.tier.name_of(keys(1)[0])
                before = c.execute_command("OBJECT", "FREQ", name)
                await r.tier.touch(keys(1))
                assert c.execute_command("OBJECT", "FREQ", name) > before

        try:
            run(main)
        finally:
            c.config_set("maxmemory-policy", "noeviction")


def test_password_from_the_environment(own_server: ValkeyProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    with contextlib.closing(own_server.client()) as c:
        c.config_set("requirepass", SECRET)
    monkeypatch.setenv("VALKEY_PASSWORD", SECRET)
    r = Rig(url=own_server.url)

    async def main() -> None:
        async with r.tier:
            assert (await r.tier.offload(keys(3), [0, 1, 2])).ok
            assert await r.tier.lookup(keys(3)) == [True] * 3

    run(main)


def _client_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("asynctier-valkey-")]


async def _tasks_on_client_loop(tier: Any) -> int:
    """Tasks on the tier's own client loop (under trio) besides the one counting them."""

    async def count() -> int:
        return len(asyncio.all_tasks()) - 1

    return int(await tier._bridge.call(count))


def test_trio_runs_the_client_on_a_loop_thread_of_its_own(valkey_single: ValkeyProcess, prefix: str) -> None:
    # checks and copies on worker threads too (every batch); the conformance suite runs on trio
    # with the defaults (on trio's thread)
    r = Rig(url=valkey_single.url, key_prefix=prefix, thread_min_bytes=1, max_inflight=2)
    ks = keys(8)

    async def main() -> None:
        async with r.tier:
            assert len(_client_threads()) == 1
            want = [r.chunk(i) for i in range(8)]
            assert (await r.tier.offload(ks, list(range(8)))).ok
            r.zero()
            res = await r.tier.load([*ks, b"absent"], [*range(8), 9])
            assert res.succeeded == ks and failure_kind(res.failed[b"absent"]) == "not_found"
            assert [r.chunk(i) for i in range(8)] == want
            assert await r.tier.lookup([ks[0], b"absent"]) == [True, False]
            assert sorted(await r.tier.list_chunks()) == sorted(ks)
            assert (await r.tier.remove(ks)).ok
            assert await _tasks_on_client_loop(r.tier) == 0

    anyio.run(main, backend="trio")
    assert _client_threads() == [], "aclose() ends the client's loop thread"


def test_trio_cancelled_calls_leave_no_client_io_running() -> None:
    """Cancelled under trio (a server that never answers): when the cancellation reaches the
    caller, the client's task on the tier's loop thread has ended and no slot was written."""
    import trio

    with silent_listener() as lst:
        r = Rig(url=lst.url, timeout_s=0.3, breaker_threshold=100)

        async def main() -> None:
            async with r.tier:
                before = r.chunk(1)
                with trio.CancelScope() as scope:
                    scope.cancel()  # cancelled before the first checkpoint: the call's request is withdrawn
                    await r.tier.lookup(keys(2))
                assert scope.cancelled_caught and await _tasks_on_client_loop(r.tier) == 0
                with trio.move_on_after(0.05) as scope:
                    await r.tier.lookup(keys(2))  # a direct call: its request is cancelled
                assert scope.cancelled_caught and await _tasks_on_client_loop(r.tier) == 0
                with trio.move_on_after(0.05) as scope:
                    await r.tier.load(keys(2), [0, 1])  # engine jobs: the call waits for them to end
                assert scope.cancelled_caught and await _tasks_on_client_loop(r.tier) == 0
                assert r.chunk(1) == before
                res = await r.tier.load(keys(2), [0, 1])
                assert {failure_kind(e) for e in res.failed.values()} == {"timeout"}

        anyio.run(main, backend="trio")


# -- the stored value ------------------------------------------------------------------------------
# thread_min_bytes: None checks and copies on the event loop, 1 on a worker thread (every batch)
@pytest.mark.parametrize("thread_min_bytes", [None, 1])
def test_a_value_written_by_hand_loads_byte_exact(
    valkey_single: ValkeyProcess, prefix: str, thread_min_bytes: int | None
) -> None:
    """The documented format: name <prefix>:<layout id>:<key>, value = header + payload."""
    r = Rig(url=valkey_single.url, key_prefix=prefix, thread_min_bytes=thread_min_bytes)
    payload = os.urandom(CHUNK)
    key = b"\x00hand{made}\xff"
    name = f"{prefix}:{SPEC.layout_id}:".encode() + key
    with contextlib.closing(valkey_single.client()) as c:
        c.set(name, pack_header(key, CHUNK, checksum(payload), SPEC.layout_digest) + payload)

    async def main() -> None:
        async with r.tier:
            assert r.tier.name_of(key) == name
            res = await r.tier.load([key, b"absent"], [3, 4])
            assert res.succeeded == [key] and failure_kind(res.failed[b"absent"]) == "not_found"
            assert r.chunk(3) == payload
            assert (await r.tier.offload([b"tier-made"], [5])).ok  # and the tier writes exactly that
            mine = r.chunk(5)
            with contextlib.closing(valkey_single.client()) as c:
                stored = c.get(r.tier.name_of(b"tier-made"))
            assert stored == pack_header(b"tier-made", CHUNK, checksum(mine), SPEC.layout_digest) + mine

    run(main)


@pytest.mark.parametrize("thread_min_bytes", [None, 1])
def test_bad_and_foreign_values_fail_their_key_and_are_removed(
    valkey_single: ValkeyProcess, prefix: str, thread_min_bytes: int | None
) -> None:
    # two in flight: the five keys go in pipelines of three and two (the grouped path)
    r = Rig(url=valkey_single.url, key_prefix=prefix, thread_min_bytes=thread_min_bytes, max_inflight=2)
    other = OffloadingSpec(CHUNK, N, namespace="another/model")
    ks = keys(5)
    with contextlib.closing(valkey_single.client()) as c:

        async def main() -> None:
            async with r.tier:
                assert (await r.tier.offload(ks, list(range(5)))).ok
                payload = os.urandom(CHUNK)
                names = [r.tier.name_of(k) for k in ks]
                c.set(names[0], pack_header(ks[0], CHUNK, checksum(payload), other.layout_digest) + payload)
                c.set(names[1], b"not a chunk")
                c.set(names[2], c.get(names[3]))  # another key's value
                c.delete(names[4])
                c.rpush(names[4], b"a list")  # a value of another type
                before = r.chunk(10)
                res = await r.tier.load(ks, [10, 11, 12, 13, 14])
                assert res.succeeded == [ks[3]]
                assert {k: failure_kind(e) for k, e in res.failed.items()} == dict.fromkeys(
                    [ks[0], ks[1], ks[2], ks[4]], "checksum"
                )
                assert r.chunk(10) == before, "a bad value reached the caller's slot"
                assert [c.exists(n) for n in names] == [0, 0, 0, 1, 0], "bad values are removed"

        run(main)


def test_ttl_is_set_on_each_value_and_touch_renews_it(valkey_single: ValkeyProcess, prefix: str) -> None:
    r = Rig(url=valkey_single.url, key_prefix=prefix, ttl_s=600)
    with contextlib.closing(valkey_single.client()) as c:

        async def main() -> None:
            async with r.tier:
                assert (await r.tier.offload(keys(3), [0, 1, 2])).ok
                for k in keys(3):
                    assert 0 < c.pttl(r.tier.name_of(k)) <= 600_000
                    c.pexpire(r.tier.name_of(k), 5000)
                await r.tier.touch(keys(2))
                assert [c.pttl(r.tier.name_of(k)) > 5000 for k in keys(3)] == [True, True, False]

        run(main)


def test_fsck_lists_and_verifies_what_is_stored(valkey_single: ValkeyProcess, prefix: str) -> None:
    r = Rig(url=valkey_single.url, key_prefix=prefix)
    ks = keys(6)
    with contextlib.closing(valkey_single.client()) as c:

        async def main() -> None:
            async with r.tier:
                assert (await r.tier.offload(ks, list(range(6)))).ok
                assert sorted(await r.tier.stored_keys()) == sorted(ks)
                # names no key can have (fsck's verify_chunks refused the listing: a traceback)
                c.set(r.tier.name_of(ks[0])[: -len(ks[0])], b"foreign")  # the prefix alone
                c.set(r.tier.name_of(ks[0]) + b"x" * 1024, b"foreign")  # a key too long
                assert sorted(await r.tier.stored_keys()) == sorted(ks)
                c.set(r.tier.name_of(ks[0]), b"garbage")
                res = await r.tier.verify_chunks(ks)
                assert set(res.failed) == {ks[0]} and failure_kind(res.failed[ks[0]]) == "checksum"
                assert c.exists(r.tier.name_of(ks[0])), "kept without remove_bad"
                res = await r.tier.verify_chunks(ks, remove_bad=True)
                assert set(res.failed) == {ks[0]} and not c.exists(r.tier.name_of(ks[0]))
                assert r.tier.stats().extra["bad_chunks_found"] == 2

        run(main)


def test_fsck_of_a_server_that_is_down_says_it_cannot_check(tmp_path: Path) -> None:
    """The listing raised the client's own ConnectionError: a traceback and exit 1 ("bad
    chunks found"); now exit 4, "cannot check"."""
    from click.testing import CliRunner

    from asynctier.cli import main

    cfg = tmp_path / "down.toml"
    cfg.write_text('[spec]\nchunk_bytes = 4096\n\n[tiers.kv]\ntype = "valkey"\nurl = "redis://127.0.0.1:1"\n'
                   "timeout_s = 1\nmax_retries = 0\n")  # fmt: skip
    r = CliRunner().invoke(main, ["fsck", "--config", str(cfg)])
    assert r.exit_code == 4 and "cannot check: listing the tier's keys: valkey server unreachable" in r.output, r.output


def test_lookup_is_batched_exists_and_batches_are_pipelined(valkey_single: ValkeyProcess, prefix: str) -> None:
    r = Rig(url=valkey_single.url, key_prefix=prefix, max_inflight=4)
    ks = keys(N)

    async def main() -> None:
        async with r.tier:
            assert (await r.tier.offload(ks, list(range(N)))).ok
            stored = r.tier.stats().extra["pipelines"]
            assert stored == 4, "32 chunks over 4 in-flight slots: 4 pipelines of 8"
            probe = ks + keys(1000, "absent")
            hits = await r.tier.lookup(probe)
            assert hits == [True] * N + [False] * 1000
            assert r.tier.stats().extra["pipelines"] - stored == 3  # 1032 keys, 512 per pipeline
            assert await r.tier.lookup_prefix([*ks[:5], b"absent", *ks[5:]]) == 5
            r.zero()
            assert (await r.tier.load(ks, list(range(N)))).ok
            res = await r.tier.remove(ks[:10])
            assert res.ok and await r.tier.lookup(ks[:11]) == [False] * 10 + [True]

    data = [r.chunk(i) for i in range(N)]
    run(main)
    assert [r.chunk(i) for i in range(N)] == data


def test_two_servers_share_one_cache(valkey_single: ValkeyProcess, prefix: str) -> None:
    """Two tiers (two inference servers) on one server and prefix see each other's chunks;
    another namespace on the same prefix sees none of them."""
    a = Rig(url=valkey_single.url, key_prefix=prefix)
    b = Rig(url=valkey_single.url, key_prefix=prefix)
    other = Rig(OffloadingSpec(CHUNK, N, namespace="another/model"), url=valkey_single.url, key_prefix=prefix)
    ks = keys(8)

    async def main() -> None:
        async with a.tier, b.tier, other.tier:
            assert (await a.tier.offload(ks, list(range(8)))).ok
            assert await b.tier.lookup_prefix(ks) == 8
            assert (await b.tier.load(ks, list(range(8, 16)))).ok
            assert [b.chunk(8 + i) for i in range(8)] == [a.chunk(i) for i in range(8)]
            assert await other.tier.lookup(ks) == [False] * 8
            assert (await b.tier.remove(ks[:2])).ok
            assert await a.tier.lookup(ks[:3]) == [False, False, True]

    run(main)


# -- capacity is the server's ------------------------------------------------------------------
def limit_memory(server: ValkeyProcess, policy: str, room: int = 2 << 20) -> None:
    """maxmemory: what the empty server uses plus ``room`` bytes."""
    with contextlib.closing(server.client()) as c:
        used = int(c.info("memory")["used_memory"])
        c.config_set("maxmemory", str(used + room))
        c.config_set("maxmemory-policy", policy)


def test_server_eviction_leaves_clean_misses(own_server: ValkeyProcess) -> None:
    """allkeys-lru with a small maxmemory: chunks the server evicted fail not_found; the rest
    load byte-exact, whether evicted before or after the lookup."""
    limit_memory(own_server, "allkeys-lru")
    spec = OffloadingSpec(CHUNK, 512, namespace="valkey/evict")
    r = Rig(spec, url=own_server.url)
    ks = keys(512)

    async def main() -> None:
        async with r.tier:
            res = await r.tier.offload(ks, list(range(512)))
            assert res.ok, "allkeys-lru makes room: no store fails"
            present = await r.tier.lookup(ks)
            assert 0 < sum(present) < 512, "8 MiB of chunks in 2 MiB: some were evicted"
            data = [r.chunk(i) for i in range(512)]
            r.zero()
            res = await r.tier.load(ks, list(range(512)))
            assert {failure_kind(e) for e in res.failed.values()} == {"not_found"}
            for k in res.succeeded:
                i = ks.index(k)
                assert r.chunk(i) == data[i]

    run(main)


def test_out_of_memory_with_noeviction_fails_stores_as_capacity(own_server: ValkeyProcess) -> None:
    limit_memory(own_server, "noeviction")
    spec = OffloadingSpec(CHUNK, 512, namespace="valkey/oom")
    r = Rig(spec, url=own_server.url)
    ks = keys(512)

    async def main() -> None:
        async with r.tier:
            res = await r.tier.offload(ks, list(range(512)))
            assert res.failed and res.succeeded
            assert {failure_kind(e) for e in res.failed.values()} == {"capacity"}
            assert "maxmemory" in str(next(iter(res.failed.values())))
            assert r.tier.breaker_state == "closed", "a full server is reachable"
            data = {k: r.chunk(ks.index(k)) for k in res.succeeded}
            r.zero()
            ok = res.succeeded[:N]
            lres = await r.tier.load(ok, list(range(len(ok))))
            assert lres.ok
            assert [r.chunk(i) for i in range(len(ok))] == [data[k] for k in ok]

    run(main)


# -- faults ------------------------------------------------------------------------------------
def test_refused_connections_open_the_breaker_and_a_probe_closes_it(tmp_path: Path) -> None:
    port = free_port()
    r = Rig(url=f"redis://127.0.0.1:{port}", breaker_threshold=2, breaker_cooldown_s=0.3, max_retries=0)
    ks = keys(4)

    async def main() -> None:
        async with r.tier:
            for _ in range(2):
                res = await r.tier.offload(ks[:1], [0])
                assert failure_kind(res.failed[ks[0]]) == "unavailable"
            assert r.tier.breaker_state == "open"
            res = await r.tier.load(ks, [0, 1, 2, 3])
            assert {failure_kind(e) for e in res.failed.values()} == {"unavailable"}
            assert "circuit breaker open" in str(res.failed[ks[0]])
            assert await r.tier.lookup(ks) == [False] * 4
            s = r.tier.stats().extra
            assert s["breaker_opened"] == 1 and s["breaker_fast_failed"] >= 2
            server = await anyio.to_thread.run_sync(lambda: ValkeyProcess(tmp_path / "late", port=port))
            try:
                await anyio.sleep(0.3)  # the breaker's cooldown: a timer, nothing to wait on
                assert r.tier.breaker_state == "half-open"
                res = await r.tier.offload(ks[:1], [0])  # the probe goes through and closes it
                assert res.ok, res.failed
                assert r.tier.breaker_state == "closed"
                assert (await r.tier.offload(ks, [0, 1, 2, 3])).ok
            finally:
                server.stop()

    run(main)


def test_a_server_that_never_answers_fails_by_timeout_s() -> None:
    with silent_listener() as lst:
        r = Rig(url=lst.url, timeout_s=0.3, breaker_threshold=100)

        async def main() -> None:
            async with r.tier:
                before = r.chunk(1)
                res = await r.tier.offload(keys(2), [0, 1])
                assert {failure_kind(e) for e in res.failed.values()} == {"timeout"}
                res = await r.tier.load(keys(2), [0, 1])
                assert {failure_kind(e) for e in res.failed.values()} == {"timeout"}
                assert r.chunk(1) == before
                assert await r.tier.lookup(keys(2)) == [False, False]

        run(main)


def test_restarts_mid_stream_never_deliver_wrong_bytes(own_server: ValkeyProcess) -> None:
    """Stores and loads run while the server is killed and restarted (its data gone, no
    persistence): every key succeeds byte-exact or fails with a per-key error; once the
    server is back, the pool's dead connections are retried transparently."""
    spec = OffloadingSpec(CHUNK, 64, namespace="valkey/restart")
    r = Rig(spec, url=own_server.url, max_inflight=4, timeout_s=3, breaker_threshold=1000)
    ks = keys(64)

    async def main() -> None:
        async with r.tier:
            assert (await r.tier.offload(ks, list(range(64)))).ok
            data = [r.chunk(i) for i in range(64)]
            restarted = threading.Event()

            def restart() -> None:
                own_server.restart()
                restarted.set()

            thread = threading.Thread(target=restart)
            kinds: set[str] = set()
            rounds = 0
            thread.start()
            while not restarted.is_set() or rounds < 3:
                rounds += 1
                r.zero()
                res = await r.tier.load(ks, list(range(64)))
                kinds |= {failure_kind(e) for e in res.failed.values()}
                for k in res.succeeded:
                    i = ks.index(k)
                    assert r.chunk(i) == data[i], "wrong bytes after a restart"
                r.buf[:] = b"".join(data)
                sres = await r.tier.offload(ks, list(range(64)))
                kinds |= {failure_kind(e) for e in sres.failed.values()}
            await anyio.to_thread.run_sync(thread.join)
            assert kinds <= {"unavailable", "timeout", "not_found"}, kinds
            res = await r.tier.offload(ks, list(range(64)))  # over connections that died
            assert res.ok, res.failed
            r.zero()
            assert (await r.tier.load(ks, list(range(64)))).ok
            assert [r.chunk(i) for i in range(64)] == data

    run(main)


_EXIT_SCRIPT = """
import anyio, os, sys
from asynctier import OffloadingSpec, SecondaryTierFactory

async def main():
    spec = OffloadingSpec(4096, 8, namespace="exit")
    view = memoryview(bytearray(os.urandom(spec.total_bytes)))
    tier = SecondaryTierFactory.create_secondary_tier({"type": "valkey", "url": sys.argv[1]}, view, spec)
    await tier.open()
    assert (await tier.offload([b"a", b"b"], [0, 1])).ok
    assert (await tier.load([b"a"], [2])).ok
    if sys.argv[2].endswith("close"):
        await tier.aclose()
    print("done", flush=True)  # left open otherwise: the interpreter tears it down

anyio.run(main, backend="trio" if sys.argv[2].startswith("trio") else "asyncio")
"""


@pytest.mark.parametrize("how", ["close", "left-open", "trio-left-open"])
def test_the_process_exits_cleanly(valkey_single: ValkeyProcess, how: str) -> None:
    out = subprocess.run(
        [sys.executable, "-X", "dev", "-c", textwrap.dedent(_EXIT_SCRIPT), valkey_single.url, how],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done"
    assert "Traceback" not in out.stderr and "Error" not in out.stderr, out.stderr


# -- the bench script and asynctier bench --tier valkey (tiny sizes: smoke, not a measurement) -----
REPO = Path(__file__).resolve().parent.parent


def test_bench_script_reports_ratios(tmp_path: Path) -> None:
    cmd = [sys.executable, str(REPO / "bench" / "bench_valkey.py"), "--sizes-kib", "64", "--mib", "2", "--repeat", "1",
           "--concurrency", "4", "--out", str(tmp_path)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    import json

    (entry,) = json.loads((tmp_path / "valkey.json").read_text())["results"].values()
    for op in ("offload", "load"):
        assert entry[f"ratio_{op}"] > 0 and entry[f"tier_{op}_GBps"] > 0 and entry[f"raw_{op}_GBps"] > 0


def test_cli_bench_starts_a_local_server_for_the_valkey_tier(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "asynctier.cli", "bench", "--tier", "valkey", "--chunk-sizes", "64K", "--depths", "2",
           "--data-size", "1M", "--no-fio", "--no-naive", "-q", "--json", str(tmp_path / "b.json")]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "1/1 points ok" in r.stdout


def test_a_short_password_is_masked_only_where_it_stands_alone() -> None:
    """A password 's' turned every s of an error into ***, its errno and address with it."""
    from asynctier.tiers.valkey.redact import Scrubber

    scrub = Scrubber(["s", "a-longer-secret"]).scrub
    assert scrub("Error 111 connecting to host s: a-longer-secret, s") == "Error 111 connecting to host ***: ***, ***"
