"""Test classes whose tiers must live on a disk's file system, not on the suite's tmpfs
(``tests/conftest.py``): O_DIRECT on a block device, a device's statistics."""

from __future__ import annotations

from pathlib import Path

import pytest


class OnDisk:
    """Mixed into a test class: its ``tmp_path`` is :func:`disk_tmp_path`'s."""

    @pytest.fixture
    def tmp_path(self, disk_tmp_path: Path) -> Path:
        return disk_tmp_path
