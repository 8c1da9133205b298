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

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.cli import main

HAS_FS = importlib.util.find_spec("tiers.fs") is not None
needs_fs = pytest.mark.skipif(not HAS_FS, reason="tiers/fs.py has not landed")


def invoke(*args: str) -> Any:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result


def test_info_json_lists_builtin_tiers_with_parameters() -> None:
    r = invoke("info", "--json")
    assert r.exit_code == 0, r.output
    tiers = {t["type"]: t for t in json.loads(r.output)}
    assert {"memory", "fs", "nvme", "obj"} <= set(tiers)
    mem = tiers["memory"]
    assert mem["class"] == "tiers.memory.MemoryTier"
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
    cfg = tmp_path / "tiers.toml"
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


async def _fill_fs(root: Path, keys: list[bytes]) -> None:
    spec = OffloadingSpec(CHUNK, len(keys), namespace="cli-test/fsck")
    buf = bytearray(os.urandom(spec.total_bytes))
    tier = SecondaryTierFactory.create_secondary_tier({"type": "fs", "root": str(root)}, memoryview(buf), spec)
    async with tier:
        (await tier.offload(keys, list(range(len(keys))))).raise_for_failures()


def _chunk_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.stat().st_size >= CHUNK)


@needs_fs
def test_fsck_finds_a_corrupted_chunk_and_removes_it_on_request(tmp_path: Path) -> None:
    root = tmp_path / "kv"
    keys = [f"fsck-{i}".encode() for i in range(6)]
    asyncio.run(_fill_fs(root, keys))
    cfg = tmp_path / "tier.toml"
    cfg.write_text(
        f'[spec]\nchunk_bytes = "64K"\nnamespace = "cli-test/fsck"\n\n[tiers.kv]\ntype = "fs"\nroot = "{root}"\n'
    )

    r = invoke("fsck", "--config", str(cfg))
    assert r.exit_code == 0, r.output
    assert "6 chunks checked, 6 good, 0 bad" in r.output

    # flip one payload byte of one real chunk file, past its header
    files = _chunk_files(root)
    assert len(files) == 6, files
    victim = files[2]
    data = bytearray(victim.read_bytes())
    data[-100] ^= 0xFF
    victim.write_bytes(bytes(data))

    r = invoke("fsck", "--config", str(cfg), "--json")
    assert r.exit_code == 1, r.output
    (rep,) = json.loads(r.output)
    assert rep["checked"] == 6 and rep["ok"] == 5 and len(rep["bad"]) == 1 and not rep["clean"]
    assert "checksum" in next(iter(rep["bad"].values()))
    assert victim.exists(), "fsck without --remove must not delete anything"

    r = invoke("fsck", "--config", str(cfg), "--remove")
    assert r.exit_code == 0, r.output
    assert "1 bad, 1 removed" in r.output
    assert not victim.exists()

    r = invoke("fsck", "--config", str(cfg))
    assert r.exit_code == 0, r.output
    assert "5 chunks checked, 5 good, 0 bad" in r.output


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
