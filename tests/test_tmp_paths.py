"""Where tests keep their files (tests/conftest.py): a tmpfs by default, a disk for the
classes and tests about one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import _PREFIX, DISK_TMP, _remove_stale
from disk_helpers import OnDisk


def test_disk_tmp_path_is_a_fresh_directory_under_the_systems_temporary_one(disk_tmp_path: Path) -> None:
    assert disk_tmp_path.parent == DISK_TMP and disk_tmp_path.is_dir()
    assert not any(disk_tmp_path.iterdir())


class TestOnDisk(OnDisk):
    def test_a_classs_tmp_path_is_on_the_disk(self, tmp_path: Path) -> None:
        assert tmp_path.parent == DISK_TMP


def test_runs_left_behind_are_removed_once_their_process_is_gone(tmp_path: Path) -> None:
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    gone = tmp_path / f"{_PREFIX}{int(ended.stdout)}-abc"
    alive = tmp_path / f"{_PREFIX}{os.getpid()}-abc"
    other = tmp_path / f"{_PREFIX}disk-abc"  # not a run's base: left alone
    for d in (gone, alive, other):
        (d / "kept").mkdir(parents=True)
    _remove_stale(tmp_path)
    assert not gone.exists()
    assert (alive / "kept").is_dir() and (other / "kept").is_dir()
