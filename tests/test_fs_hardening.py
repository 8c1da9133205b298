# ruff: noqa: ASYNC240  (small setup files on a local disk; the tier under test is what is async)
"""The fs tier against a hostile neighbour: whatever sits at a chunk's name (a FIFO, a
directory, a symbolic link out of the root) fails that key or is skipped, never blocks and
never writes outside the root; files and directories are private by default; a root others
may write into is refused. Every check runs on both engines where the engine matters.
"""

from __future__ import annotations

import os
import random
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fs_helpers import chunk_file

from asynctier import OffloadingSpec, SecondaryTierFactory, TierConfigError
from asynctier.engines import native as nativeio
from asynctier.tiers.fs import HEADER_BLOCK, FsTier

CHUNK = 16 * 1024
NCHUNKS = 8
PER = HEADER_BLOCK + CHUNK
_NO_NATIVE = nativeio.problem()

ENGINES = [
    "threads",
    pytest.param("native", marks=pytest.mark.skipif(_NO_NATIVE is not None, reason=f"no native: {_NO_NATIVE}")),
]


def make_tier(root: Path, engine: str, **config: Any) -> tuple[FsTier, memoryview]:
    spec = OffloadingSpec(CHUNK, NCHUNKS, namespace="test/fs-hardening")
    view = memoryview(bytearray(spec.total_bytes))
    rnd = random.Random(7)
    for i in range(NCHUNKS):
        view[i * CHUNK : (i + 1) * CHUNK] = rnd.randbytes(CHUNK)
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "fs", "root": str(root), "io_engine": engine, **config}, view, spec
    )
    assert isinstance(tier, FsTier)
    return tier, view


