"""The ``asynctier`` command line: ``info``, ``bench`` and ``fsck`` on real tiers and real files."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from asynctier import BlockingChunkTier, ChunkNotFoundError, OffloadingSpec, SecondaryTierFactory
from asynctier.cli import main

HAS_FS = importlib.util.find_spec("asynctier.tiers.fs") is not None


def invoke(*args: str) -> Any:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result


def test_info_json_lists_builtin_tiers_with_parameters() -> None:
    r = invoke("info", "--json")
    assert r.exit_code == 0, r.output
    tiers = {t["type"]: t for t in json.loads(r.output)}
    assert {"memory", "fs", "nvme", "obj"} <= set(tiers)
    mem = tiers["memory"]
    assert mem["class"] == "asynctier.tiers.memory.MemoryTier"
    assert mem["source"] == "registered"
    assert mem["parameters"]["max_inflight"] == "16"
    assert "capacity_bytes" in mem["parameters"]


def _bench_args(tmp_path: Path, *tiers: str) -> list[str]:
    out = tmp_path / "bench.json"
    args = ["bench", "-q", "--root", str(tmp_path / "root"), "--chunk-sizes", "64K", "--depths", "1,4"]
    args += ["--data-size", "1M", "--json", str(out), "--fio-engines", "psync"]
    for t in tiers:
        args += ["--tier", t]
    return args


def test_bench_tiny_run_verifies_every_byte_and_writes_json(tmp_path: Path) -> None:
    tiers = ["memory", "fs"] if HAS_FS else ["memory"]
    r = invoke(*_bench_args(tmp_path, *tiers), "--markdown", str(tmp_path / "bench.md"))
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["ok"] is True
    assert report["command"].startswith("asynctier bench")
    points = report["points"]
    assert {(p["tier"], p["depth"]) for p in points} == {(t, d) for t in tiers for d in (1, 4)}
    for p in points:
        assert p["ok"], p["error"]
        assert p["chunk_bytes"] == 64 * 1024
        # 1 MiB of 64 KiB chunks (at least 2 per unit of depth), plus the one-chunk calls timed
        # for latency: every byte of both loaded back and compared
        assert p["chunks"] == 16 and p["probe_chunks"] == 16
        assert p["verified_bytes"] == (16 + 16) * 64 * 1024
        assert p["offload"]["bytes_per_s"] > 0 and p["load"]["bytes_per_s"] > 0
        assert p["offload"]["lat_p99_s"] >= p["offload"]["lat_p50_s"] > 0
        assert 1 <= p["peak_in_flight"] <= p["depth"]
        assert p["ratios"]["naive_write"] > 0 and p["ratios"]["naive_read"] > 0
        if report["options"]["fio"]:
            assert p["ratios"]["fio_write"] > 0 and p["ratios"]["fio_read"] > 0
    refs = report["references"]
    assert len(refs) == 2 and all(r["naive_write"]["bytes_per_s"] > 0 for r in refs)
    md = (tmp_path / "bench.md").read_text()
    assert report["command"] in md and "| memory | 64 KiB | 4 |" in md
    # the bench cleans up after itself: nothing left under --root but the (empty) root
    assert not any(p.is_file() for p in (tmp_path / "root").rglob("*"))


def test_bench_reports_a_tier_that_cannot_be_imported_as_skipped(tmp_path: Path) -> None:
    cfg = tmp_path / "asynctier.tiers.toml"
    cfg.write_text(
        '[tiers.ghost]\ntype = "GhostTier"\nmodule_path = "no_such_module_anywhere"\n\n[tiers.mem]\ntype = "memory"\n'
    )
    args = _bench_args(tmp_path)
    r = invoke(*args, "--config", str(cfg), "--no-fio", "--no-naive")
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["tiers"]["ghost"]["status"] == "skipped"
    assert "no_such_module_anywhere" in report["tiers"]["ghost"]["reason"]
    assert report["tiers"]["mem"]["status"] == "ok"
    assert {p["tier"] for p in report["points"]} == {"mem"}
    assert "ghost: skipped" in r.output


def test_bench_repeat_reports_the_median_of_verified_runs(tmp_path: Path) -> None:
    r = invoke(*_bench_args(tmp_path, "memory"), "--no-fio", "--repeat", "3")
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["options"]["repeat"] == 3 and "--repeat 3" in report["command"]
    for p in report["points"]:
        assert p["ok"] and p["repeats"] == 3
        assert p["verified_bytes"] == 3 * (16 + 16) * 64 * 1024  # every run loaded back and compared
    assert all(ref["repeats"] == 3 and ref["naive_read"]["bytes_per_s"] > 0 for ref in report["references"])


class ForgetfulTier(BlockingChunkTier):
    """A real tier that is broken on purpose: it remembers keys but never stores or returns bytes."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._keys: set[bytes] = set()

    def write_chunk(self, key: bytes, data: memoryview) -> None:
        self._keys.add(key)

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        if key not in self._keys:
            raise ChunkNotFoundError("not stored", key)

    def chunk_exists(self, key: bytes) -> bool:
        return key in self._keys

    def delete_chunk(self, key: bytes) -> bool:
        present = key in self._keys
        self._keys.discard(key)
        return present


