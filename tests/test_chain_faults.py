"""A chain under real faults: the S3 server (moto, a process of its own) killed mid-run and
restarted, a lower tier on a full tmpfs, promotion racing a remove of the same key, and a load
served from a lower tier cancelled part-way. No timed assertions: what must hold is what
completes, what fails, which tier is blamed, and that traffic resumes by itself."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import gc
import socket
import subprocess
import sys
import time
import urllib.request
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import pytest
from chain_helpers import ChainRig, in_tier, keys

from asynctier.errors import failure_kind
from asynctier.testing import Harness
from asynctier.testing.interrupts import interrupt_mid_call
from asynctier.tiers.memory import MemoryTier

sys.path.insert(0, str(Path(__file__).parent))
from s3_helpers import BUCKET, FaultProxy, create_bucket, s3_config

MEM: dict[str, Any] = {"type": "memory"}


def run(fn: Any, *args: Any) -> None:
    anyio.run(fn, *args, backend="asyncio")


def fs(root: Path, **extra: Any) -> dict[str, Any]:
    return {"type": "fs", "root": str(root), "io_engine": "threads", **extra}


# -- the S3 server killed and restarted ---------------------------------------------------------------
class KillableMoto:
    """moto's S3 server as a child process on a fixed 127.0.0.1 port: killed, then started
    again on the same port (empty: moto keeps objects in memory; the bucket is made again)."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if self._proc.poll() is not None:
                    raise RuntimeError("moto_server exited at start") from None
                time.sleep(0.05)
        else:
            raise RuntimeError("moto_server did not start")
        create_bucket(self.endpoint, BUCKET)

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)


@pytest.fixture(scope="module")
def killable_moto() -> Iterator[KillableMoto]:
    server = KillableMoto()
    try:
        yield server
    finally:
        server.kill()


def test_obj_server_killed_upper_tiers_serve_and_obj_resumes(tmp_path: Path, killable_moto: KillableMoto) -> None:
    async def check() -> None:
        rig = ChainRig(num_chunks=16)
        obj = s3_config(
            killable_moto.endpoint,
            timeout_s=2.0,
            connect_timeout_s=0.5,
            max_retries=0,
            retry_timeout_s=0.5,
            breaker_threshold=2,
            breaker_cooldown_s=0.1,
            lookup_negative_ttl_s=0,
            deadline_s=5.0,
            breaker={"threshold": 2, "cooldown_s": 0.1},
        )
        chain = rig.chain(tiers=[MEM, fs(tmp_path / "kv"), obj], write="back")
        async with chain:
            ks = keys(8)
            assert (await chain.offload(ks, list(range(8)))).ok
            await chain.drain()
            assert await in_tier(chain, "obj", ks) == [True] * 8
            # the last two now only in obj
            assert (await chain.member("memory").tier.remove(ks[6:])).ok
            assert (await chain.member("fs").tier.remove(ks[6:])).ok

            killable_moto.kill()

            rig.zero()
            res = await chain.load(ks[:6], list(range(8, 14)))  # the upper tiers serve
            assert res.ok, res.failed
            assert [rig.chunk(8 + i) for i in range(6)] == [rig.orig_chunk(i) for i in range(6)]
            obj_member = chain.member("obj")
            for _ in range(50):  # keys only obj holds fail, blamed on obj, until its breaker opens
                res = await chain.load(ks[6:], [14, 15])
                assert set(res.failed) == set(ks[6:]) and set(res.failed_in("obj")) == set(ks[6:])
                assert {failure_kind(e) for e in res.failed.values()} <= {"io", "timeout", "unavailable"}
                assert not res.failed_in("memory") and not res.failed_in("fs")
                if obj_member.breaker.state == "open":
                    break
            assert obj_member.breaker.opened >= 1
            s = chain.stats().children["obj"].extra
            assert s["chain_failed"] >= 2 and s["chain_breaker_opened"] >= 1

            more = keys(4, "during")  # stores go on; obj's share of the write-back is dropped, counted
            drops = chain.stats().children["obj"].extra["chain_drops"]
            assert (await chain.offload(more, [0, 1, 2, 3])).ok
            await chain.drain()
            assert await in_tier(chain, "fs", more) == [True] * 4
            assert chain.stats().children["obj"].extra["chain_drops"] >= drops + 4
            rig.zero()
            assert (await chain.load(more + ks[:6], list(range(10)))).ok

            killable_moto.start()
            rig.restore()

            for _ in range(100):  # nobody resets anything: the next stores reach obj again
                probe = keys(1, "after")
                assert (await chain.offload(probe, [0])).ok
                await chain.drain()
                if await in_tier(chain, "obj", probe) == [True]:
                    break
                await anyio.sleep(0.05)  # the breakers' cooldown: time is what they wait for
            else:
                raise AssertionError("the obj tier never took writes again after the server came back")
            assert obj_member.breaker.state == "closed"
            rig.zero()
            res = await chain.load(probe, [3])
            assert res.ok and rig.chunk(3) == rig.orig_chunk(0)

    run(check)


