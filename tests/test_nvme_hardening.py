# ruff: noqa: ASYNC240  (small setup files on a local disk; the tier under test is what is async)
"""The nvme tier against a hostile neighbour (issue 24): no file is opened through a link
planted at a slab, checkpoint or journal name, files and directories are private by default,
a directory others may write into is refused; a call larger than the slab ends the same with
or without coalescing; a tier never closed ends quietly at exit."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from nvme_helpers import CHUNK, fill, make

from asynctier import TierConfigError

HERE = Path(__file__).parent


def once(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test once, on the stock asyncio loop: these are about files, not loops."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


@pytest.fixture
def decoy(tmp_path: Path) -> Iterator[Path]:
    """A file outside the tier's directories that nothing may write, truncate or create."""
    outside = tmp_path / "outside"
    outside.mkdir()
    path = outside / "decoy"
    path.write_bytes(b"precious" * 1024)
    yield path


def untouched(decoy: Path) -> bool:
    return decoy.read_bytes() == b"precious" * 1024


def mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    yield
    os.umask(old)


# -- item 1: links at the names the tier uses ---------------------------------------------------
@once
async def test_a_slab_path_that_is_a_link_to_a_file_is_refused(tmp_path: Path, decoy: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "kv.slab").symlink_to(decoy)
    tier, _ = make(d / "kv.slab", reformat=True)  # even told to format over what is there
    with pytest.raises(TierConfigError, match="symbolic link"):
        await tier.open()
    assert untouched(decoy)


