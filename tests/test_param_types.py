"""Every parameter of every built-in tier (what ``asynctier info`` lists) refuses a value of the
wrong type at construction, naming the parameter and what it accepts (issue 24 item 11): a
bool is a bool (not 0, 1, 0.0 or Decimal(1)), an int is not a bool, a number of seconds takes
int and float but not bool, a path is a str or PathLike. Values of the right type pass."""

from __future__ import annotations

import math
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from asynctier import OffloadingSpec, SecondaryTierFactory, TierConfigError
from asynctier.factory import accepted_parameters
from asynctier.testing.checks_hardening import wrong_values

SPEC = OffloadingSpec(4096, 4, namespace="test/param-types")

#: a valid config of each built-in tier (construction only: nothing is opened)
CONFIGS: dict[str, dict[str, Any]] = {
    "memory": {"type": "memory"},
    "fs": {"type": "fs", "root": "/nonexistent/kv"},
    "nvme": {"type": "nvme", "path": "/nonexistent/kv.slab", "capacity_bytes": 1 << 20},
    "obj-memory": {"type": "obj", "url": "memory://"},
    "obj-s3": {"type": "obj", "url": "s3://bucket/kv", "endpoint": "http://127.0.0.1:9", "region": "us-east-1"},
    "chain": {
        "type": "chain",
        "tiers": [{"type": "memory", "capacity_bytes": 1 << 20}, {"type": "fs", "root": "/nonexistent/kv"}],
    },
    "valkey": {"type": "valkey", "url": "redis://127.0.0.1:9", "timeout_s": 1.0},
}
#: ``path`` and ``paths`` are exclusive: each is tried alone
EXCLUSIVE = {"nvme": {"paths": "path"}}


def build(config: dict[str, Any]) -> Any:
    return SecondaryTierFactory.create_secondary_tier(config, memoryview(bytearray(SPEC.total_bytes)), SPEC)


def params(tier: str) -> dict[str, Any]:
    return accepted_parameters(SecondaryTierFactory.get_tier_class(CONFIGS[tier]))


def config_with(tier: str, name: str, value: object) -> dict[str, Any]:
    cfg = {**CONFIGS[tier], name: value}
    drop = EXCLUSIVE.get(tier, {}).get(name)
    if drop is not None:
        cfg.pop(drop)
    return cfg


def kinds(annotation: object) -> set[str]:
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return {k for k in ("bool", "int", "float", "str", "PathLike") if k in text}


def test_every_built_in_tier_is_covered() -> None:
    listed = {i.tier_type for i in SecondaryTierFactory.registered()}
    assert listed <= {c["type"] for c in CONFIGS.values()}, listed


@pytest.mark.parametrize("tier", list(CONFIGS))
def test_wrong_types_are_refused_at_construction_naming_the_parameter(tier: str) -> None:
    build(CONFIGS[tier])  # the base config itself is valid
    problems: list[str] = []
    for name, p in params(tier).items():
        bad = [*wrong_values(p.annotation), Decimal(1), math.nan if "float" in kinds(p.annotation) else b"x"]
        if kinds(p.annotation) & {"bool"} and not kinds(p.annotation) & {"int", "float"}:
            bad += [0.0, 1.0, Decimal(0), "True"]
        if kinds(p.annotation) & {"str"} and "Mapping" not in str(p.annotation):
            bad.append({})  # an empty dict compared equal to "nothing given" for a local store
        for value in bad:
            try:
                build(config_with(tier, name, value))
            except TierConfigError as e:
                msg = str(e)
                if name.split("[")[0] not in msg or not any(w in msg for w in ("must", "accepted", "does not apply")):
                    problems.append(f"{name}={value!r}: the message does not say what is accepted: {msg}")
            else:
                problems.append(f"{name}={value!r}: accepted")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("tier", list(CONFIGS))
def test_values_of_the_right_type_are_accepted(tier: str) -> None:
    """A bool flag takes True and False; seconds take an int as well as a float; a path takes
    a PathLike as well as a str."""
    tried = 0
    for name, p in params(tier).items():
        k = kinds(p.annotation)
        values: list[object] = []
        if k == {"bool"} or (k == {"bool", "str"} and isinstance(p.default, str)):  # flags, or "auto" and flags
            values = [True, False]
        elif "float" in k and "bool" not in k and isinstance(p.default, float):
            values = [int(p.default) or 1, float(p.default)]
        elif "PathLike" in k and isinstance(CONFIGS[tier].get(name), str):
            values = [Path(CONFIGS[tier][name])]
        for value in values:
            build(config_with(tier, name, value))
            tried += 1
    assert tried >= 2, f"nothing of {tier} was tried"


def test_nvme_paths_take_path_objects(tmp_path: Path) -> None:
    tier = build({"type": "nvme", "paths": [tmp_path / "a", str(tmp_path / "b")], "capacity_bytes": 1 << 20})
    assert tier.paths == [tmp_path / "a", tmp_path / "b"]
    with pytest.raises(TierConfigError, match="paths must be a non-empty list of paths"):
        build({"type": "nvme", "paths": {str(tmp_path / "a")}, "capacity_bytes": 1 << 20})  # a set: no order


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"type": "memory", 1: 2}, r"config keys must be strings; got 1"),  # was a TypeError from sorting
        (
            {"type": "chain", "tiers": [{"type": "memory", "admit": {"policy": ["second_hit"]}}]},
            r"admit policy must be one of .*; got \[.second_hit.\]",
        ),
        (
            {"type": "chain", "tiers": [{"type": "memory", "admit": {"policy": "second_hit", 1: 2, "b": 3}}]},
            r"admit keys must be strings; got 1",
        ),
    ],
)
def test_odd_config_shapes_are_refused_with_a_config_error(config: dict[Any, Any], match: str) -> None:
    with pytest.raises(TierConfigError, match=match):
        build(config)


@pytest.mark.parametrize("bad", [2, 0.5, "no", None])
async def test_verify_chunks_remove_bad_is_a_bool(bad: object) -> None:
    """2 was read as True, 0.5 as False, "no" raised a bare ValueError."""
    async with build({"type": "memory"}) as tier:
        assert (await tier.offload([b"a"], [0])).ok
        with pytest.raises(TypeError, match=r"remove_bad must be True or False"):
            await tier.verify_chunks([b"a"], remove_bad=bad)
        assert await tier.lookup([b"a"]) == [True]
