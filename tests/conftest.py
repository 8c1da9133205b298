"""Every async test runs on the stock asyncio loop and on uvloop."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from asynctier.testing import loop_factories

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


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
