"""The conformance suite against real valkey-server processes: one server, and a three-node
cluster (module-scoped). The single-node class runs on asyncio, uvloop and trio (valkey-py is
asyncio-only: under trio the tier runs its client on a loop thread of its own); the cluster
class on asyncio."""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path
from typing import Any

import pytest
from valkey_helpers import ValkeyCluster3, ValkeyProcess, valkey_cluster3, valkey_single

from asynctier.testing import TierConformance
from asynctier.testing.harness import Harness

__all__ = ["valkey_cluster3", "valkey_single"]  # session fixtures, shared with tests/test_valkey.py

_prefixes = itertools.count()


class _ValkeyHooks(TierConformance):
    """The tier frames its own values: the integrity checks damage them with a raw client."""

    url: str = ""
    cluster: bool = False

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        # a key prefix per check: the suite's keys repeat from check to check on one server.
        # Pipelines of 4 chunks: a call of the suite's 64 chunks is then 16 of them for 4
        # in-flight slots, so a cancellation check's interruption lands while some wait. With
        # the default 1 MiB a call was 4 pipelines, all in flight at once, and under trio
        # (the client on its own loop thread) they often all ended before the deadline did:
        # a deadline check missed 30 tries in a row. test_valkey.py keeps the default size.
        return {
            "type": "valkey",
            "url": self.url,
            "key_prefix": f"conf{next(_prefixes)}",
            "pipeline_bytes": 4 * self.chunk_bytes,
        }

    def _raw(self) -> Any:
        import valkey
        from valkey.cluster import ClusterNode

        if self.cluster:
            host, port = self.url.removeprefix("redis://").split(",")[0].split(":")
            return valkey.ValkeyCluster(startup_nodes=[ClusterNode(host, int(port))])
        return valkey.Valkey.from_url(self.url)

    async def corrupt_stored(self, h: Harness, key: bytes, how: str) -> None:
        name = h.tier.name_of(key)  # type: ignore[attr-defined]
        with contextlib.closing(self._raw()) as c:
            value = bytearray(c.get(name))
            if how == "flip":
                value[-1] ^= 0x01
            else:
                del value[-100:]
            c.set(name, bytes(value))

    async def swap_stored(self, h: Harness, key_a: bytes, key_b: bytes) -> None:
        na, nb = h.tier.name_of(key_a), h.tier.name_of(key_b)  # type: ignore[attr-defined]
        with contextlib.closing(self._raw()) as c:
            va, vb = c.get(na), c.get(nb)
            c.set(na, vb)
            c.set(nb, va)


class TestValkeySingle(_ValkeyHooks):
    backends = ("asyncio", "uvloop", "trio")

    @pytest.fixture(autouse=True)
    def _server(self, valkey_single: ValkeyProcess) -> None:
        type(self).url = valkey_single.url


class TestValkeyCluster(_ValkeyHooks):
    backends = ("asyncio",)
    cluster = True

    @pytest.fixture(autouse=True)
    def _server(self, valkey_cluster3: ValkeyCluster3) -> None:
        type(self).url = valkey_cluster3.url
