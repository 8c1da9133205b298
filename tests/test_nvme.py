"""The nvme tier: conformance, slot format, eviction, recovery, SIGKILL crash safety, 1M-slot reopen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asynctier.testing import TierConformance


class TestNvmeTier(TierConformance):
    """The suite's bytearray primary buffer is not page-aligned: this runs the bounce path."""

    def tier_config(self, tmp_path: Path) -> dict[str, Any]:
        return {"type": "nvme", "path": str(tmp_path / "kv.slab"), "capacity_bytes": 2048 * 72 * 1024}