LOOPS = {"asyncio": ("asyncio", {}), "uvloop": ("asyncio", {"use_uvloop": True}), "trio": ("trio", {})}


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_a_late_tier_does_not_hold_up_the_call(tmp_path: Path, killable_moto: KillableMoto, loop: str) -> None:
    """With deadline_s, a load stops waiting for a stalled tier: its keys fail with a timeout
    blamed on it, the others are served, and the late call keeps only the chain's own staging
    slots (never the caller's) until it ends by itself (on every event loop: the late call
    runs as a task of its own)."""
    proxy = FaultProxy(killable_moto.port)

    async def check() -> None:
        rig = ChainRig(num_chunks=16)
        obj = s3_config(proxy.endpoint, timeout_s=10.0, max_retries=0, lookup_negative_ttl_s=0, deadline_s=0.2)
        chain = rig.chain(tiers=[MEM, {**obj, "breaker": {"threshold": 100}}], write="through")
        async with chain:
            ks = keys(4)
            assert (await chain.offload(ks, [0, 1, 2, 3])).ok
            assert (await chain.member("memory").tier.remove(ks[2:])).ok  # only obj holds these
            proxy.delay_s = 0.6  # every answer of the server now comes late
            rig.zero()
            res = await chain.load(ks, [4, 5, 6, 7])
            assert res.succeeded == ks[:2] and set(res.failed) == set(ks[2:])
            assert {failure_kind(e) for e in res.failed.values()} == {"timeout"}
            assert set(res.failed_in("obj")) == set(ks[2:])
            s = chain.stats()
            assert s.in_flight == 0 and s.extra["late_slots"] == 2
            await chain.drain()  # the late call ends by itself; its slots come back
            assert chain.stats().extra["late_slots"] == 0
            assert rig.chunk(6) == rig.chunk(7) == bytes(rig.spec.chunk_bytes), "a late load wrote a caller's slot"
            proxy.delay_s = 0.0
            res = await chain.load(ks[2:], [6, 7])
            assert res.ok and rig.chunk(6) == rig.orig_chunk(2) and rig.chunk(7) == rig.orig_chunk(3)

    backend, options = LOOPS[loop]
    try:
        anyio.run(check, backend=backend, backend_options=options)
    finally:
        proxy.close()


