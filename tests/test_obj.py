"""The obj tier (tiers/obj/): the conformance suite on memory://, file:// and a real S3 server
(moto on 127.0.0.1); the tier stays out of ``import asynctier``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asynctier.testing import TierConformance

sys.path.insert(0, str(Path(__file__).parent))
from s3_helpers import s3_config


# -- conformance ------------------------------------------------------------------------------
class TestObjMemoryConformance(TierConformance):
    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "obj", "url": "memory://"}


class TestObjFileConformance(TierConformance):
    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "obj", "url": f"file://{tmp_path}/store"}


SLOW = os.environ.get("ASYNCTIER_SLOW_TESTS") == "1"


class TestObjS3Conformance(TierConformance):
    """The suite against moto's S3 server on 127.0.0.1, on the stock asyncio loop only.

    The two checks that make a thousand requests or more run only with
    ``ASYNCTIER_SLOW_TESTS=1``: moto answers slowly (figures in docs/benchmarks.md). They test
    the scheduler, which is the same code for this tier on every URL and runs above on
    memory:// and file://.
    """

    @pytest.fixture(params=["asyncio"])
    def loop_factory(self, request: pytest.FixtureRequest) -> Iterator[Any]:
        yield asyncio.new_event_loop

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return s3_config()

    @pytest.mark.skipif(not SLOW, reason="2000 requests to a slow moto; set ASYNCTIER_SLOW_TESTS=1")
    def test_loads_not_starved_by_store_flood(self, tmp_path: Path, loop_factory: Any) -> None:
        super().test_loads_not_starved_by_store_flood(tmp_path, loop_factory)

    @pytest.mark.skipif(not SLOW, reason="1200 requests to a slow moto; set ASYNCTIER_SLOW_TESTS=1")
    def test_inflight_bound_under_1000_concurrent_calls(self, tmp_path: Path, loop_factory: Any) -> None:
        super().test_inflight_bound_under_1000_concurrent_calls(tmp_path, loop_factory)


def test_import_asynctier_does_not_import_obstore() -> None:
    code = "import asynctier, sys; assert 'obstore' not in sys.modules and 'asynctier.tiers.obj' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)