@once
async def test_a_dangling_link_at_the_slab_path_is_not_followed(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    target = tmp_path / "outside-new-file"
    (d / "kv.slab").symlink_to(target)
    tier, _ = make(d / "kv.slab")
    with pytest.raises(TierConfigError, match="symbolic link"):
        await tier.open()
    assert not target.exists()


def test_a_link_is_followed_only_to_a_block_device(tmp_path: Path) -> None:
    """The names under /dev/disk/by-id/ are links: a slab path that leads to a block device
    is taken as the device; a link to anything else is refused."""
    from asynctier.tiers.nvme.files import slab_kind

    dev = tmp_path / "blockdev"
    try:
        os.mknod(dev, stat.S_IFBLK | 0o600, os.makedev(7, 200))  # a device node; never opened here
    except PermissionError:
        pytest.skip("making a block device node needs CAP_MKNOD")
    (tmp_path / "by-id").symlink_to(dev)
    assert slab_kind(tmp_path / "by-id", 0o700) == "device"
    assert slab_kind(dev, 0o700) == "device"
    (tmp_path / "to-file").symlink_to(tmp_path / "file")
    (tmp_path / "file").touch()
    with pytest.raises(TierConfigError, match="symbolic link"):
        slab_kind(tmp_path / "to-file", 0o700)
    assert slab_kind(tmp_path / "file", 0o700) == "file" and slab_kind(tmp_path / "new", 0o700) == "new"


@pytest.mark.parametrize("what", ["fifo", "directory"])
@once
async def test_a_slab_path_that_is_not_a_file_is_refused(tmp_path: Path, what: str) -> None:
    p = tmp_path / "kv.slab"
    os.mkfifo(p) if what == "fifo" else p.mkdir()
    tier, _ = make(p)
    with pytest.raises(TierConfigError, match="neither a regular file nor a block device"):
        await tier.open()


@once
async def test_the_checkpoint_temporary_is_never_written_through_a_link(tmp_path: Path, decoy: Path) -> None:
    """The temporary had a fixed name (``*.ckpt.tmp``) opened O_CREAT|O_TRUNC: a link planted
    there truncated and overwrote its target at every checkpoint."""
    p = tmp_path / "kv.slab"
    planted = tmp_path / "kv.slab.atidx.ckpt.tmp"
    planted.symlink_to(decoy)
    tier, view = make(p)
    fill(view, CHUNK, 1)
    async with tier:
        assert (await tier.offload([b"a", b"b"], [0, 1])).ok
    assert untouched(decoy)
    assert not [q.name for q in tmp_path.iterdir() if ".ckpt.tmp." in q.name]  # no temporary left
    tier, _ = make(p)
    async with tier:  # the checkpoint written beside the link is the one read back
        assert await tier.lookup([b"a", b"b"]) == [True, True]
        assert tier.stats().extra.get("recovered_chunks") == 2


@once
async def test_a_journal_generation_is_never_opened_through_a_link(tmp_path: Path, decoy: Path) -> None:
    p = tmp_path / "kv.slab"
    tier, view = make(p)
    fill(view, CHUNK, 2)
    async with tier:
        cat = tier._catalog
        assert cat is not None
        cat.journal.path(cat.journal.gen + 1).symlink_to(decoy)  # the next generation's name
        assert (await tier.offload([b"a"], [0])).ok
    assert untouched(decoy)
    tier, _ = make(p)
    async with tier:
        assert await tier.lookup([b"a"]) == [True]


@once
async def test_a_link_at_the_checkpoints_name_is_refused_at_open(tmp_path: Path, decoy: Path) -> None:
    p = tmp_path / "kv.slab"
    tier, view = make(p)
    fill(view, CHUNK, 3)
    async with tier:
        assert (await tier.offload([b"a"], [0])).ok
    ck = tmp_path / "kv.slab.atidx.ckpt"
    decoy.write_bytes(ck.read_bytes())
    ck.unlink()
    ck.symlink_to(decoy)
    tier, _ = make(p)
    with pytest.raises(TierConfigError, match="not a regular file"):
        await tier.open()


@once
async def test_leftover_checkpoint_temporaries_are_removed_at_open(tmp_path: Path) -> None:
    p = tmp_path / "kv.slab"
    tier, _ = make(p)
    async with tier:
        pass
    left = tmp_path / "kv.slab.atidx.ckpt.tmp.0123456789abcdef"
    left.write_bytes(b"a checkpoint a crash cut short")
    tier, _ = make(p)
    async with tier:
        assert not left.exists()


# -- item 1: modes -----------------------------------------------------------------------------------
@once
async def test_files_and_directories_are_private_by_default(tmp_path: Path, umask_022: None) -> None:
    p = tmp_path / "slabs" / "kv.slab"
    idx = tmp_path / "index"
    tier, view = make(p, index_dir=str(idx))
    fill(view, CHUNK, 4)
    async with tier:
        assert (await tier.offload([b"a"], [0])).ok
    assert mode(p) == 0o600 and mode(p.parent) == 0o700 and mode(idx) == 0o700
    made = sorted(q.name for q in idx.iterdir())
    assert any(".ckpt" in n for n in made) and any(".journal." in n for n in made), made
    assert {q.name: mode(q) for q in idx.iterdir()} == dict.fromkeys(made, 0o600)


@once
async def test_file_mode_and_dir_mode_are_applied_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        p = tmp_path / "slabs" / "kv.slab"
        tier, _ = make(p, file_mode=0o640, dir_mode=0o750)
        async with tier:
            assert (await tier.offload([b"a"], [0])).ok
    finally:
        os.umask(old)
    assert mode(p.parent) == 0o750
    assert {q.name: mode(q) for q in p.parent.iterdir()} == dict.fromkeys((q.name for q in p.parent.iterdir()), 0o640)


@once
async def test_missing_parents_get_dir_mode_too(tmp_path: Path) -> None:
    """``mkdir -p`` gave the missing parents of the slab's directory and of ``index_dir`` 0o777
    under umask 0 (writable by all); ``dir_mode`` is for every directory the tier makes."""
    old = os.umask(0)
    try:
        p = tmp_path / "typo" / "deep" / "kv.slab"
        idx = tmp_path / "idx" / "typo" / "deep"
        tier, _ = make(p, index_dir=str(idx))
        async with tier:
            assert (await tier.offload([b"a"], [0])).ok
    finally:
        os.umask(old)
    for d in (tmp_path / "typo", p.parent, tmp_path / "idx", tmp_path / "idx" / "typo", idx):
        assert mode(d) == 0o700, d


@once
@pytest.mark.parametrize("which", ["index_dir", "slab_parent"])
async def test_a_directory_that_is_a_file_is_refused_naming_it(tmp_path: Path, which: str) -> None:
    """Was a bare ``FileExistsError``."""
    afile = tmp_path / "afile"
    afile.write_bytes(b"x")
    if which == "index_dir":
        tier, _ = make(tmp_path / "kv.slab", index_dir=str(afile))
        said = r"nvme tier: index_dir '.*afile': '.*afile' is a file"
    else:
        tier, _ = make(afile / "kv.slab")
        said = r"nvme tier: the slab's directory '.*afile': '.*afile' is a file"
    with pytest.raises(TierConfigError, match=said):
        async with tier:
            pass
    assert afile.read_bytes() == b"x"


@once
async def test_an_existing_slab_keeps_its_mode(tmp_path: Path) -> None:
    """Modes apply to what the tier creates, not to a file it is given."""
    p = tmp_path / "kv.slab"
    p.touch()
    p.chmod(0o660)
    tier, _ = make(p)
    async with tier:
        pass
    assert mode(p) == 0o660


@pytest.mark.parametrize(
    "name, value", [("file_mode", True), ("file_mode", "0600"), ("dir_mode", 0o1000), ("dir_mode", 7.0)]
)
def test_bad_modes_are_refused_naming_what_is_accepted(tmp_path: Path, name: str, value: object) -> None:
    with pytest.raises(TierConfigError, match=f"{name} must be an int from 0 to 0o777"):
        make(tmp_path / "kv.slab", **{name: value})


def test_modes_without_the_owners_bits_and_an_absurd_capacity_are_refused(tmp_path: Path) -> None:
    """Without the owner's bits the open failed with a PermissionError; a capacity past the
    superblock's field with a bare ``struct.error`` at open."""
    with pytest.raises(TierConfigError, match=r"file_mode must give the owner 0o600"):
        make(tmp_path / "kv.slab", file_mode=0o400)
    with pytest.raises(TierConfigError, match=r"capacity_bytes must be below 2\*\*63"):
        make(tmp_path / "kv.slab", slots=None, capacity_bytes=10**30)


# -- item 1: directories others may write into -------------------------------------------------------
@once
async def test_an_index_dir_writable_by_others_is_refused_before_any_slab_is_made(tmp_path: Path) -> None:
    idx = tmp_path / "idx"
    idx.mkdir()
    idx.chmod(0o777)
    p = tmp_path / "slabs" / "kv.slab"
    tier, _ = make(p, index_dir=str(idx))
    with pytest.raises(TierConfigError, match=r"idx is writable by others \(mode 0o777"):
        await tier.open()
    assert not p.exists() and list(idx.iterdir()) == []
    idx.chmod(0o1777)  # sticky and ours: others cannot replace or remove our files
    tier, view = make(p, index_dir=str(idx))
    fill(view, CHUNK, 5)
    async with tier:
        assert (await tier.offload([b"a"], [0])).ok


@once
async def test_a_slab_directory_writable_by_others_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(0o777)
    tier, _ = make(d / "kv.slab", index_dir=str(tmp_path / "idx"))
    with pytest.raises(TierConfigError, match="writable by others"):
        await tier.open()
    assert list(d.iterdir()) == []


@once
async def test_a_failed_open_removes_the_directory_it_made(tmp_path: Path) -> None:
    """Too small for one slot: the slab file and its directory, both made by the open, go."""
    d = tmp_path / "new" / "dir"
    tier, _ = make(d / "kv.slab", slots=None, capacity_bytes=CHUNK)  # (a chunk, without its header block)
    with pytest.raises(TierConfigError, match=r"no room .*superblock; give at least \d+") as e:
        await tier.open()  # (it said only "no room for one slot", of less than what was given)
    assert not d.exists()
    least = int(str(e.value).rsplit(" ", 1)[-1])
    tier, _ = make(d / "kv.slab", slots=None, capacity_bytes=least)
    async with tier:
        assert tier.nslots == 1


# -- item 15: one call larger than the slab ----------------------------------------------------------
@pytest.mark.parametrize("coalesce_bytes", [1 << 20, 0], ids=["coalesced", "one-per-job"])
@once
async def test_a_call_larger_than_the_slab_evicts_the_same_with_or_without_coalescing(
    tmp_path: Path, coalesce_bytes: int
) -> None:
    """1,000 small chunks into 511 slots: with coalescing, the keys beyond the free slots
    failed with CapacityError (their jobs held every slot unpublished); one chunk per job
    evicted. Both now store the whole call, evicting its own older chunks."""
    n, chunk = 1000, 4096
    tier, view = make(tmp_path / "kv.slab", chunk=chunk, nchunks=n, slots=511, coalesce_bytes=coalesce_bytes,
                      preallocate=False)  # fmt: skip
    fill(view, chunk, 6)
    keys = [b"big-%04d" % i for i in range(n)]
    async with tier:
        assert tier.nslots == 511
        res = await tier.offload(keys, list(range(n)))
        assert res.ok, f"{len(res.failed)} keys failed: {next(iter(res.failed.values()))!r}"
        s = tier.stats()
        assert s.evictions > 0 and 0 < s.stored_chunks <= 511
        assert sum(await tier.lookup(keys)) == s.stored_chunks


# -- item 16: a tier never closed ----------------------------------------------------------------------
@once
async def test_a_tier_never_closed_ends_quietly_when_its_finalizer_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """At interpreter exit the catalog's finalizer runs while the tier is still referenced:
    it woke the checkpoint thread, which then wrote a checkpoint on the journal it had just
    closed (a flush failed on fd -1, logged) and went on retrying."""
    p = tmp_path / "kv.slab"
    tier, view = make(p)
    fill(view, CHUNK, 7)
    await tier.open()
    assert (await tier.offload([b"a", b"b"], [0, 1])).ok
    cat = tier._catalog
    assert cat is not None and cat._finalizer is not None and cat._ckpt_thread is not None
    thread = cat._ckpt_thread
    with caplog.at_level(logging.DEBUG, logger="asynctier"):
        cat._finalizer()  # what interpreter exit does
        thread.join(60)  # a bound on a bug, not a timing: the thread ends at once when it works
    assert not thread.is_alive(), "the checkpoint thread did not end"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "checkpoint_failures" not in tier.stats().extra
    tier._state = "closed"  # its files are closed: leave it as a process exiting would
    tier, _ = make(p)
    async with tier:  # what was acknowledged is in the journal
        assert await tier.lookup([b"a", b"b"]) == [True, True]


def test_a_process_exiting_with_a_tier_open_loses_nothing_and_logs_nothing(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import asyncio, logging, sys
        sys.path.insert(0, {str(HERE)!r})
        logging.basicConfig(level=logging.WARNING)
        from nvme_helpers import CHUNK, fill, make
        tier, view = make(__import__("pathlib").Path({str(tmp_path / "kv.slab")!r}))
        fill(view, CHUNK, 8)
        async def main():
            await tier.open()
            assert (await tier.offload([b"a", b"b"], [0, 1])).ok
        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    tier, _ = make(tmp_path / "kv.slab")

    async def check() -> list[bool]:
        async with tier:
            return await tier.lookup([b"a", b"b"])

    assert asyncio.run(check()) == [True, True]
