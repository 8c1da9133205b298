"""A process forked from one that used asynctier: the tiers it opens work, and those opened in
its parent refuse calls at once, where each hung (an inherited thread pool took the jobs and
no thread of it was there to run them). Each case runs in a process of its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="os.fork on Linux")

_SCRIPT = """
import asyncio, os, sys, time
from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.errors import TierStateError

root = sys.argv[1]
spec = OffloadingSpec(4096, 4, namespace="test/fork")
view = memoryview(bytearray(os.urandom(spec.total_bytes)))

def tier(kind, where):
    cfg = {{"memory": {{}}, "fs": {{"root": where, "io_engine": "threads"}},
            "obj": {{"url": "file://" + where}}}}[kind]
    return SecondaryTierFactory.create_secondary_tier({{"type": kind, **cfg}}, view, spec)

async def round_trip(t):
    async with t:
        return (await t.offload([b"k"], [0])).ok and (await t.load([b"k"], [1])).ok

{body}
"""


def _run(tmp_path: Path, body: str) -> str:
    script = _SCRIPT.format(body=textwrap.dedent(body))
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


@pytest.mark.parametrize("kind", ["memory", "fs"])
def test_a_forked_child_opens_and_uses_tiers_of_its_own(tmp_path: Path, kind: str) -> None:
    out = _run(
        tmp_path,
        f"""
        assert asyncio.run(round_trip(tier({kind!r}, root + "/parent")))
        pid = os.fork()
        if pid == 0:
            ok = asyncio.run(asyncio.wait_for(round_trip(tier({kind!r}, root + "/child")), 20))
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
    """,
    )
    assert out.strip() == "child 0"


@pytest.mark.parametrize("kind", ["memory", "fs"])
def test_a_tier_opened_before_the_fork_refuses_calls_in_the_child(tmp_path: Path, kind: str) -> None:
    out = _run(
        tmp_path,
        f"""
        async def main():
            t = tier({kind!r}, root + "/kv")
            await t.open()
            assert (await t.offload([b"k"], [0])).ok
            pid = os.fork()
            if pid == 0:
                async def child():
                    try:
                        await t.load([b"k"], [1])
                    except TierStateError as e:
                        assert "opened in the parent of this forked process" in str(e), e
                    else:
                        os._exit(2)
                    await t.aclose()  # a forked copy: closed here, nothing of the parent's released
                asyncio.run(asyncio.wait_for(child(), 20))
                os._exit(0)
            _, status = os.waitpid(pid, 0)
            print("child", os.waitstatus_to_exitcode(status))
            assert (await t.load([b"k"], [1])).ok  # the parent's goes on
            await t.aclose()
        asyncio.run(main())
    """,
    )
    assert out.strip() == "child 0"


def test_an_obj_tier_in_a_child_forked_after_one_ran_is_refused(tmp_path: Path) -> None:
    """obstore's runtime (tokio) does not survive a fork: the child's first request hung."""
    pytest.importorskip("obstore")
    out = _run(
        tmp_path,
        """
        assert asyncio.run(round_trip(tier("obj", root + "/parent")))
        pid = os.fork()
        if pid == 0:
            try:
                asyncio.run(asyncio.wait_for(round_trip(tier("obj", root + "/child")), 20))
            except TierStateError as e:
                os._exit(0 if "does not survive a fork" in str(e) else 3)
            os._exit(1)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
    """,
    )
    assert out.strip() == "child 0"


def test_a_child_holds_none_of_the_parents_locks(tmp_path: Path) -> None:
    """A child's copies of an nvme slab's and an fs root's lock descriptors kept the locks:
    while any forked worker lived, the parent could not reopen its slab, and its fs tiers'
    recycling was refused (another tier seemed to hold the root)."""
    out = _run(
        tmp_path,
        """
        import time
        nvme = {"type": "nvme", "path": root + "/kv.slab", "capacity_bytes": 16 << 20}

        async def main():
            t = SecondaryTierFactory.create_secondary_tier(nvme, view, spec)
            await t.open()
            pid = os.fork()
            if pid == 0:
                time.sleep(5)
                os._exit(0)
            try:
                await t.aclose()
                again = SecondaryTierFactory.create_secondary_tier(nvme, view, spec)
                async with again:  # "open by another tier" while the child lived
                    pass
                print("reopened")
            finally:
                os.kill(pid, 9)
                os.waitpid(pid, 0)

        asyncio.run(main())
    """,
    )
    assert out.strip() == "reopened"


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "call-in-flight"])
def test_a_child_that_exits_leaves_the_parents_tier_alone(tmp_path: Path, busy: bool) -> None:
    """A child that exits normally ran the finalizers of the parent's tier at exit: the native
    pool's joined workers the child does not have (SIGSEGV, or a hang with a call in flight
    at the fork). And drain() there waited for the parent's calls for ever. (The tier runs on
    a loop thread: forking inside a running asyncio loop breaks the loop itself.)"""
    out = _run(
        tmp_path,
        f"""
        import threading
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()

        def on_loop(coro):
            return asyncio.run_coroutine_threadsafe(coro, loop)

        t = SecondaryTierFactory.create_secondary_tier({{"type": "fs", "root": root + "/kv"}}, view, spec)
        on_loop(t.open()).result(30)  # (the native engine, where the C workers are built)
        assert on_loop(t.offload([b"warm"], [0])).result(30).ok
        job = on_loop(t.offload([b"a", b"b", b"c"], [1, 2, 3])) if {busy} else None
        pid = os.fork()
        if pid == 0:
            try:
                asyncio.run(t.drain())
            except TierStateError:
                sys.exit(0)  # atexit: the tier's finalizers
            sys.exit(4)
        if job is not None:
            assert job.result(30).ok
        for _ in range(400):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                print("child", os.waitstatus_to_exitcode(status))
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            print("child hung")
        on_loop(t.aclose()).result(30)
    """,
    )
    assert out.strip() == "child 0"