@pytest.mark.parametrize("demote", [False, True])
def test_a_chain_dropped_without_aclose_ends_its_background_tasks(tmp_path: Path, demote: bool) -> None:
    """A chain nobody closes is collected once dropped; its lanes (and demoter) write what was
    queued, then end, rather than waiting for the event loop to end."""

    async def check() -> None:
        rig = ChainRig(num_chunks=16)
        mem = {**MEM, "capacity_bytes": 64 * rig.spec.chunk_bytes} if demote else MEM
        chain = rig.chain(tiers=[mem, fs(tmp_path / "kv")], demote=demote)
        await chain.open()
        lower = chain.member("fs").tier
        ks = keys(8)
        assert (await chain.offload(ks, list(range(8)))).ok  # written back to fs in the background
        tasks = {t for t in asyncio.all_tasks() if t.get_name().startswith("asynctier-chain-")}
        assert len(tasks) == 3 if demote else 2
        dropped = weakref.ref(chain)
        del chain
        gc.collect()
        assert dropped() is None, "something still holds the chain"
        _, pending = await asyncio.wait(tasks, timeout=30)
        assert not pending, f"still running: {[t.get_name() for t in pending]}"
        assert await lower.lookup(ks) == [True] * 8, "what was queued was not written first"
        await lower.aclose()

    run(check)


# -- a full lower tier ----------------------------------------------------------------------------------
@contextlib.contextmanager
def small_tmpfs(target: Path, size: int) -> Iterator[Path]:
    target.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip()}); this check needs root and mount")
    try:
        yield target
    finally:
        for _ in range(50):  # a tier's descriptors may close a moment later
            if subprocess.run(["umount", str(target)], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)


def _fill_up(path: Path) -> None:
    with open(path, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)


def test_full_lower_tier_is_isolated_then_resumes(tmp_path: Path) -> None:
    async def check(mnt: Path) -> None:
        rig = ChainRig(num_chunks=16)
        chain = rig.chain(
            tiers=[MEM, {**fs(mnt / "kv"), "breaker": {"threshold": 2, "cooldown_s": 0.05}}], write="through"
        )
        async with chain:
            ballast = mnt / "ballast"
            _fill_up(ballast)
            fs_member = chain.member("fs")
            enospc = 0
            for i in range(8):  # every store succeeds (memory has it); fs fails, then is skipped
                rig.restore()
                ks = keys(2, f"full{i}")
                res = await chain.offload(ks, [0, 1])
                assert res.ok, res.failed
                assert set(res.failed_in("fs")) == set(ks)
                for e in res.failed_in("fs").values():
                    assert failure_kind(e) in ("io", "unavailable"), repr(e)
                    enospc += isinstance(e, OSError) and e.errno == errno.ENOSPC
                rig.zero()
                assert (await chain.load(ks, [2, 3])).ok and rig.chunk(2) == rig.orig_chunk(0)
            assert enospc >= 2 and fs_member.breaker.opened >= 1
            assert chain.stats().children["fs"].extra["chain_breaker_fast_failed"] >= 1

            ballast.unlink()  # room again: the fs tier takes stores by itself
            rig.restore()
            for _ in range(100):
                ks = keys(1, "room")
                res = await chain.offload(ks, [0])
                if await in_tier(chain, "fs", ks) == [True]:
                    break
                await anyio.sleep(0.02)  # the breaker's cooldown
            else:
                raise AssertionError("the fs tier never took stores again after room was made")
            assert not res.tier_failures and fs_member.breaker.state == "closed"

    with small_tmpfs(tmp_path / "small", 64 * 1024) as mnt:
        run(check, mnt)


def test_capacity_bound_lower_tier_filled_up_keeps_the_chain_whole(tmp_path: Path) -> None:
    """A lower tier at its capacity_bytes evicts what the chain wrote into it; the chain still
    serves every key from the first tier (and needs no root, unlike the tmpfs check above)."""

    async def check() -> None:
        rig = ChainRig(num_chunks=16)
        small = {**fs(tmp_path / "kv"), "capacity_bytes": 4 * (rig.spec.chunk_bytes + 4096)}
        chain = rig.chain(tiers=[MEM, small], write="through")
        async with chain:
            ks = keys(16)
            for i in range(0, 16, 4):
                res = await chain.offload(ks[i : i + 4], list(range(i, i + 4)))
                assert res.ok and not res.tier_failures, (res.failed, res.tier_failures)
            fs_stats = chain.stats().children["fs"]
            assert fs_stats.evictions >= 8 and fs_stats.stored_chunks is not None and fs_stats.stored_chunks <= 4
            assert await chain.lookup_prefix(ks) == 16
            rig.zero()
            assert (await chain.load(ks, list(range(16)))).ok
            assert all(rig.chunk(i) == rig.orig_chunk(i) for i in range(16))
            assert chain.stats().children["memory"].extra["chain_hits"] == 16

    run(check)


