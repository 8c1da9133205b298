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
        tiers = ("asynctier.tiers.memory", "asynctier.tiers.fs", "asynctier.tiers.nvme", "asynctier.tiers.obj")
        heavy = [m for m in (*tiers, "obstore", "torch", "numpy", "aiofiles", "rich", "trio", "asynctier.cli")
                 if m in sys.modules]
        assert not heavy, heavy
        types = {i.tier_type for i in asynctier.SecondaryTierFactory.registered()}
        assert {"memory", "fs", "nvme", "obj"} <= types, types
        asynctier.SecondaryTierFactory.get_tier_class({"type": "memory"})
        assert "asynctier.tiers.memory" in sys.modules
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_register_duplicate_is_value_error() -> None:
    with pytest.raises(ValueError, match="already registered"):
        SecondaryTierFactory.register_tier("memory", "asynctier.tiers.memory", "MemoryTier")


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
        # memory I/O is never cut off: timeout_s was accepted and ignored
        ({"timeout_s": 1.0}, "the 'memory' tier's chunk I/O is not cut off by a deadline: timeout_s is accepted"),
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
        "from asynctier.tiers.memory import MemoryTier\n\nclass PlugTier(MemoryTier):\n    default_type = 'plug'\n"
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


@pytest.mark.parametrize(
    "n, value", [(1, "epmod1:Outer.Inner"), (2, "epmod2:PlugTier [extra]"), (3, "epmod3 : PlugTier")]
)
def test_entry_points_are_read_as_entry_points(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int, value: str
) -> None:
    """Valid entry-point values with a nested class, extras or spaces around the colon resolve
    (they were split by hand: "no attribute 'PlugTier [extra]'", "cannot import 'epmod3 '")."""
    pkg = tmp_path / f"epmod{n}"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from asynctier.tiers.memory import MemoryTier\n\n"
        "class PlugTier(MemoryTier):\n    pass\n\n"
        "class Outer:\n    class Inner(MemoryTier):\n        pass\n"
    )
    dist = tmp_path / f"epmod{n}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: epmod{n}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nplug{n} = {value}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    tier = SecondaryTierFactory.create_secondary_tier({"type": f"plug{n}"}, view(), SPEC)
    assert type(tier).__name__ == ("Inner" if n == 1 else "PlugTier")


def test_module_path_beside_a_registered_type_is_said_to_be_ignored(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="asynctier.factory"):
        tier = SecondaryTierFactory.create_secondary_tier({"type": "memory", "module_path": "userpkg"}, view(), SPEC)
    assert type(tier).__name__ == "MemoryTier"
    assert "'module_path' 'userpkg' is ignored" in caplog.text


async def test_unordered_keys_or_ids_are_refused_before_any_io() -> None:
    """A set's order is its hash order: offload({a, b}, [0, 1]) stored slot 0 under
    whichever key came first, reported ok. Sets are refused; dicts (ordered) are not."""
    tier = SecondaryTierFactory.create_secondary_tier({"type": "memory"}, view(), SPEC)
    async with tier:
        with pytest.raises(TypeError, match="ordered sequence"):
            await tier.offload({b"a", b"b"}, [0, 1])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="ordered sequence"):
            await tier.load([b"a", b"b"], {0, 1})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="ordered sequence"):
            await tier.offload(frozenset([b"a"]), [0])  # type: ignore[arg-type]
        assert tier.stats().offloaded == 0
        assert (await tier.offload((k for k in [b"a", b"b"]), (0, 1))).ok  # an iterator keeps its order
        slots = {b"c": 2, b"d": 3}  # a dict keeps insertion order: its keys and values pair up
        assert (await tier.offload(slots.keys(), slots.values())).ok  # type: ignore[arg-type]


async def test_a_tier_error_of_its_own_kind_is_counted_as_other_not_lost() -> None:
    """A ChunkError subclass with a kind of its own: the failure was replaced by a KeyError
    from the stats and not counted."""
    from asynctier import ChunkError
    from asynctier.tiers.memory import MemoryTier

    class QuotaError(ChunkError):
        kind = "quota"

    class QuotaTier(MemoryTier):
        def write_chunk(self, key: bytes, data: memoryview) -> None:
            raise QuotaError("over quota", key)

    tier = QuotaTier(primary_kv_view=view(), offloading_spec=SPEC)
    async with tier:
        res = await tier.offload([b"k"], [0])
        assert isinstance(res.failed[b"k"], QuotaError)
        assert tier.stats().failures["other"] == 1


def test_latency_percentiles_are_nearest_rank() -> None:
    from asynctier.stats import StatsRecorder

    for n, want in ((2, (1.0, 2.0, 2.0)), (10, (5.0, 9.0, 10.0)), (100, (50.0, 90.0, 99.0))):
        s = StatsRecorder()
        for i in range(1, n + 1):
            s.record_success("load", 0, float(i))
        lat = s.latency("load")
        assert (lat.p50, lat.p90, lat.p99) == want, n


