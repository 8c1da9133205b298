"""The obj tier's capacity account: LRU eviction by DELETE, restarts, and the account kept
true against the store (keys deleted elsewhere, failed deletions, loads during writes).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from s3_helpers import CHUNK, Rig, keys, kinds


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
        res = await tier.offload(ks, [0, 1])
        assert res.ok
        assert tier.stats().extra["skipped_known_stored"] == 1  # ks[1] only
        # ks[0] written again, ks[1] not: reported and counted as skipped, no bytes
        assert res.skipped == [ks[1]] and res.bytes_transferred == CHUNK
        assert tier.stats().skipped == 1
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


async def test_a_load_with_no_answer_keeps_an_entry_another_load_found_the_object_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two loads of a key another server stored: the first gets no answer, the second the
    object, meanwhile. The first took out the account entry the second confirmed: the
    chunk stayed in the bucket uncounted, and the bucket went past capacity_bytes."""
    import anyio
    import anyio.to_thread

    from asynctier.tiers.obj import tier as obj_tier

    rig = Rig()
    url = f"file://{tmp_path}/store"
    per = obj_tier.object_size(2, rig.spec.chunk_bytes)
    real = obj_tier.get_into
    first_in, second_done, calls = threading.Event(), threading.Event(), []

    def get_into(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:  # the first load: in flight until the second is done, then no answer
            first_in.set()
            second_done.wait(10)
            raise RuntimeError("Generic error: request timed out (deadline has elapsed)")
        try:
            return real(*args, **kwargs)
        finally:
            second_done.set()

    tier = rig.tier({"type": "obj", "url": url, "capacity_bytes": 4 * per, "max_inflight": 4})
    async with tier:
        async with rig.tier({"type": "obj", "url": url}) as other:
            assert (await other.offload([b"K0"], [0])).ok  # stored by another server
        monkeypatch.setattr(obj_tier, "get_into", get_into)
        results: dict[int, Any] = {}

        async def load(n: int) -> None:
            if n == 2:
                await anyio.to_thread.run_sync(first_in.wait, 10)
            results[n] = await tier.load([b"K0"], [n])

        async with anyio.create_task_group() as tg:
            tg.start_soon(load, 1)
            tg.start_soon(load, 2)
        assert kinds(results[1]) == {"timeout"} and results[2].ok
        assert tier.stats().stored_chunks == 1
        monkeypatch.setattr(obj_tier, "get_into", real)
        assert (await tier.offload([b"A%d" % i for i in range(4)], [4, 5, 6, 7])).ok
        objects = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
        assert len(objects) == 4 and await tier.lookup([b"K0"]) == [False]  # evicted for them