# -- promotion racing a remove ---------------------------------------------------------------------------
def test_promotion_never_brings_back_a_removed_key(tmp_path: Path) -> None:
    async def check() -> None:
        rig = ChainRig(num_chunks=16)
        chain = rig.chain(tiers=[MEM, fs(tmp_path / "kv")], write="through", background_batch=1)
        memory, disk = chain.member("memory"), chain.member("fs")
        async with chain:
            # a promotion is queued or being written when the remove comes: either way, once the
            # remove returns the key is gone from every tier and stays gone
            running = 0
            for i in range(12):
                ks = keys(8, f"race{i}")
                assert (await chain.offload(ks, list(range(8)))).ok
                assert (await memory.tier.remove(ks)).ok  # only fs holds them: loads promote
                assert (await chain.load(ks, list(range(8, 16)))).ok
                if i % 2:  # let a promotion's write start first
                    while memory.background_in_flight == 0 and memory.backlog:  # the lane signals nothing: poll
                        await anyio.lowlevel.checkpoint()
                    running += memory.background_in_flight > 0
                assert (await chain.remove(ks)).ok
                assert await in_tier(chain, "memory", ks) == [False] * 8
                await chain.drain()
                assert await chain.lookup(ks) == [False] * 8, "a promotion brought back a removed key"
            assert memory.counts["drops"] >= 1, "no queued promotion met a remove"
            assert running >= 1, "no remove came while a promotion's write ran"
            assert disk.counts["hits"] == 96

    run(check)


def test_a_promotion_prepared_while_a_removal_runs_never_brings_the_key_back(tmp_path: Path) -> None:
    """A load that finds the key in fs while its removal is still deleting there (memory's copy
    gone already) queues a promotion; it must not reach memory once the remove has returned.
    The removal was stamped when it started, and a load that began after that took the same
    stamp, so its promotion did not count as older than the removal: the key came back."""

    async def check() -> None:
        rig = ChainRig(num_chunks=8)
        chain = rig.chain(tiers=[MEM, fs(tmp_path / "kv")], write="through", refresh_below=False)
        disk = chain.member("fs")
        async with chain:
            ks = keys(1, "racing")
            assert (await chain.offload(ks, [0])).ok
            gate, at_gate = anyio.Event(), anyio.Event()
            remove_fs = disk.tier.remove

            async def slow_remove(keys: list[bytes]) -> Any:  # fs deletes once the load has run
                at_gate.set()
                await gate.wait()
                return await remove_fs(keys)

            disk.tier.remove = slow_remove  # type: ignore[method-assign]
            removed: list[Any] = []
            async with anyio.create_task_group() as tg:

                async def remove() -> None:
                    removed.append(await chain.remove(ks))

                tg.start_soon(remove)
                await at_gate.wait()
                while (await in_tier(chain, "memory", ks)) != [False]:  # memory's removal runs beside fs's
                    await anyio.lowlevel.checkpoint()
                assert (await chain.load(ks, [1])).ok  # from fs, still there: a promotion is prepared
                gate.set()
            assert removed[0].ok
            await chain.drain()
            assert await in_tier(chain, "memory", ks) == [False], "a promotion brought the removed key back"
            assert await chain.lookup(ks) == [False]

    run(check)