def test_a_tier_taking_any_keyword_gets_every_config_key() -> None:
    """A tier whose constructor keeps ``**options`` itself (no base class takes them) was
    refused every key ("accepted: (none)")."""
    import types
    from typing import Any

    from asynctier import SecondaryTierManager

    class OptionsTier(SecondaryTierManager):
        def __init__(self, *, offloading_spec: Any, primary_kv_view: Any, tier_type: str, **options: Any) -> None:
            self.offloading_spec, self.tier_type, self.options = offloading_spec, tier_type, options

        async def open(self) -> Any:
            return self

        async def aclose(self) -> None: ...
        async def offload(self, keys: Any, chunk_ids: Any) -> Any: ...
        async def load(self, keys: Any, chunk_ids: Any) -> Any: ...
        async def lookup(self, keys: Any) -> Any: ...
        async def remove(self, keys: Any) -> Any: ...
        async def touch(self, keys: Any) -> None: ...
        async def drain(self) -> None: ...
        def stats(self) -> Any: ...

    mod = types.ModuleType("optionstier_mod")
    mod.OptionsTier = OptionsTier  # type: ignore[attr-defined]
    sys.modules["optionstier_mod"] = mod
    try:
        cfg = {"type": "OptionsTier", "module_path": "optionstier_mod", "bucket": "x", "depth": 3}
        tier = SecondaryTierFactory.create_secondary_tier(cfg, view(), SPEC)
        assert tier.options == {"bucket": "x", "depth": 3}  # type: ignore[attr-defined]
    finally:
        del sys.modules["optionstier_mod"]
    with pytest.raises(TierConfigError, match="unknown parameter 'bucket'"):  # **kwargs passed on: still checked
        SecondaryTierFactory.create_secondary_tier({"type": "memory", "bucket": "x"}, view(), SPEC)


def test_a_missing_optional_dependency_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_obstore(name: str, *args: object, **kw: object) -> object:
        if name == "obstore" or name.startswith("obstore."):
            raise ModuleNotFoundError("No module named 'obstore'", name="obstore")
        return real_import(name, *args, **kw)  # type: ignore[arg-type]

    for name in [m for m in sys.modules if m == "asynctier.tiers.obj" or m.startswith("asynctier.tiers.obj.")]:
        monkeypatch.delitem(sys.modules, name)  # the package and its modules are imported afresh
    monkeypatch.setattr(builtins, "__import__", no_obstore)
    with pytest.raises(TierConfigError, match=r"pip install 'asynctier\[s3\]'"):
        SecondaryTierFactory.create_secondary_tier({"type": "obj", "url": "memory://"}, view(), SPEC)


@pytest.mark.parametrize("path", ["examples/dir_tier.py", "./dir_tier", "dir_tier.py", "C:\\\\tiers\\\\dir_tier.py"])
def test_module_path_that_is_a_file_path_says_it_must_be_a_module_name(path: str) -> None:
    with pytest.raises(TierConfigError, match=r"module name such as .* not a file path.*module_path='dir_tier'"):
        SecondaryTierFactory.get_tier_class({"type": "DirTier", "module_path": path})


@pytest.mark.parametrize("module_path", ["", ".dir_tier", "dir tier", "dir_tier."])
def test_a_module_path_that_is_no_module_name_is_a_config_error(module_path: object) -> None:
    """``""`` and ``".dir_tier"`` escaped from importlib as a bare ValueError or TypeError."""
    with pytest.raises(TierConfigError, match=r"module_path must be a dotted name of identifiers"):
        SecondaryTierFactory.create_secondary_tier({"type": "DirTier", "module_path": module_path}, view(), SPEC)


def test_register_tier_checks_its_names() -> None:
    """``register_tier("nm", None, "X")`` was accepted, and the first create failed with a TypeError."""
    with pytest.raises(TierConfigError, match=r"module_path must be a dotted name"):
        SecondaryTierFactory.register_tier("never-made", None, "X")  # type: ignore[arg-type]
    with pytest.raises(TierConfigError, match=r"class_name must be a dotted name"):
        SecondaryTierFactory.register_tier("never-made", "dir_tier", "")
    assert "never-made" not in SecondaryTierFactory.registered()


def test_a_module_that_raises_as_it_is_imported_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module_path whose module raised at import (a SyntaxError, a RuntimeError of its own)
    gave that bare error, naming neither the tier nor the config."""
    (tmp_path / "boom_tier.py").write_text("raise RuntimeError('boom at import')\n")
    (tmp_path / "syntax_tier.py").write_text("def (:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = OffloadingSpec(4096, 2)
    for mod, said in (("boom_tier", "RuntimeError: boom at import"), ("syntax_tier", "SyntaxError")):
        with pytest.raises(TierConfigError, match=rf"importing module '{mod}' failed: {said}"):
            SecondaryTierFactory.create_secondary_tier(
                {"type": "X", "module_path": mod}, memoryview(bytearray(spec.total_bytes)), spec
            )


def test_registering_one_name_from_many_threads_lets_one_through() -> None:
    import threading

    name = "RaceTier-test"
    ok: list[int] = []
    barrier = threading.Barrier(8)

    def register(i: int) -> None:
        barrier.wait()
        try:
            SecondaryTierFactory.register_tier(name, f"mod{i}", "Tier")
            ok.append(i)
        except ValueError:
            pass

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(50):
            ok.clear()
            threads = [threading.Thread(target=register, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(ok) == 1, ok
            SecondaryTierFactory.unregister_tier(name)
    finally:
        sys.setswitchinterval(old)


def test_an_entry_point_named_like_a_registered_tier_is_said_to_be_unused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A plugin's entry point named ``memory`` was passed over for the built-in without a word."""
    dist = tmp_path / "shadowplug-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: shadowplug\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nmemory = shadowplug:Tier\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(SecondaryTierFactory, "_shadow_warned", set())
    with caplog.at_level("WARNING", logger="asynctier.factory"):
        for _ in range(2):
            tier = SecondaryTierFactory.create_secondary_tier({"type": "memory"}, view(), SPEC)
    assert type(tier).__name__ == "MemoryTier"
    said = [r.getMessage() for r in caplog.records if "shadowplug" in r.getMessage()]
    assert len(said) == 1 and "is not used: the tier type 'memory' is registered" in said[0], said
    assert [i.source for i in SecondaryTierFactory.registered() if i.tier_type == "memory"] == ["registered"]
    assert SecondaryTierFactory.shadowed() == {"memory": ["shadowplug:Tier (shadowplug)"]}
