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
import asyncio, os, sys
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
