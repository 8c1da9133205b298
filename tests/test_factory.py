"""SecondaryTierFactory: the seed's behaviour plus the improvements DESIGN.md lists."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from asynctier import OffloadingSpec, SecondaryTierFactory, TierConfigError
from asynctier.factory import ENTRY_POINT_GROUP

SPEC = OffloadingSpec(4096, 4)


def view() -> memoryview:
    return memoryview(bytearray(SPEC.total_bytes))


def test_import_is_light_and_builtins_are_lazy() -> None:
    code = textwrap.dedent(
        """
        import sys
        import asynctier
        heavy = [m for m in ("tiers.memory", "tiers.fs", "tiers.nvme", "tiers.obj", "obstore", "torch",
                             "numpy", "aiofiles", "rich") if m in sys.modules]
        assert not heavy, heavy
        types = {i.tier_type for i in asynctier.SecondaryTierFactory.registered()}
        assert {"memory", "fs", "nvme", "obj"} <= types, types
        asynctier.SecondaryTierFactory.get_tier_class({"type": "memory"})
        assert "tiers.memory" in sys.modules
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_register_duplicate_is_value_error() -> None:
    with pytest.raises(ValueError, match="already registered"):
        SecondaryTierFactory.register_tier("memory", "tiers.memory", "MemoryTier")


def test_register_by_name_and_create() -> None:
    SecondaryTierFactory.register_tier("test-dir", "dir_tier", "DirTier")
    try:
        cfg = {"type": "test-dir", "root": "/tmp/unused", "max_inflight": 2}
        tier = SecondaryTierFactory.create_secondary_tier(cfg, view(), SPEC)
        assert type(tier).__name__ == "DirTier"
        assert tier.tier_type == "test-dir"
        assert tier.offloading_spec is SPEC
    finally:
        SecondaryTierFactory.unregister_tier("test-dir")


def test_module_path_out_of_tree_and_dict_untouched() -> None:
    cfg = {"type": "DirTier", "module_path": "dir_tier", "root": "/tmp/unused", "verify": False}
    before = copy.deepcopy(cfg)
    tier = SecondaryTierFactory.create_secondary_tier(cfg, view(), SPEC)
    assert cfg == before, "the caller's config dict was modified"
    assert tier.tier_type == "DirTier"


def test_missing_and_unknown_type() -> None:
    with pytest.raises(TierConfigError, match="must include 'type'"):
        SecondaryTierFactory.get_tier_class({})
    with pytest.raises(TierConfigError, match=r"Unknown secondary tier type: 'nope'.*Supported types: .*memory"):
        SecondaryTierFactory.get_tier_class({"type": "nope"})
    with pytest.raises(TierConfigError, match="must be a dict"):
        SecondaryTierFactory.get_tier_class("memory")  # type: ignore[arg-type]


def test_not_a_tier_is_an_error_not_an_assert() -> None:
    with pytest.raises(TierConfigError, match="is not a tier: it must be a subclass of"):
        SecondaryTierFactory.get_tier_class({"type": "OrderedDict", "module_path": "collections"})
    with pytest.raises(TierConfigError, match="has no attribute 'Missing'"):
        SecondaryTierFactory.get_tier_class({"type": "Missing", "module_path": "collections"})
    with pytest.raises(TierConfigError, match="cannot import module 'no_such_module_xyz'"):
        SecondaryTierFactory.get_tier_class({"type": "X", "module_path": "no_such_module_xyz"})


def test_unknown_parameter_names_the_accepted_ones() -> None:
    with pytest.raises(TierConfigError) as ei:
        SecondaryTierFactory.create_secondary_tier({"type": "memory", "max_in_flight": 4}, view(), SPEC)
    msg = str(ei.value)
    assert "'max_in_flight'" in msg and "accepted:" in msg
    for name in ("max_inflight", "capacity_bytes", "store_backpressure", "verify", "durability", "timeout_s"):
        assert name in msg
    with pytest.raises(TierConfigError, match="supplied by the factory"):
        SecondaryTierFactory.create_secondary_tier({"type": "memory", "tier_type": "x"}, view(), SPEC)


def test_subclass_own_parameters_are_accepted_and_required_ones_enforced() -> None:
    with pytest.raises(TierConfigError, match="needs parameter 'root'"):
        SecondaryTierFactory.create_secondary_tier({"type": "DirTier", "module_path": "dir_tier"}, view(), SPEC)


@pytest.mark.parametrize(
    ("cfg", "needle"),
    [
        ({"max_inflight": 0}, "max_inflight must be a positive int"),
        ({"store_backpressure": "block"}, "'wait' or 'drop'"),
        ({"durability": "fsync"}, "accepted: 'none'"),
        ({"capacity_bytes": -5}, "capacity_bytes must be a positive int or None"),
        ({"verify": "yes"}, "verify must be True or False"),
        ({"timeout_s": -1}, "timeout_s must be a finite number >= 0 or None"),
    ],
)
def test_bad_values_are_config_errors(cfg: dict[str, object], needle: str) -> None:
    with pytest.raises(TierConfigError, match=needle):
        SecondaryTierFactory.create_secondary_tier({"type": "memory", **cfg}, view(), SPEC)


def test_entry_point_group_adds_a_tier_without_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real installed-distribution layout: a package plus its .dist-info with entry_points.txt.
    pkg = tmp_path / "plugtier"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from tiers.memory import MemoryTier\n\nclass PlugTier(MemoryTier):\n    default_type = 'plug'\n"
    )
    dist = tmp_path / "plugtier-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plugtier\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nplug = plugtier:PlugTier\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    infos = {i.tier_type: i for i in SecondaryTierFactory.registered()}
    assert infos["plug"].source.startswith("entry point") and "plugtier" in infos["plug"].source
    tier = SecondaryTierFactory.create_secondary_tier({"type": "plug", "max_inflight": 2}, view(), SPEC)
    assert type(tier).__name__ == "PlugTier" and tier.tier_type == "plug"
