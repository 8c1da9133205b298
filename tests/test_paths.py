"""Path parameters are checked at construction (issue 24 item 12): an empty path, a NUL
character or a value that is not a path is refused with a clear error, before any I/O."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from asynctier import OffloadingSpec, SecondaryTierFactory, TierConfigError

SPEC = OffloadingSpec(4096, 4, namespace="test/paths")


def build(config: dict[str, Any]) -> Any:
    return SecondaryTierFactory.create_secondary_tier(config, memoryview(bytearray(SPEC.total_bytes)), SPEC)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"type": "fs", "root": ""}, "root must be a non-empty path"),
        ({"type": "fs", "root": "/tmp/a\0b"}, "root must not contain a NUL"),
        ({"type": "fs", "root": b"/tmp/kv"}, "root must be a path"),
        ({"type": "fs", "root": 3}, "root must be a path"),
        ({"type": "nvme", "path": "/tmp/slab", "index_dir": ""}, "index_dir must be a non-empty path"),
        ({"type": "nvme", "path": "/tmp/sl\0ab"}, "path must not contain a NUL"),
        ({"type": "nvme", "paths": ["/tmp/a", ""]}, r"paths\[\] must be a non-empty path"),
    ],
)
def test_bad_paths_are_refused_at_construction(config: dict[str, Any], match: str, tmp_path: Path) -> None:
    with pytest.raises(TierConfigError, match=match):
        build(config)
    assert list(tmp_path.iterdir()) == []  # nothing was made


def test_good_paths_are_kept(tmp_path: Path) -> None:
    assert build({"type": "fs", "root": tmp_path / "kv"}).root == tmp_path / "kv"
    tier = build({"type": "nvme", "path": str(tmp_path / "slab"), "index_dir": tmp_path / "idx"})
    assert tier.index_dir == tmp_path / "idx"
