"""A tier's lifecycle at its edges: a loop that ends with a call inside an ``AsyncChunkTier``'s
primitive, an ``open()`` cancelled or interrupted while it sets the medium up. Each was found
by a review with a script; docs/cancellation.md says what must hold.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from asynctier import AsyncChunkTier, BlockingChunkTier, OffloadingSpec

SPEC = OffloadingSpec(4096, 4)

_LOOP_ENDS = """
import asyncio, sys, time
import anyio
from asynctier import AsyncChunkTier, OffloadingSpec

class SlowTier(AsyncChunkTier):
    persistent = False
    def __init__(self, **kw):
        super().__init__(**kw)
        self.recs = {}
    async def write_chunk(self, key, data):
        try:
            await anyio.sleep(0.5)  # a network round trip
        except asyncio.CancelledError as e:
            if sys.argv[2] == "converts":  # as some clients do
                raise ConnectionError("request aborted") from e
            raise
        self.recs[key] = bytes(data)
    async def read_chunk(self, key, out):
        out[:] = self.recs[key]
    async def chunk_exists(self, key):
        return key in self.recs
    async def delete_chunk(self, key):
        return self.recs.pop(key, None) is not None

spec = OffloadingSpec(4096, 4)
buf = bytearray(spec.total_bytes)

async def main():
    tier = SlowTier(offloading_spec=spec, primary_kv_view=memoryview(buf), max_inflight=1)
    await tier.open()
    asyncio.get_running_loop().create_task(tier.offload([b"a", b"b"], [0, 1]))
    await asyncio.sleep(0.1)  # the worker is inside write_chunk

if sys.argv[1] == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
print("ended")
"""


@pytest.mark.skipif(sys.version_info < (3, 11), reason="Task.cancelling() is 3.11's (docs/cancellation.md)")
@pytest.mark.parametrize("primitive", ["raises", "converts"])
@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_loop_that_ends_with_a_call_inside_an_async_primitive_ends(loop: str, primitive: str) -> None:
    """asyncio cancels a task once: the worker turned that cancellation into the chunk's
    failure and then waited for more work for ever, so ``asyncio.run`` never returned. The
    first fix looked only at a cancellation the primitive raised, not one it turned into
    another error."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_LOOP_ENDS), loop, primitive],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ended", (out.stdout, out.stderr[-2000:])


class ListingTier(AsyncChunkTier):
    """An indexed async tier whose listing is slow (a SCAN over the network)."""

    uses_index = True

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.connected = False

    async def open_medium(self) -> None:
        await anyio.lowlevel.checkpoint()
        self.connected = True

    async def close_medium(self) -> None:
        await anyio.lowlevel.checkpoint()  # (an awaited client close: it was cancelled at once)
        self.connected = False

    async def list_chunks(self) -> list[bytes]:
        await anyio.sleep(5)
        return []

    async def write_chunk(self, key: bytes, data: memoryview) -> None:
        raise NotImplementedError

    async def read_chunk(self, key: bytes, out: memoryview) -> None:
        raise NotImplementedError

    async def chunk_exists(self, key: bytes) -> bool:
        return False

    async def delete_chunk(self, key: bytes) -> bool:
        return False


async def test_an_async_open_cancelled_while_listing_closes_its_medium() -> None:
    tier = ListingTier(offloading_spec=SPEC, primary_kv_view=memoryview(bytearray(SPEC.total_bytes)))
    with anyio.move_on_after(0.05) as scope:
        await tier.open()
    assert scope.cancelled_caught
    assert not tier.is_open and not tier.connected


class SlowOpenTier(BlockingChunkTier):
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.log: list[str] = []

    def open_medium(self) -> None:
        self.log.append("open")
        time.sleep(0.3)
        self.log.append("opened")

    def close_medium(self) -> None:
        self.log.append("closed")

    def write_chunk(self, key: bytes, data: memoryview) -> None:
        raise NotImplementedError

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        raise NotImplementedError

    def chunk_exists(self, key: bytes) -> bool:
        return False

    def delete_chunk(self, key: bytes) -> bool:
        return False


def test_ctrl_c_on_trio_during_a_blocking_open_returns_after_the_undo() -> None:
    """trio raises a KeyboardInterrupt into the task: ``open()`` let it through while
    ``open_medium`` still ran on its thread, and nothing closed what it then opened."""
    import trio

    tier = SlowOpenTier(offloading_spec=SPEC, primary_kv_view=memoryview(bytearray(SPEC.total_bytes)))
    seen: list[list[str]] = []

    async def main() -> None:
        threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            await tier.open()
        except KeyboardInterrupt:
            seen.append(list(tier.log))
            raise

    # trio raises Ctrl-C into the task only under Python's own SIGINT handler (an earlier test
    # of the suite may leave another one installed)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            trio.run(main)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [["open", "opened", "closed"]] and not tier.is_open