@pytest.fixture
def decoy(tmp_path: Path) -> Iterator[Path]:
    """A file outside the tier's root that nothing may write, truncate or stamp."""
    outside = tmp_path / "outside"
    outside.mkdir()
    path = outside / "decoy"
    path.write_bytes(b"precious" * (PER // 8))
    os.utime(path, ns=(10**9, 10**9))
    yield path


def untouched(decoy: Path) -> bool:
    st = decoy.stat()
    return decoy.read_bytes() == b"precious" * (PER // 8) and st.st_mtime_ns == 10**9


# -- item 2: a FIFO (or any non-regular file) at a chunk's name ---------------------------------
@pytest.mark.parametrize("engine", ENGINES)
async def test_a_fifo_at_a_chunks_name_fails_the_key_and_never_blocks(tmp_path: Path, engine: str) -> None:
    root = tmp_path / "root"
    tier, _ = make_tier(root, engine)
    ks = [b"fifo-0", b"fifo-1"]
    async with tier:
        assert (await tier.offload(ks, [0, 1])).ok
        path = chunk_file(tier, ks[0])
        path.unlink()
        os.mkfifo(path)
        res = await tier.load(ks, [2, 3])
        assert set(res.failed) == {ks[0]} and res.succeeded == [ks[1]]
        assert "FIFO" in str(res.failed[ks[0]]), res.failed
        assert tier.stats().extra.get("not_regular_files", 0) >= 1
    # the scan at open does not hang on it either, and does not index it
    again, _ = make_tier(root, engine)
    async with again:
        assert await again.lookup(ks) == [False, True]


@pytest.mark.parametrize("engine", ENGINES)
async def test_the_scan_skips_a_fifo_at_a_long_keys_name(tmp_path: Path, engine: str) -> None:
    """A long key's file name is a hash; the scan reads the key from the header, which must
    not open a FIFO."""
    root = tmp_path / "root"
    tier, _ = make_tier(root, engine)
    long_key = b"L" * 200
    async with tier:
        assert (await tier.offload([long_key], [0])).ok
        path = chunk_file(tier, long_key)
    path.unlink()
    os.mkfifo(path)
    again, _ = make_tier(root, engine)
    async with again:
        assert await again.lookup([long_key]) == [False]
        assert long_key not in await again.stored_keys()


# -- item 3: a directory at a chunk's name --------------------------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("shared", [False, True])
async def test_a_directory_at_a_chunks_name_fails_the_store(tmp_path: Path, engine: str, shared: bool) -> None:
    tier, _ = make_tier(tmp_path / "root", engine, publish="auto", shared=shared)
    ks = [b"dir-0", b"dir-1"]
    async with tier:
        chunk_file(tier, ks[0]).mkdir()
        res = await tier.offload(ks, [0, 1])
        assert set(res.failed) == {ks[0]} and res.succeeded == [ks[1]], res
        assert await tier.lookup(ks) == [False, True]
        assert tier.stats().extra.get("publish_exists", 0) == 0


@pytest.mark.parametrize("engine", ENGINES)
async def test_another_writers_valid_copy_still_counts_as_published(tmp_path: Path, engine: str) -> None:
    """EEXIST on publish is success when what is there is this key's chunk."""
    root = tmp_path / "root"
    first, view = make_tier(root, engine)
    async with first:
        assert (await first.offload([b"same"], [0])).ok
        saved = chunk_file(first, b"same").read_bytes()
    second, view2 = make_tier(root, engine, publish="auto")
    async with second:
        await second.remove([b"same"])  # gone from its index, then put back behind its back
        chunk_file(second, b"same").write_bytes(saved)
        res = await second.offload([b"same"], [0])
        assert res.ok, res
        if second.protocol.use_tmpfile:
            assert second.stats().extra.get("publish_exists") == 1
        assert (await second.load([b"same"], [1])).ok
        assert bytes(view2[CHUNK : 2 * CHUNK]) == bytes(view[:CHUNK])


# -- item 1: symbolic links inside the cache directories -----------------------------------------
@pytest.mark.parametrize("engine", ENGINES)
async def test_eviction_never_recycles_through_a_symlink(tmp_path: Path, engine: str, decoy: Path) -> None:
    tier, _ = make_tier(tmp_path / "root", engine, capacity_bytes=2 * PER, verify=True, recycle=True)
    async with tier:
        assert tier.recycle_on
        assert (await tier.offload([b"a"], [0])).ok  # one at a time: b"a" is the LRU end
        assert (await tier.offload([b"b"], [1])).ok
        victim = chunk_file(tier, b"a")
        victim.unlink()
        victim.symlink_to(decoy)
        res = await tier.offload([b"c"], [2])  # evicts b"a": its "file" is the link
        assert res.ok, res
        assert untouched(decoy)
        assert not victim.is_symlink() and not victim.exists()  # the link went, not its target
        assert await tier.lookup([b"a", b"b", b"c"]) == [False, True, True]


@pytest.mark.parametrize("engine", ENGINES)
async def test_loads_and_verify_do_not_follow_a_symlink(tmp_path: Path, engine: str, decoy: Path) -> None:
    tier, _ = make_tier(tmp_path / "root", engine)
    async with tier:
        assert (await tier.offload([b"x", b"y"], [0, 1])).ok
        path = chunk_file(tier, b"x")
        decoy.write_bytes(path.read_bytes())  # a valid copy: following the link would "work"
        os.utime(decoy, ns=(10**9, 10**9))
        path.unlink()
        path.symlink_to(decoy)
        res = await tier.load([b"x", b"y"], [2, 3])
        assert set(res.failed) == {b"x"} and res.succeeded == [b"y"], res
        assert (await tier.verify_chunks([b"x"])).failed
    assert decoy.read_bytes()[:8] != b"precious" and decoy.stat().st_mtime_ns == 10**9


@pytest.mark.parametrize("engine", ENGINES)
async def test_close_does_not_stamp_times_through_a_symlink(tmp_path: Path, engine: str, decoy: Path) -> None:
    tier, _ = make_tier(tmp_path / "root", engine, lru_times=True)
    async with tier:
        assert (await tier.offload([b"t"], [0])).ok
        assert (await tier.load([b"t"], [1])).ok  # to be stamped at close
        path = chunk_file(tier, b"t")
        path.unlink()
        path.symlink_to(decoy)
    assert untouched(decoy)


async def test_a_dangling_owners_link_is_not_created(tmp_path: Path, decoy: Path) -> None:
    root = tmp_path / "root"
    tier, _ = make_tier(root, "threads", verify=True)
    async with tier:
        pass
    owners = tier.dir / ".owners"
    owners.unlink()
    target = decoy.parent / "created-by-the-tier"
    owners.symlink_to(target)
    again, _ = make_tier(root, "threads", verify=True)
    async with again:
        assert not again.recycle_on  # no lock: nothing is recycled
        assert (await again.offload([b"o"], [0])).ok
    assert not target.exists()


async def test_the_layout_notes_temporary_is_unpredictable_and_exclusive(tmp_path: Path, decoy: Path) -> None:
    """The LAYOUT note is written through a fresh, unguessable name, never through a link
    planted at a name an earlier run used."""
    root = tmp_path / "root"
    tier, _ = make_tier(root, "threads")
    ns = tier.dir
    ns.mkdir(parents=True)
    # the names an attacker could predict: this process's temporary names of the next tiers
    host_pid = f"{os.uname().nodename}~{os.getpid()}~"
    for n in range(0, 2000):
        (ns / f".tmp~{host_pid}{n}~0").symlink_to(decoy)
    async with tier:
        assert (ns / "LAYOUT").is_file() and not (ns / "LAYOUT").is_symlink()
    assert untouched(decoy)


# -- item 5: modes ------------------------------------------------------------------------------
@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def modes(root: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            out[str(p.relative_to(root))] = stat.S_IMODE(p.lstat().st_mode)
    return out


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("publish", ["auto", "rename"])
async def test_files_and_directories_are_private_by_default(
    tmp_path: Path, engine: str, publish: str, umask_022: None
) -> None:
    root = tmp_path / "root"
    tier, _ = make_tier(root, engine, publish=publish)
    async with tier:
        assert (await tier.offload([b"m0", b"m1"], [0, 1])).ok
    found = modes(root)
    assert found[tier.dir.name] == 0o700 and found[f"{tier.dir.name}/00"] == 0o700
    files = {p: m for p, m in found.items() if (root / p).is_file()}
    assert files and set(files.values()) == {0o600}, files
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


@pytest.mark.parametrize("engine", ENGINES)
async def test_file_mode_and_dir_mode_are_applied_whatever_the_umask(tmp_path: Path, engine: str) -> None:
    old = os.umask(0o077)
    try:
        root = tmp_path / "root"
        tier, _ = make_tier(root, engine, file_mode=0o640, dir_mode=0o750)
        async with tier:
            assert (await tier.offload([b"g0"], [0])).ok
    finally:
        os.umask(old)
    found = modes(root)
    assert found[tier.dir.name] == 0o750
    assert stat.S_IMODE(chunk_file(tier, b"g0").stat().st_mode) == 0o640


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("per_call", [1, 4])
async def test_a_recycled_file_gets_the_tiers_file_mode(tmp_path: Path, engine: str, per_call: int) -> None:
    """A recycled file keeps its inode: made under ``file_mode=0o644``, then taken over by a
    tier reopened with 0o600, it stayed readable by all. One chunk a call is the one-job
    path, four the group job's."""
    root = tmp_path / "root"
    tier, _ = make_tier(root, engine, capacity_bytes=4 * PER, file_mode=0o644)
    async with tier:
        assert (await tier.offload([b"o0", b"o1", b"o2", b"o3"], [0, 1, 2, 3])).ok
    tier, _ = make_tier(root, engine, capacity_bytes=4 * PER, file_mode=0o600)
    async with tier:
        for i in range(0, 4, per_call):
            assert (await tier.offload([b"n%d" % j for j in range(i, i + per_call)], list(range(i, i + per_call)))).ok
        assert tier.stats().extra.get("recycled") == 4, tier.stats().extra
    chunks = {p: m for p, m in modes(root).items() if (root / p).is_file() and p.count("/") == 2}  # dir/shard/name
    assert len(chunks) == 4 and set(chunks.values()) == {0o600}, chunks


async def test_missing_parents_of_the_root_get_dir_mode_too(tmp_path: Path) -> None:
    """The root's missing parents were made as ``mkdir -p`` makes them: 0o755, or 0o777
    (writable by all) under umask 0; ``dir_mode`` is for every directory the tier makes."""
    old = os.umask(0)
    try:
        root = tmp_path / "typo" / "deeper" / "kv"
        tier, _ = make_tier(root, "threads")
        async with tier:
            assert (await tier.offload([b"p0"], [0])).ok
    finally:
        os.umask(old)
    for d in (tmp_path / "typo", tmp_path / "typo" / "deeper", root):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


@pytest.mark.parametrize("where", ["root", "parent"])
async def test_a_root_that_is_a_file_is_refused_naming_it(tmp_path: Path, where: str) -> None:
    """Was a bare ``FileExistsError`` (the root a file) or ``NotADirectoryError`` (a parent)."""
    afile = tmp_path / "afile"
    afile.write_bytes(b"x")
    tier, _ = make_tier(afile if where == "root" else afile / "kv", "threads")
    with pytest.raises(TierConfigError, match=r"fs tier: root .*'.*afile' is a file; give a directory"):
        async with tier:
            pass
    assert afile.read_bytes() == b"x"


@pytest.mark.parametrize(
    "name, value", [("file_mode", True), ("file_mode", "0600"), ("dir_mode", 0o7777 + 1), ("dir_mode", 1.5)]
)
def test_bad_modes_are_refused_naming_what_is_accepted(tmp_path: Path, name: str, value: object) -> None:
    with pytest.raises(TierConfigError, match=f"{name} must be an int"):
        make_tier(tmp_path, "threads", **{name: value})


@pytest.mark.parametrize(
    "name, value, owner", [("file_mode", 0, "0o600"), ("file_mode", 0o200, "0o600"), ("dir_mode", 0o600, "0o700")]
)
def test_modes_that_lock_the_tier_out_of_its_own_files_are_refused(
    tmp_path: Path, name: str, value: int, owner: str
) -> None:
    """``file_mode=0`` was accepted: every store succeeded and every load failed (as any user
    but root)."""
    with pytest.raises(TierConfigError, match=f"{name} must give the owner {owner} .*; got {oct(value)}"):
        make_tier(tmp_path, "threads", **{name: value})


def test_a_capacity_below_one_stored_chunk_is_refused(tmp_path: Path) -> None:
    """``capacity_bytes=1`` was accepted: every store then failed with a CapacityError. So was
    one chunk's payload without room for its header block."""
    with pytest.raises(TierConfigError, match=r"capacity_bytes=1 is less than one chunk"):
        make_tier(tmp_path, "threads", capacity_bytes=1)
    with pytest.raises(TierConfigError, match=rf"capacity_bytes={CHUNK} is less than one stored chunk \(\d+ bytes"):
        make_tier(tmp_path, "threads", capacity_bytes=CHUNK)


# -- item 1, second half: directories others may write into ------------------------------------
async def test_a_root_writable_by_others_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    root.chmod(0o777)
    tier, _ = make_tier(root, "threads")
    with pytest.raises(TierConfigError, match="writable by others"):
        await tier.open()
    root.chmod(0o1777)  # sticky and ours: others cannot replace our files
    tier, _ = make_tier(root, "threads")
    async with tier:
        assert (await tier.offload([b"s"], [0])).ok


async def test_a_namespace_directory_writable_by_others_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    tier, _ = make_tier(root, "threads")
    async with tier:
        pass
    (tier.dir / "3a").chmod(0o777)
    again, _ = make_tier(root, "threads")
    with pytest.raises(TierConfigError, match="writable by others"):
        await again.open()


async def test_a_name_taken_then_freed_by_another_process_is_published_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes share a root: the link found the chunk's name taken, and by the time the
    store looked at what was there, the other process had evicted it. That failed the store
    with EEXIST saying "an unreadable file (No such file or directory)"; the name is free, so
    the store publishes again."""
    from asynctier.tiers.fs import threads as fs_threads

    tier, _ = make_tier(tmp_path / "root", "threads", shared=True)
    real = fs_threads.run_store
    calls: list[int] = []

    def racing(job: Any, *args: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:  # another process's copy at the name: the link finds it taken
            os.close(os.open(job.name, os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=job.dfd))
            out = real(job, *args)
            os.unlink(job.name, dir_fd=job.dfd)  # and evicted by that process at once
            return out
        return real(job, *args)

    monkeypatch.setattr(fs_threads, "run_store", racing)
    async with tier:
        res = await tier.offload([b"raced"], [0])
        assert res.ok, res.failed
        assert len(calls) == 2 and tier.stats().extra["publish_retries"] == 1
        assert (await tier.load([b"raced"], [1])).ok
    assert chunk_file(tier, b"raced").exists()


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_key_another_process_removed_is_stored_again_not_skipped(tmp_path: Path, engine: str) -> None:
    """shared=True: another process removed a key this tier's index held; a store of it was
    skipped ("stored already") and reported ok, with no file on disk."""
    tier, view = make_tier(tmp_path / "root", engine, shared=True)
    other, _ = make_tier(tmp_path / "root", engine, shared=True)  # (a process of its own, as far as the index goes)
    async with tier, other:
        assert (await tier.offload([b"k"], [0])).ok
        assert (await other.remove([b"k"])).ok and not chunk_file(tier, b"k").exists()
        res = await tier.offload([b"k"], [0])
        assert res.ok and res.skipped == [], res
        assert chunk_file(tier, b"k").exists() and tier.stats().extra["stale_hits"] == 1
        res = await tier.offload([b"k"], [0])  # on disk: skipped
        assert res.skipped == [b"k"]
        expected = bytes(view[:CHUNK])
        view[CHUNK : 2 * CHUNK] = bytes(CHUNK)
        assert (await tier.load([b"k"], [1])).ok and bytes(view[CHUNK : 2 * CHUNK]) == expected
