"""Where the fs tier's shard directories are placed: before the tier makes a shard it flags
the namespace directory so that ext2/3/4 place the directories made in it apart
(``FS_TOPDIR_FL``, ``chattr +T``); a namespace whose shards all exist is left as it is; a
file system without the flag is no error. Why it matters: docs/tiers/fs.md, "Where the shards live". These run
on the disk's file system (``disk_tmp_path``), not the suite's tmpfs, which has no such flag."""

from __future__ import annotations

import fcntl
import os
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.posix_io import aligned_buffer, spread_subdirs
from asynctier.tiers.fs.layout import namespace_dir

SPEC = OffloadingSpec(8192, 4, namespace="test/placement")
_FS_IOC_GETFLAGS, _FS_TOPDIR_FL = 0x80086601, 0x00020000


def _flags(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, struct.pack("i", 0)))[0])
    finally:
        os.close(fd)


def _topdir_here(tmp_path: Path) -> None:
    """Skip unless this file system takes the flag (ext2/3/4 do; tmpfs, xfs, btrfs do not)."""
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        if not spread_subdirs(probe):
            pytest.skip("this file system does not take FS_TOPDIR_FL")
    finally:
        probe.rmdir()


async def _open_close(root: Path, engine: str = "auto") -> None:
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "fs", "root": str(root), "io_engine": engine}, memoryview(aligned_buffer(SPEC.total_bytes)), SPEC
    )
    async with tier:
        assert (await tier.offload([b"k"], [0])).ok


def _groups(dirs: list[Path]) -> int:
    """How many ext4 block groups of 8192 inodes (the usual size) ``dirs`` lie in."""
    return len({(d.stat().st_ino - 1) // 8192 for d in dirs})


def _unflagged_groups(tmp_path: Path) -> int:
    """The groups 255 directories made in an unflagged one lie in here (one or two): how many
    groups the shards take is the file system's (its size, its flex groups), so a test
    compares with this rather than with a fixed count."""
    control = tmp_path / "control"
    control.mkdir()
    dirs = [control / f"{i:02x}" for i in range(1, 256)]
    for d in dirs:
        d.mkdir()
    return _groups(dirs)


@pytest.mark.parametrize("engine", ["threads", "auto"])
async def test_a_namespace_directory_the_tier_makes_spreads_its_shards(disk_tmp_path: Path, engine: str) -> None:
    tmp_path = disk_tmp_path
    _topdir_here(tmp_path)
    await _open_close(tmp_path, engine)
    ns = namespace_dir(tmp_path, SPEC)
    assert _flags(ns) & _FS_TOPDIR_FL
    # the shards themselves are not flagged (nothing is made in them but files), nor the
    # root, which is the user's
    assert not _flags(ns / "00") & _FS_TOPDIR_FL
    assert not _flags(tmp_path) & _FS_TOPDIR_FL
    # and ext4 took the hint: unflagged, the shards would share one or two groups
    assert _groups([ns / f"{i:02x}" for i in range(256)]) > 2 * _unflagged_groups(tmp_path)


async def test_a_namespace_made_by_someone_else_a_moment_before_gets_its_shards_spread(disk_tmp_path: Path) -> None:
    """Another tier made the namespace directory and has not made its shards yet (or died
    before): the tier that makes a shard flags the namespace first, so a tier racing the
    one that made it never places shards in one group."""
    tmp_path = disk_tmp_path
    _topdir_here(tmp_path)
    ns = namespace_dir(tmp_path, SPEC)
    ns.mkdir(mode=0o700)
    (ns / "00").mkdir(mode=0o700)  # and one shard of it
    await _open_close(tmp_path)
    assert _flags(ns) & _FS_TOPDIR_FL
    assert _groups([ns / f"{i:02x}" for i in range(1, 256)]) > 2 * _unflagged_groups(tmp_path)


async def test_a_namespace_whose_shards_exist_is_left_as_it_is(disk_tmp_path: Path) -> None:
    tmp_path = disk_tmp_path
    _topdir_here(tmp_path)
    ns = namespace_dir(tmp_path, SPEC)
    ns.mkdir(mode=0o700)  # an earlier version's: every shard made, unflagged
    for i in range(256):
        (ns / f"{i:02x}").mkdir(mode=0o700)
    await _open_close(tmp_path)
    assert not _flags(ns) & _FS_TOPDIR_FL
    await _open_close(tmp_path)  # and a tier opened on it again
    assert not _flags(ns) & _FS_TOPDIR_FL


@pytest.fixture
def shm_path() -> Iterator[Path]:
    if not os.path.isdir("/dev/shm") or not os.access("/dev/shm", os.W_OK):
        pytest.skip("no writable /dev/shm (tmpfs) here")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as d:
        yield Path(d)


async def test_a_file_system_without_the_flag_serves_as_before(shm_path: Path) -> None:
    assert spread_subdirs(shm_path) is False  # refused quietly (tmpfs has no such flag)
    await _open_close(shm_path)
    assert (namespace_dir(shm_path, SPEC) / "ff").is_dir()


def test_a_descriptor_that_is_not_a_directory_is_no_error(tmp_path: Path) -> None:
    r, w = os.pipe()
    try:
        assert spread_subdirs(r) is False
    finally:
        os.close(r)
        os.close(w)
    assert spread_subdirs(tmp_path / "missing") is False  # (a path that cannot be opened)
