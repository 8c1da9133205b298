"""Every async test runs on the stock asyncio loop and on uvloop; test files go to a tmpfs.

Why a tmpfs: an fs tier makes 256 shard directories and a few dozen files ahead when it
opens, and the suite opens about a thousand tiers and deletes their files after each test.
On an ext4 without a journal (this project's CI machines) every new inode then scans the
inodes freed in the last minute or so (docs/tiers/fs.md, "Where a store's time goes"):
``perf`` put a quarter of the machine's CPU there, and the suite took 480-510 s against
270 s on a tmpfs. A tmpfs is a real file system with every call the tiers make (O_TMPFILE,
renames, OFD locks; O_DIRECT where the kernel has it, checked here); the tests about a disk's
own file system take :func:`disk_tmp_path` instead (``tests/disk_helpers.py``).

``ASYNCTIER_TEST_TMP``: ``disk`` keeps every test under the system's temporary directory;
a directory puts them there; unset, a tmpfs at ``/dev/shm`` with room is used where there
is one. ``--basetemp`` given on the command line wins over all three.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from asynctier.testing import loop_factories

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

#: The system's temporary directory, where :func:`disk_tmp_path` puts its directories.
DISK_TMP = Path(tempfile.gettempdir())
_PREFIX = "asynctier-tests-"
_TMPFS_ROOM = 4 << 30  # an nvme conformance slab is 145 MB; a failed test keeps its files


def _tmpfs_base() -> Path | None:
    """/dev/shm if it is a tmpfs with room and takes O_DIRECT opens (else aligned tests
    would take the buffered fallback there), writable by this user."""
    shm = Path("/dev/shm")
    try:
        with open("/proc/self/mounts") as mounts:
            if not any(line.split()[1:3] == [str(shm), "tmpfs"] for line in mounts):
                return None
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize < _TMPFS_ROOM:
            return None
        fd, probe = tempfile.mkstemp(dir=shm, prefix=_PREFIX)
        os.close(fd)
        try:
            os.close(os.open(probe, os.O_RDONLY | getattr(os, "O_DIRECT", 0)))
        finally:
            os.unlink(probe)
    except OSError:
        return None
    return shm


def _remove_stale(base: Path) -> None:
    """Directories earlier runs left in ``base`` (their tests failed): gone once their process is."""
    for d in base.glob(f"{_PREFIX}*-*"):
        pid = d.name[len(_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit():
            continue  # not a run's
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except OSError:
            pass  # alive, another user's


def pytest_configure(config: pytest.Config) -> None:
    if config.option.basetemp:
        return
    choice = os.environ.get("ASYNCTIER_TEST_TMP", "")
    if choice == "disk":
        return
    base = Path(choice) if choice else _tmpfs_base()
    if base is None:
        return
    _remove_stale(base)
    config.option.basetemp = tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base)


_FAILED = pytest.StashKey[int]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_FAILED] = session.testsfailed


def pytest_unconfigure(config: pytest.Config) -> None:
    # a run's base (its tests' and session fixtures' directories) goes with it unless a test
    # failed: then it is kept for a look, until the next run on this machine
    base = config.option.basetemp
    if base and Path(base).name.startswith(_PREFIX) and config.stash.get(_FAILED, 1) == 0:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def disk_tmp_path(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A directory on the file system of the system's temporary directory (a disk's, where
    tests run on a tmpfs), removed after the test unless it failed."""
    path = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}disk-", dir=DISK_TMP))
    yield path
    report = getattr(request.node, "rep_call", None)
    if report is None or not report.failed:
        shutil.rmtree(path, ignore_errors=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]
    return report


def pytest_asyncio_loop_factories(config: Any, item: Any) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return loop_factories()


@pytest.fixture(autouse=True, scope="session")
def _examples_importable() -> None:
    # conformance classes build tiers by module_path from the examples directory
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))


@pytest.fixture
def atime_updates(tmp_path: Path) -> None:
    """Skip unless a plain read under ``tmp_path`` updates an access time that is not after
    the modification time (relatime, strictatime): the mount a test of O_NOATIME needs."""
    probe = tmp_path / ".atime-probe"
    probe.write_bytes(b"x")
    os.utime(probe, ns=(1, 1))
    probe.read_bytes()
    updated = probe.stat().st_atime_ns != 1
    probe.unlink()
    if not updated:
        pytest.skip("the file system under tmp_path does not update access times (noatime)")


@pytest.fixture
def speedups() -> Any:
    """The C twins (asynctier/_speedups.c) bound to the native workers' xxh3; skipped where
    they were not built or no system xxHash library was found."""
    from asynctier.engines.native import problem
    from asynctier.engines.speedups import speedups as bound

    mod = bound()
    if mod is None:
        pytest.skip(f"no C twins here: {problem() or 'asynctier._speedups not built'}")
    return mod
