"""The obj tier (tiers/obj/): the conformance suite on memory://, file:// and a real S3 server
(moto on 127.0.0.1); the tier stays out of ``import asynctier``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import obstore
import pytest

from asynctier.testing import Harness, TierConformance

sys.path.insert(0, str(Path(__file__).parent))
from s3_helpers import s3_config


# -- conformance ------------------------------------------------------------------------------
class ObjConformance(TierConformance):
    """The suite's integrity checks damage objects on the store itself: this tier frames its
    own bytes (the header in front of the payload, docs/tiers/obj.md)."""

    async def corrupt_stored(self, h: Harness, key: bytes, how: str) -> None:
        def damage() -> None:
            st, path = h.tier._st(), h.tier._path(key)
            body = bytearray(obstore.get(st, path).bytes())
            if how == "flip":
                body[-1] ^= 0xFF  # the payload's last byte
            else:
                del body[-100:]
            obstore.put(st, path, bytes(body))

        await anyio.to_thread.run_sync(damage)

    async def swap_stored(self, h: Harness, key_a: bytes, key_b: bytes) -> None:
        def swap() -> None:
            st, a, b = h.tier._st(), h.tier._path(key_a), h.tier._path(key_b)
            body_a, body_b = obstore.get(st, a).bytes(), obstore.get(st, b).bytes()
            obstore.put(st, a, body_b)
            obstore.put(st, b, body_a)

        await anyio.to_thread.run_sync(swap)

    def credential(self, tmp_path: Path) -> tuple[dict[str, Any], str]:
        """A local store takes no credentials: the refusal must not echo the secret."""
        secret = "cred-" + uuid.uuid4().hex
        return {"credentials": {"secret_access_key": secret}}, secret


class TestObjMemoryConformance(ObjConformance):
    backends = ("asyncio",)  # the file:// class below runs the same tier code on every backend

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "obj", "url": "memory://"}


class TestObjFileConformance(ObjConformance):
    backends = ("asyncio", "trio")  # uvloop: covered by the memory, native fs, nvme and chain classes

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "obj", "url": f"file://{tmp_path}/store"}

    def chunk_path(self, h: Harness, key: bytes) -> Path:
        return Path(h.tier.url.removeprefix("file://")) / h.tier._path(key)


SLOW = os.environ.get("ASYNCTIER_SLOW_TESTS") == "1"


class TestObjS3Conformance(ObjConformance):
    """The suite against moto's S3 server on 127.0.0.1, on asyncio and trio (uvloop runs the
    same tier code above, on file://).

    The two checks that make a thousand requests or more run only with
    ``ASYNCTIER_SLOW_TESTS=1``: moto answers slowly (figures in docs/benchmarks.md). They test
    the scheduler, which is the same code for this tier on every URL and runs above on
    memory:// and file://.
    """

    backends = ("asyncio", "trio")

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return s3_config()

    def credential(self, tmp_path: Path) -> tuple[dict[str, Any], str]:
        """The secret key, and the same secret as the endpoint's user info."""
        secret = "cred-" + uuid.uuid4().hex
        cfg = s3_config()
        endpoint = cfg["endpoint"].replace("://", f"://user:{secret}@", 1)
        return {"endpoint": endpoint, "credentials": {**cfg["credentials"], "secret_access_key": secret}}, secret

    @pytest.mark.skipif(not SLOW, reason="2000 requests to a slow moto; set ASYNCTIER_SLOW_TESTS=1")
    def test_loads_not_starved_by_store_flood(self, tmp_path: Path, backend: Any) -> None:
        super().test_loads_not_starved_by_store_flood(tmp_path, backend)

    @pytest.mark.skipif(not SLOW, reason="1200 requests to a slow moto; set ASYNCTIER_SLOW_TESTS=1")
    def test_inflight_bound_under_1000_concurrent_calls(self, tmp_path: Path, backend: Any) -> None:
        super().test_inflight_bound_under_1000_concurrent_calls(tmp_path, backend)


def test_import_asynctier_does_not_import_obstore() -> None:
    code = "import asynctier, sys; assert 'obstore' not in sys.modules and 'asynctier.tiers.obj' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)