def test_bench_fails_when_bytes_come_back_different(tmp_path: Path) -> None:
    cfg = tmp_path / "asynctier.tiers.toml"
    cfg.write_text('[tiers.broken]\ntype = "ForgetfulTier"\nmodule_path = "test_cli"\n')
    r = invoke(*_bench_args(tmp_path), "--config", str(cfg), "--no-fio", "--no-naive")
    assert r.exit_code == 1, r.output
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["ok"] is False
    assert all(not p["ok"] and "came back different" in p["error"] for p in report["points"])
    assert "FAILED" in r.output


def test_bench_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "bench.png"
    r = invoke(*_bench_args(tmp_path, "memory"), "--no-fio", "--plot", str(png))
    assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_rejects_bad_sizes() -> None:
    r = CliRunner().invoke(main, ["bench", "--chunk-sizes", "12X"])
    assert r.exit_code == 2
    assert "not a size" in r.output


# -- fsck ---------------------------------------------------------------------------------------

CHUNK = 64 * 1024
NAMESPACE = "cli-test/fsck"


def _tier_config(tier_type: str, root: Path) -> dict[str, Any]:
    if tier_type == "fs":
        return {"type": "fs", "root": str(root)}
    if tier_type == "nvme":
        return {"type": "nvme", "path": str(root / "kv.slab"), "capacity_bytes": 8 << 20}
    return {"type": "obj", "url": f"file://{root}"}


async def _fill(config: dict[str, Any], n: int) -> list[bytes]:
    """Offload ``n`` random chunks; return their payloads."""
    spec = OffloadingSpec(CHUNK, n, namespace=NAMESPACE)
    buf = bytearray(os.urandom(spec.total_bytes))
    tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(buf), spec)
    async with tier:
        (await tier.offload([f"fsck-{i}".encode() for i in range(n)], list(range(n)))).raise_for_failures()
    return [bytes(buf[i * CHUNK : (i + 1) * CHUNK]) for i in range(n)]