def test_many_removals_drop_no_queued_write_back_of_another_key(tmp_path: Path) -> None:
    """Past 65,536 removal stamps the oldest were summarised by a floor, and every background
    write queued before it was dropped as if its key had been removed: an acknowledged store
    never reached the tier below. Now a removal marks its own keys' queued work, and stamps are
    forgotten only where no work in preparation can need them."""

    async def check() -> None:
        rig = ChainRig(num_chunks=8)
        chain = rig.chain(tiers=[MEM, fs(tmp_path / "kv")], write="back")
        async with chain:
            gate = anyio.Event()
            offload_fs = chain.member("fs").tier.offload

            async def held_offload(keys: list[bytes], ids: list[int]) -> Any:  # the write-back waits
                await gate.wait()
                return await offload_fs(keys, ids)

            chain.member("fs").tier.offload = held_offload  # type: ignore[method-assign]
            kept = keys(1, "kept")
            assert (await chain.offload(kept, [0])).ok
            others = keys(65537, "other")
            assert (await chain.remove(others)).ok
            assert (await chain.remove(others[:10])).ok  # (stamps beyond the bound, none needed now)
            assert len(chain._fence._removed_at) <= 65536
            gate.set()
            await chain.drain()
            assert await in_tier(chain, "fs", kept) == [True], "the write-back of a key never removed was dropped"
            assert chain.member("fs").counts["drops"] == 0

    run(check)


# -- cancelling a load served from a lower tier ----------------------------------------------------------
def chain_loaded(chain: Any) -> int:
    return int(chain.stats().loaded)


def record_in_flight(tier: Any, into: list[int]) -> None:
    into.append(tier.stats().in_flight)


def test_cancelled_load_from_a_lower_tier_leaves_no_io_on_the_callers_slots(tmp_path: Path) -> None:
    async def check() -> None:
        rig = ChainRig(num_chunks=32)
        chain = rig.chain(tiers=[MEM, fs(tmp_path / "kv")], write="through", max_inflight=4)
        h = Harness(chain, rig.spec, rig.buf)
        memory, disk = chain.member("memory"), chain.member("fs")
        async with chain:
            ks = keys(32)
            ids = list(range(32))
            assert (await chain.offload(ks, ids)).ok
            landed = 0
            for _attempt in range(30):
                await chain.drain()
                assert (await memory.tier.remove(ks)).ok  # served from fs (and promoted again)
                rig.zero()
                fs_running: list[int] = []
                got = await interrupt_mid_call(
                    h,
                    functools.partial(chain.load, ks, ids),
                    functools.partial(chain_loaded, chain),
                    "cancel",
                    functools.partial(record_in_flight, disk.tier, fs_running),
                )
                if not got.landed:
                    assert got.result is not None and got.result.ok
                    continue
                landed += 1
                assert got.in_flight == 0 and got.queued == 0 and fs_running == [0]
                await anyio.sleep(0.05)  # watch for writes into the caller's slots after the return
                assert bytes(rig.buf) == got.buffer, "the primary buffer changed after the cancelled load returned"
                assert chain_loaded(chain) == got.progress
                if landed >= 3:
                    break
            assert landed, "could not cancel a load mid-transfer in 30 attempts"
            assert disk.counts["hits"] > 0

    run(check)


class CloseFailsMemoryTier(MemoryTier):
    """A memory tier whose close fails (a flush or a sync on close that did not succeed)."""

    closed: ClassVar[list[str]] = []

    def close_medium(self) -> None:
        CloseFailsMemoryTier.closed.append(self.tier_type)
        raise OSError(errno.EIO, "flushing on close failed")


def test_a_tiers_failure_to_close_reaches_the_chains_caller_after_every_tier_closed() -> None:
    """aclose() of a chain logged a tier's close error and returned: the tier alone raised it."""

    async def check() -> None:
        rig = ChainRig()
        failing = {"type": "CloseFailsMemoryTier", "module_path": __name__, "name": "failing"}
        chain = rig.chain(tiers=[{"type": "memory"}, failing, {"type": "memory", "name": "last"}])
        CloseFailsMemoryTier.closed.clear()
        await chain.open()
        assert (await chain.offload(keys(2), [0, 1])).ok
        with pytest.raises(OSError, match="flushing on close failed"):
            await chain.aclose()
        assert CloseFailsMemoryTier.closed and all(not m.tier.is_open for m in chain.members)

    anyio.run(check)
