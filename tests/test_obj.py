"""The obj tier (tiers/obj.py): conformance on memory://, file:// and a real S3 server (moto on
127.0.0.1), faults through a loopback proxy, exit safety, configuration, integrity."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asynctier.testing import TierConformance

sys.path.insert(0, str(Path(__file__).parent))
from s3_helpers import CREDS, MotoS3, create_bucket

BUCKET = "asynctier-test"
_MOTO: MotoS3 | None = None


def moto() -> MotoS3:
    """One moto server for the whole module (started on first use, stopped at exit)."""
    global _MOTO
    if _MOTO is None:
        _MOTO = MotoS3()
        create_bucket(_MOTO.endpoint, BUCKET)
    return _MOTO


def s3_config(endpoint: str | None = None, **extra: Any) -> dict[str, Any]:
    ep = endpoint or moto().endpoint
    return {
        "type": "obj",
        "url": f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}",
        "endpoint": ep,
        "region": "us-east-1",
        "credentials": {
            "access_key_id": CREDS["AWS_ACCESS_KEY_ID"],
            "secret_access_key": CREDS["AWS_SECRET_ACCESS_KEY"],
        },
        "client_options": {"allow_http": True},
        **extra,
    }


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

    moto serves about 200 requests/s here, so the two checks that make 1200-2000 requests
    (30 s each) run only with ``ASYNCTIER_SLOW_TESTS=1``; they test the scheduler, which is
    the same code for this tier on every URL and runs above on memory:// and file://.
    """

    @pytest.fixture(params=["asyncio"])
    def loop_factory(self, request: pytest.FixtureRequest) -> Iterator[Any]:
        yield asyncio.new_event_loop

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return s3_config()

    @pytest.mark.skipif(not SLOW, reason="2000 requests to moto (~20 s); set ASYNCTIER_SLOW_TESTS=1")
    def test_loads_not_starved_by_store_flood(self, tmp_path: Path, loop_factory: Any) -> None:
        super().test_loads_not_starved_by_store_flood(tmp_path, loop_factory)

    @pytest.mark.skipif(not SLOW, reason="1200 requests to moto (~10 s); set ASYNCTIER_SLOW_TESTS=1")
    def test_inflight_bound_under_1000_concurrent_calls(self, tmp_path: Path, loop_factory: Any) -> None:
        super().test_inflight_bound_under_1000_concurrent_calls(tmp_path, loop_factory)
