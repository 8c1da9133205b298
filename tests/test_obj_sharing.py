"""The obj tier against the store others write to: two tiers on one prefix, the lookup cache,
and no Python copy of a chunk on the way up or down.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from asynctier.errors import failure_kind

sys.path.insert(0, str(Path(__file__).parent))
from s3_helpers import Rig, keys, on_asyncio_only, s3_config


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


def test_a_present_answer_a_removal_made_stale_is_not_cached() -> None:
    """A load still streaming when this tier's remove of the key ended put "present" back in
    the lookup cache for lookup_ttl_s (the review's run: lookup [True], load not_found)."""
    import time

    from asynctier.tiers.obj.lookup_cache import LookupCache

    cache = LookupCache(entries=4, ttl_s=60.0, negative_ttl_s=0.0)
    load = cache.begin()  # a GET starts
    cache.forget(b"k")  # a removal of the key begins, and ends (found gone)
    cache.put(b"k", False)
    cache.put(b"k", True, load)  # the GET ends
    assert cache.get(b"k", time.monotonic()) is None
    cache.put(b"k", True, cache.begin())  # a request begun after the removal: cached
    assert cache.get(b"k", time.monotonic()) is True
    early = cache.begin()
    for i in range(2000):  # more removals than it remembers: an answer older than them is not cached
        cache.forget(b"other-%d" % i)
    cache.put(b"j", True, early)
    assert cache.get(b"j", time.monotonic()) is None