def _corrupt_on_medium(root: Path, payload: bytes) -> Path:
    """Flip one byte of a stored chunk's payload wherever the tier put it (file, object, slab slot)."""
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        at = data.find(payload)
        if at >= 0:
            with open(path, "r+b") as f:
                f.seek(at + CHUNK // 2)
                f.write(bytes([data[at + CHUNK // 2] ^ 0xFF]))
            return path
    raise AssertionError("the chunk's payload is nowhere under the tier's root")


TIERS = [
    pytest.param(t, marks=pytest.mark.skipif(importlib.util.find_spec(f"asynctier.tiers.{t}") is None, reason=f"no tiers/{t}.py"))
    for t in ("fs", "nvme", "obj")
]


@pytest.mark.parametrize("tier_type", TIERS)
def test_fsck_finds_a_corrupted_chunk_and_removes_it_on_request(tmp_path: Path, tier_type: str) -> None:
    root = tmp_path / "kv"
    root.mkdir()
    config = _tier_config(tier_type, root)
    payloads = asyncio.run(_fill(config, 6))
    cfg = tmp_path / "tier.toml"
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in config.items())
    cfg.write_text(f'[spec]\nchunk_bytes = "64K"\nnamespace = "{NAMESPACE}"\n\n[tiers.kv]\n{body}\n')

    r = invoke("fsck", "--config", str(cfg))
    assert r.exit_code == 0, r.output
    assert "kv: 6 chunks checked, 6 good, 0 bad" in r.output

    victim = _corrupt_on_medium(root, payloads[2])
    r = invoke("fsck", "--config", str(cfg), "--json")
    assert r.exit_code == 1, r.output
    (rep,) = json.loads(r.output)
    assert rep["checked"] == 6 and rep["ok"] == 5 and not rep["clean"]
    assert list(rep["bad"]) == [b"fsck-2".hex()]
    assert "checksum" in rep["bad"][b"fsck-2".hex()]
    if tier_type == "fs":
        assert victim.exists(), "fsck without --remove must not delete anything"

    r = invoke("fsck", "--config", str(cfg), "--remove")
    assert r.exit_code == 0, r.output
    if rep["dropped_by_tier"] == 0:  # still stored: this run finds it again and removes it
        assert "1 bad, 1 removed" in r.output
    if tier_type == "fs":
        assert not victim.exists()

    r = invoke("fsck", "--config", str(cfg))
    assert r.exit_code == 0, r.output
    assert "kv: 5 chunks checked, 5 good, 0 bad" in r.output


def test_fsck_needs_the_layout(tmp_path: Path) -> None:
    cfg = tmp_path / "tier.toml"
    cfg.write_text('[tiers.kv]\ntype = "memory"\n')
    r = CliRunner().invoke(main, ["fsck", "--config", str(cfg)])
    assert r.exit_code == 2
    assert "chunk_bytes" in r.output


def test_fsck_on_an_empty_memory_tier_is_clean(tmp_path: Path) -> None:
    cfg = tmp_path / "tier.toml"
    cfg.write_text('type = "memory"\n[spec]\nchunk_bytes = 4096\n')
    r = invoke("fsck", "--config", str(cfg))
    assert r.exit_code == 0, r.output
    assert "memory: 0 chunks checked" in r.output


def test_fsck_says_when_the_root_or_the_layout_is_not_there_and_creates_nothing(tmp_path: Path) -> None:
    """A mistyped root, or a [spec] other than the chunks', used to open (so create) an empty
    layout directory and report "0 chunks checked: clean", exit 0."""
    root = tmp_path / "kv"
    root.mkdir()
    asyncio.run(_fill({"type": "fs", "root": str(root)}, 2))
    before = sorted(p.name for p in root.iterdir())
    cfg = tmp_path / "tier.toml"

    def fs_at(where: Path, chunk: str = "64K", ns: str = NAMESPACE) -> str:
        return f'[spec]\nchunk_bytes = "{chunk}"\nnamespace = "{ns}"\n\n[tiers.kv]\ntype = "fs"\nroot = "{where}"\n'

    for table, needle in (
        (fs_at(tmp_path / "kvv"), "does not exist"),
        (fs_at(root, chunk="128K"), "nothing stored with this layout"),
        (fs_at(root, ns="other"), "nothing stored with this layout"),
        ('[spec]\nchunk_bytes = "64K"\nnum_chunks = "x"\n\n[tiers.kv]\ntype = "memory"\n', "num_chunks must be an int"),
    ):  # fmt: skip
        cfg.write_text(table)
        r = CliRunner().invoke(main, ["fsck", "--config", str(cfg)])
        assert r.exit_code == 2 and needle in r.output, r.output
        assert r.exception is None or isinstance(r.exception, SystemExit)
    assert sorted(p.name for p in root.iterdir()) == before and not (tmp_path / "kvv").exists()
    afile = tmp_path / "afile"
    afile.write_text("x")
    cfg.write_text(f'[spec]\nchunk_bytes = "64K"\n\n[tiers.kv]\ntype = "fs"\nroot = "{afile}"\n')
    r = CliRunner().invoke(main, ["fsck", "--config", str(cfg)])
    assert r.exit_code in (1, 2) and "Traceback" not in r.output and isinstance(r.exception, SystemExit), r.output


def test_selfcheck_takes_tier_parameters_and_says_what_is_missing(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["selfcheck", "--tier", "fs", "--chunks", "4", "--chunk-bytes", "4096"])
    assert r.exit_code == 2 and "needs parameter 'root'" in r.output and "--param" in r.output, r.output
    r = CliRunner().invoke(main, ["selfcheck", "--tier", "nope"])
    assert r.exit_code == 2 and "Unknown secondary tier type" in r.output, r.output
    r = invoke("selfcheck", "--tier", "fs", "--chunks", "4", "--chunk-bytes", "4096", "--param", f"root={tmp_path}")
    assert r.exit_code == 0 and "selfcheck ok: 4 x 4096 B through 'fs'" in r.output, r.output


def test_bench_checks_its_outputs_and_its_config_before_running(tmp_path: Path) -> None:
    quick = ["bench", "--tier", "memory", "--no-fio", "--no-naive", "-q", "--chunk-sizes", "4K", "--depths", "1"]
    r = CliRunner().invoke(main, [*quick, "--data-size", "64K", "--json", str(tmp_path / "nodir" / "out.json")])
    assert r.exit_code == 2 and "not a writable directory" in r.output, r.output
    cfg = tmp_path / "bench.toml"
    for body, needle in (("depths = 4", "depths must be a list"), ("depths = [0]", "depths must hold positive")):
        cfg.write_text(f'[bench]\n{body}\n\n[tiers.memory]\ntype = "memory"\n')
        r = CliRunner().invoke(
            main, ["bench", "--config", str(cfg), "--no-fio", "--no-naive", "-q", "--data-size", "64K"]
        )
        assert r.exit_code == 2 and needle in r.output, r.output
    cfg.write_text('[bench]\nchunk_sizes = "4K,8K"\ndepths = "1"\n\n[tiers.memory]\ntype = "memory"\n')
    r = invoke("bench", "--config", str(cfg), "--no-fio", "--no-naive", "-q", "--data-size", "64K")
    assert r.exit_code == 0 and "2/2 points ok" in r.output, r.output
