"""The ``asynctier`` command line: ``info``, ``selfcheck``, ``bench`` and ``fsck`` on real tiers
and real files, and what a new user meets first: the plan and the bar, checks made before any
byte moves, tables that fit the terminal, one-line errors, sizes, roots, module paths, exit codes."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from asynctier import BlockingChunkTier, ChunkNotFoundError, OffloadingSpec, SecondaryTierFactory, TierConfigError
from asynctier.cli import main

HAS_FS = importlib.util.find_spec("asynctier.tiers.fs") is not None


def invoke(*args: str) -> Any:
    # a fixed width: what the tests look for must not wrap with the terminal pytest runs in
    result = CliRunner().invoke(main, list(args), env={"COLUMNS": "200"}, catch_exceptions=False)
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


def test_info_says_whether_the_c_parts_serve() -> None:
    from asynctier.engines import native

    r = invoke("info")
    assert r.exit_code == 0, r.output
    if native.problem() is None:
        assert "native I/O workers: built" in r.output
        assert "C twins of per-chunk helpers: built" in r.output
    else:
        assert "native I/O workers: not available" in r.output
    from asynctier.buffers import transparent_huge_pages

    mode = transparent_huge_pages()
    assert f"transparent huge pages: {mode or 'not reported'}" in r.output


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


def test_bench_puts_its_primary_buffer_on_huge_pages_unless_told_not_to(tmp_path: Path) -> None:
    from asynctier.buffers import HUGE_PAGE

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    thp_on = thp.exists() and ("[always]" in thp.read_text() or "[madvise]" in thp.read_text())
    for flag, huge in (("--huge-pages", True), ("--no-huge-pages", False)):
        # 4 MiB of 2 MiB chunks: a buffer of whole huge pages
        args = [*_bench_args(tmp_path, "memory"), "--chunk-sizes", "2M", "--depths", "1", "--data-size", "4M"]
        r = invoke(*args, "--no-fio", "--no-naive", flag)
        assert r.exit_code == 0, r.output
        report = json.loads((tmp_path / "bench.json").read_text())
        assert report["options"]["huge_pages"] is huge
        share = report["machine"]["primary_buffer_huge_share"]
        assert (share is None) == ("on huge pages" not in report["machine"]["primary_buffer"])
        if huge and thp_on:
            assert share * 4 * HUGE_PAGE >= HUGE_PAGE, share
        elif not huge:
            assert share in (0, None), share


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


def test_bench_steady_passes_go_into_the_full_tier_before_the_timed_one(tmp_path: Path) -> None:
    """``--steady-passes 2``: two untimed passes of new keys fill and turn over the full tier;
    the timed pass still evicts one chunk a store, and every chunk the tier then holds is one of
    its keys (the point's own check); without ``--steady`` the option is refused."""
    r = invoke(*_bench_args(tmp_path, "memory", "nvme"), "--no-fio", "--no-naive", "--steady", "--steady-passes", "2")
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["options"]["steady_passes"] == 2 and "--steady-passes 2" in report["command"]
    for p in report["points"]:
        assert p["ok"], p["error"]
        assert p["steady_pass_evictions"] >= 2 * 8, p  # each pass turned the tier over
        assert p["steady_evictions"] >= 8, p  # and it was full before the timed pass
    bad = invoke(*_bench_args(tmp_path, "memory"), "--no-fio", "--steady-passes", "1")
    assert bad.exit_code == 2 and "need --steady" in bad.output, bad.output


def test_bench_refuses_a_depth_no_tier_takes_before_it_runs() -> None:
    """``--depths 1025`` ran, and its points failed (exit 1) on the tiers' max_inflight bound."""
    r = invoke("bench", "--tier", "memory", "--chunk-sizes", "4K", "--depths", "1,1025", "--data-size", "64K",
               "--no-fio", "--no-naive", "-q")  # fmt: skip
    assert r.exit_code == 2 and "depths must be at most 1024" in r.output, r.output


def test_bench_repeat_reports_the_median_of_verified_runs(tmp_path: Path) -> None:
    r = invoke(*_bench_args(tmp_path, "memory"), "--no-fio", "--repeat", "3")
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["options"]["repeat"] == 3 and "--repeat 3" in report["command"]
    for p in report["points"]:
        assert p["ok"] and p["repeats"] == 3
        assert p["verified_bytes"] == 3 * (16 + 16) * 64 * 1024  # every run loaded back and compared
    assert all(ref["repeats"] == 3 and ref["naive_read"]["bytes_per_s"] > 0 for ref in report["references"])


def test_bench_steady_times_offloads_into_a_full_tier_beside_the_empty_one(tmp_path: Path) -> None:
    tiers = ["memory", "fs", "nvme"] if HAS_FS else ["memory", "nvme"]
    r = invoke(*_bench_args(tmp_path, *tiers), "--no-fio", "--no-naive", "--steady")
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["options"]["steady"] is True and "--steady" in report["command"]
    for p in report["points"]:
        assert p["ok"], p["error"]
        # half the 16 chunks fill a tier of that capacity; each of the other half evicts one
        # (nvme's capacity_bytes also holds its superblock: it fits fewer, and evicts more)
        assert p["steady_evictions"] >= 8 if p["tier"] == "nvme" else p["steady_evictions"] == 8, p
        assert p["steady_pass_evictions"] == 0, p  # no --steady-passes
        assert p["steady"]["bytes_per_s"] > 0 and p["offload"]["bytes_per_s"] > 0
    assert "full tier" in r.output
    assert not any(p.is_file() for p in (tmp_path / "root").rglob("*"))
    plain = invoke(*_bench_args(tmp_path, "memory"), "--no-fio", "--no-naive")
    assert plain.exit_code == 0, plain.output
    assert all(p["steady"] is None for p in json.loads((tmp_path / "bench.json").read_text())["points"])


class ForgetfulTier(BlockingChunkTier):
    """A real tier that is broken on purpose: it remembers keys but never stores or returns bytes.

    It claims to check its own bytes (``frames_own_bytes``), so nothing but the bench's own
    byte-for-byte verification stands between it and a wrong result.
    """

    frames_own_bytes = True

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
    assert "FAILED" in r.output and "came back different" in r.output
    assert "points did not verify" in r.output


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
    pytest.param(
        t, marks=pytest.mark.skipif(importlib.util.find_spec(f"asynctier.tiers.{t}") is None, reason=f"no tiers/{t}.py")
    )
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


def test_fsck_says_so_when_the_fs_tier_removed_a_truncated_chunk_as_it_opened(tmp_path: Path) -> None:
    """The fs tier's scan removes a file of the wrong size as it opens (it would never serve it),
    and fsck opens it: without --remove that was reported as a clean tier of one chunk fewer,
    exit 0. Now it says how many, and exits 1 unless removal was asked for."""
    root = tmp_path / "kv"
    root.mkdir()
    config = _tier_config("fs", root)
    payloads = asyncio.run(_fill(config, 6))
    cfg = tmp_path / "tier.toml"
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in config.items())
    cfg.write_text(f'[spec]\nchunk_bytes = "64K"\nnamespace = "{NAMESPACE}"\n\n[tiers.kv]\n{body}\n')
    victim = _corrupt_on_medium(root, payloads[3])
    os.truncate(victim, 100)
    r = invoke("fsck", "--config", str(cfg), "--json")
    assert r.exit_code == 1, r.output
    (rep,) = json.loads(r.output)
    assert rep["removed_at_open"] == 1 and rep["checked"] == 5 and not rep["clean"], rep
    r = invoke("fsck", "--config", str(cfg))  # (gone now: the next run finds nothing to say)
    assert r.exit_code == 0 and "kv: 5 chunks checked, 5 good, 0 bad: clean" in r.output, r.output


def test_fsck_says_how_many_temporaries_of_dead_writers_the_fs_tier_removed_as_it_opened(tmp_path: Path) -> None:
    """They went without a word ("clean", and ``removed_at_open`` 0) though docs/cli.md says fsck
    changes nothing else it finds. No chunk was lost: the tier stays clean."""
    import socket

    root = tmp_path / "kv"
    root.mkdir()
    config = _tier_config("fs", root)
    asyncio.run(_fill(config, 3))
    chunk = next(p for p in root.rglob("*") if p.is_file() and len(p.relative_to(root).parts) == 3)  # layout/shard/
    temp = chunk.parent / f".tmp~{socket.gethostname()}~{2**22 + 7}~1abcd~0"  # a pid above pid_max: dead
    temp.write_bytes(b"x" * 100)
    r = invoke("fsck", "--config", str(_fsck_config(tmp_path, config)), "--json")
    (rep,) = json.loads(r.output)
    assert rep["temporaries_removed_at_open"] == 1 and rep["clean"] and not temp.exists(), rep
    r = invoke("fsck", "--config", str(_fsck_config(tmp_path, config)))
    assert "temporary file" not in r.output, r.output  # (gone: nothing to say the second time)


def _fsck_config(tmp_path: Path, config: dict[str, Any]) -> Path:
    cfg = tmp_path / "tier.toml"
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in config.items())
    cfg.write_text(f'[spec]\nchunk_bytes = "64K"\nnamespace = "{NAMESPACE}"\n\n[tiers.kv]\n{body}\n')
    return cfg


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("damage", ["superblock", "truncated", "checkpoint", "index-gone"])
def test_fsck_reports_a_damaged_nvme_slab_and_changes_nothing(tmp_path: Path, damage: str) -> None:
    """An open that may repair formats a slab whose superblock fails its checksum afresh,
    grows a truncated one back, and starts a new index over a lost one: fsck did that unasked,
    then said "clean", exit 0, and the chunks were gone for good. It opens with create=False
    now: the damage is said, exit 1, and every byte is left as it was (--remove too)."""
    root = tmp_path / "kv"
    root.mkdir()
    config = _tier_config("nvme", root)
    asyncio.run(_fill(config, 6))
    slab = root / "kv.slab"
    if damage == "superblock":
        with open(slab, "r+b") as f:
            f.seek(40)
            f.write(b"\xff" * 8)
    elif damage == "truncated":
        os.truncate(slab, 100_000)
    elif damage == "checkpoint":
        with open(root / "kv.slab.atidx.ckpt", "r+b") as f:
            f.seek(60)
            f.write(os.urandom(100))
    else:
        for p in root.glob("kv.slab.atidx.*"):
            p.unlink()
    cfg = _fsck_config(tmp_path, config)
    before = _snapshot(root)
    for extra in ((), ("--remove",)):
        r = invoke("fsck", "--config", str(cfg), *extra)
        assert r.exit_code == 1, r.output
        assert "NOT CLEAN, damaged (left as it is)" in r.output, r.output
        assert _snapshot(root) == before


def test_fsck_never_formats_over_a_slab_even_if_the_config_says_reformat(tmp_path: Path) -> None:
    """reformat=true in the tier file and a mistaken --chunk-bytes: fsck formatted the slab
    (its chunks lost) and said "clean"."""
    root = tmp_path / "kv"
    root.mkdir()
    config = _tier_config("nvme", root)
    asyncio.run(_fill(config, 6))
    cfg = _fsck_config(tmp_path, {**config, "reformat": True})
    before = _snapshot(root)
    r = invoke("fsck", "--config", str(cfg), "--chunk-bytes", "128K")
    assert r.exit_code == 2 and "another layout" in r.output, r.output
    assert _snapshot(root) == before
    r = invoke("fsck", "--config", str(cfg))
    assert r.exit_code == 0 and "kv: 6 chunks checked, 6 good, 0 bad" in r.output, r.output


def test_fsck_evicts_nothing_when_the_config_holds_less_than_is_stored(tmp_path: Path) -> None:
    """An fs tier file whose capacity_bytes is below what is stored: the tier's open evicted
    down to it, and fsck reported the two chunks left as clean."""
    root = tmp_path / "kv"
    root.mkdir()
    config = _tier_config("fs", root)
    asyncio.run(_fill(config, 6))
    before = _snapshot(root)
    r = invoke("fsck", "--config", str(_fsck_config(tmp_path, {**config, "capacity_bytes": 3 * CHUNK})))
    assert r.exit_code == 0 and "kv: 6 chunks checked, 6 good, 0 bad" in r.output, r.output
    assert _snapshot(root).keys() == before.keys()


def test_fsck_of_an_nvme_slab_of_another_capacity_says_what_to_give_not_to_reformat(tmp_path: Path) -> None:
    """An nvme tier file whose capacity_bytes was not the slab's was refused with the tier's own
    hint, "pass reformat=True" (fsck ignores it, and formatting loses the chunks); and the run
    ended there, the tiers checked before it unreported (their removals included)."""
    fs_root, nv_root = tmp_path / "fs", tmp_path / "nv"
    fs_root.mkdir()
    nv_root.mkdir()
    fs_cfg, nv_cfg = _tier_config("fs", fs_root), _tier_config("nvme", nv_root)  # an 8 MiB slab
    payloads = asyncio.run(_fill(fs_cfg, 3))
    asyncio.run(_fill(nv_cfg, 4))
    victim = _corrupt_on_medium(fs_root, payloads[1])
    before = _snapshot(nv_root)
    spec = f'[spec]\nchunk_bytes = "64K"\nnamespace = "{NAMESPACE}"\n\n'
    nv = f'[tiers.b]\ntype = "nvme"\npath = "{nv_cfg["path"]}"\ncapacity_bytes = {16 << 20}\n'
    cfg = tmp_path / "two.toml"
    cfg.write_text(f'{spec}[tiers.a]\ntype = "fs"\nroot = "{fs_root}"\n\n{nv}')
    r = CliRunner().invoke(main, ["fsck", "--config", str(cfg), "--remove"])
    assert r.exit_code == 2 and "a: 3 chunks checked, 2 good, 1 bad, 1 removed: clean" in r.output, r.output
    assert "b: cannot check: " in r.output and "fsck never formats: give the chunk_bytes" in r.output
    assert "reformat=True" not in r.output and "or another path" in r.output, r.output  # (the tier's own advice goes)
    assert not victim.exists() and _snapshot(nv_root) == before
    without = {k: v for k, v in nv_cfg.items() if k != "capacity_bytes"}
    r = invoke("fsck", "--config", str(_fsck_config(tmp_path, without)))
    assert r.exit_code == 0 and "kv: 4 chunks checked, 4 good, 0 bad: clean" in r.output, r.output


def test_fsck_checks_two_tables_that_name_one_slab(tmp_path: Path) -> None:
    """A slab named by a table of its own and by a chain's member is checked twice, one after
    the other (opening every tier first had the second refused: the slab was in use)."""
    root = tmp_path / "nv"
    root.mkdir()
    nv = _tier_config("nvme", root)
    asyncio.run(_fill(nv, 2))
    spec = f'[spec]\nchunk_bytes = "64K"\nnamespace = "{NAMESPACE}"\n\n'
    slab = f'path = "{nv["path"]}", capacity_bytes = {nv["capacity_bytes"]}'
    table = f'[tiers.a]\ntype = "nvme"\n{slab.replace(", ", chr(10))}\n\n'
    chain = f'[tiers.kv]\ntype = "chain"\ntiers = [{{type = "memory"}}, {{type = "nvme", {slab}}}]\n'
    cfg = tmp_path / "both.toml"
    cfg.write_text(spec + table + chain)
    r = invoke("fsck", "--config", str(cfg))
    assert r.exit_code == 0 and "a: 2 chunks checked" in r.output and "kv.tiers[1] (nvme): 2 chunks checked" in r.output


def test_fsck_needs_the_layout(tmp_path: Path) -> None:
    cfg = tmp_path / "tier.toml"
    cfg.write_text('[tiers.kv]\ntype = "memory"\n')
    r = CliRunner().invoke(main, ["fsck", "--config", str(cfg)])
    assert r.exit_code == 2
    assert "chunk_bytes" in r.output


def test_fsck_skips_a_memory_tier_saying_why(tmp_path: Path) -> None:
    cfg = tmp_path / "tier.toml"
    cfg.write_text('type = "memory"\n[spec]\nchunk_bytes = 4096\n')
    r = invoke("fsck", "--config", str(cfg))
    assert r.exit_code == 0, r.output
    assert "not checked: it holds nothing across processes" in r.output
    assert "no chunks stored" not in r.output
    cfg.write_text('type = "memory"\nbogus = 1\n[spec]\nchunk_bytes = 4096\n')  # skipped, still checked
    r = invoke("fsck", "--config", str(cfg))
    assert r.exit_code == 2 and "unknown parameter 'bogus'" in r.output, r.output


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
    assert r.exit_code == 2 and "is not a directory: no tier there" in r.output, r.output


def test_fsck_skips_an_obj_tier_on_memory_urls(tmp_path: Path) -> None:
    """obj on ``memory://`` holds nothing across processes, though its class can: it was
    opened empty and reported clean (its ``persistent`` is per instance)."""
    pytest.importorskip("obstore")
    cfg = tmp_path / "tier.toml"
    cfg.write_text('[spec]\nchunk_bytes = "64K"\n\n[tiers.kv]\ntype = "obj"\nurl = "memory://"\n')
    r = invoke("fsck", "--config", str(cfg))
    assert r.exit_code == 0 and f"kv: {_SKIPPED}" in r.output, r.output


# a chain with every key the chain keeps for itself (write, backlog_chunks; an entry's name, admit,
# deadline_s, breaker): fs refuses an unknown parameter, so one passed on to it fails the check
_CHAIN_OF_FS = {
    "type": "chain",
    "write": "back",
    "backlog_chunks": 64,
    "tiers": [
        {"type": "memory"},
        {"type": "fs", "name": "disk", "admit": "all", "deadline_s": 5.0, "breaker": {"threshold": 3}},
    ],
}
_CHAIN_TOML = """[spec]
chunk_bytes = "64K"
namespace = "{ns}"

[tiers.kv]
type = "chain"
write = "back"
backlog_chunks = 64
[[tiers.kv.tiers]]
{first}
[[tiers.kv.tiers]]
{second}
"""
_DISK_TOML = 'type = "fs"\nroot = "{root}"\nname = "disk"\nadmit = "all"\ndeadline_s = 5.0\nbreaker = {{threshold = 3}}'
_SKIPPED = "not checked: it holds nothing across processes"


def test_fsck_checks_a_chain_member_by_member_and_skips_its_memory_tier(tmp_path: Path) -> None:
    root = tmp_path / "disk"
    root.mkdir()
    config = {**_CHAIN_OF_FS, "tiers": [_CHAIN_OF_FS["tiers"][0], {**_CHAIN_OF_FS["tiers"][1], "root": str(root)}]}
    payloads = asyncio.run(_fill(config, 6))  # write-back: the chain's aclose() writes what is queued to fs
    cfg = tmp_path / "tier.toml"
    cfg.write_text(_CHAIN_TOML.format(ns=NAMESPACE, first='type = "memory"', second=_DISK_TOML.format(root=root)))

    r = invoke("fsck", "--config", str(cfg))
    assert r.exit_code == 0, r.output
    assert f"kv.tiers[0] (memory): {_SKIPPED}" in r.output
    assert "kv.tiers[1] (disk): 6 chunks checked, 6 good, 0 bad: clean" in r.output

    victim = _corrupt_on_medium(root, payloads[2])
    r = invoke("fsck", "--config", str(cfg), "--tier", "kv", "--json")
    assert r.exit_code == 1, r.output
    mem, disk = json.loads(r.output)
    assert mem["tier"] == "kv.tiers[0]" and mem["member"] == "memory" and mem["clean"] and mem["checked"] == 0
    assert "holds nothing across processes" in mem["skipped"]
    assert (disk["tier"], disk["member"], disk["skipped"], disk["checked"]) == ("kv.tiers[1]", "disk", None, 6)
    assert list(disk["bad"]) == [b"fsck-2".hex()] and not disk["clean"]
    assert victim.exists(), "fsck without --remove must not delete anything"

    r = invoke("fsck", "--config", str(cfg), "--remove")
    assert r.exit_code == 0, r.output
    assert "kv.tiers[1] (disk): 6 chunks checked, 5 good, 1 bad, 1 removed: clean" in r.output
    assert not victim.exists()
    r = invoke("fsck", "--config", str(cfg), "--tier", "kv.tiers[1]")  # --tier names a [tiers.NAME] table
    assert r.exit_code == 2 and "no [tiers.kv.tiers[1]]" in r.output and "it has: kv" in r.output, r.output


def test_fsck_reports_every_tier_when_one_cannot_be_checked(tmp_path: Path) -> None:
    """A tier whose medium could not be listed (a server down) ended the run: the reports of
    the tiers checked before it were dropped, chunks removed with --remove included."""
    pytest.importorskip("valkey")
    root = tmp_path / "kv"
    root.mkdir()
    config = _tier_config("fs", root)
    payloads = asyncio.run(_fill(config, 3))
    _corrupt_on_medium(root, payloads[1])
    cfg = tmp_path / "two.toml"
    body = "\n".join(f"{k} = {json.dumps(v)}" for k, v in config.items() if k != "type")
    down = '[tiers.b]\ntype = "valkey"\nurl = "redis://127.0.0.1:1"\ntimeout_s = 1\nmax_retries = 0\n'
    spec = f'[spec]\nchunk_bytes = "64K"\nnamespace = "{NAMESPACE}"\n\n'
    cfg.write_text(f'{spec}[tiers.a]\ntype = "fs"\n{body}\n\n{down}')
    r = invoke("fsck", "--config", str(cfg), "--remove", "--json")
    assert r.exit_code == 4, r.output
    a, b = json.loads(r.output)
    assert a["tier"] == "a" and a["removed"] == 1 and a["clean"], a
    assert b["tier"] == "b" and "unreachable" in b["cannot_check"] and not b["clean"], b
    r = invoke("fsck", "--config", str(cfg))
    assert r.exit_code == 4 and "a: 2 chunks checked, 2 good, 0 bad: clean" in r.output, r.output
    assert "b: cannot check: listing the tier's keys" in r.output, r.output


def test_fsck_checks_a_chain_inside_a_chain(tmp_path: Path) -> None:
    root = tmp_path / "disk"
    root.mkdir()
    inner = {"type": "chain", "tiers": [{"type": "memory", "name": "near"}, {"type": "fs", "root": str(root)}]}
    payloads = asyncio.run(_fill({"type": "chain", "tiers": [{"type": "memory"}, inner]}, 4))
    _corrupt_on_medium(root, payloads[1])
    cfg = tmp_path / "tier.toml"
    second = f'type = "chain"\ntiers = [{{type = "memory", name = "near"}}, {{type = "fs", root = "{root}"}}]'
    cfg.write_text(_CHAIN_TOML.format(ns=NAMESPACE, first='type = "memory"', second=second))

    r = invoke("fsck", "--config", str(cfg))
    assert r.exit_code == 1, r.output
    assert f"kv.tiers[0] (memory): {_SKIPPED}" in r.output
    assert f"kv.tiers[1].tiers[0] (near): {_SKIPPED}" in r.output
    assert "kv.tiers[1].tiers[1] (fs): 4 chunks checked, 3 good, 1 bad: NOT CLEAN" in r.output
    assert f"bad {b'fsck-1'.hex()}" in r.output
    r = invoke("fsck", "--config", str(cfg), "--remove", "--json")
    assert r.exit_code == 0, r.output
    assert [(x["tier"], x["removed"]) for x in json.loads(r.output)] == [
        ("kv.tiers[0]", 0),
        ("kv.tiers[1].tiers[0]", 0),
        ("kv.tiers[1].tiers[1]", 1),
    ]


_OPAQUE_TIER = """
from asynctier import SecondaryTierManager


class OpaqueTier(SecondaryTierManager):  # never built: fsck refuses it from its class
    pass
"""


def test_fsck_refuses_a_chain_member_that_is_not_a_chunk_tier_before_checking_any(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # --path adds to it
    (tmp_path / "cli_opaque_tier.py").write_text(_OPAQUE_TIER)
    root = tmp_path / "disk"
    root.mkdir()
    payloads = asyncio.run(_fill({"type": "fs", "root": str(root)}, 2))
    victim = _corrupt_on_medium(root, payloads[0])
    cfg = tmp_path / "tier.toml"
    second = 'type = "OpaqueTier"\nmodule_path = "cli_opaque_tier"'
    cfg.write_text(_CHAIN_TOML.format(ns=NAMESPACE, first=f'type = "fs"\nroot = "{root}"', second=second))
    try:
        r = invoke("fsck", "--config", str(cfg), "--remove", "--path", str(tmp_path))
    finally:
        sys.modules.pop("cli_opaque_tier", None)
    assert r.exit_code == 2, r.output
    assert "tier 'kv.tiers[1]' (cli_opaque_tier.OpaqueTier) cannot be checked: fsck needs a ChunkTier" in r.output
    assert victim.exists(), "no member is checked (or has chunks removed) before every member is known checkable"


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


# -- the first hour: plan and progress ------------------------------------------------------------

QUICK = ["--chunk-sizes", "64K", "--depths", "1", "--data-size", "256K", "--no-fio"]


def test_bench_shows_the_plan_and_a_progress_bar_and_q_turns_both_off(tmp_path: Path) -> None:
    args = ["bench", "--tier", "memory", "--root", str(tmp_path / "r"), *QUICK]
    # rich draws its bar only on a terminal: these variables make the runner's stderr count as one
    tty = {"TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "120"}
    r = CliRunner().invoke(main, args, env=tty, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    plan = r.stderr
    assert "plan: 1 tier (memory) x 1 chunk size (64 KiB) x 1 depth (1) = 1 points" in plan
    assert "references at each chunk size and depth: the naive loop" in plan
    # 4 chunks and 4 one-chunk probes, each offloaded and loaded, and the naive loop's 256 KiB both ways
    assert "moves 1.5 MiB" in plan and "rough estimate" in plan
    assert "ETA" in plan and "memory 64 KiB depth 1" in plan  # the bar, with the phase running
    r = CliRunner().invoke(main, [*args, "-q"], env=tty, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert r.stderr == "" and "1/1 points ok" in r.stdout


def test_the_bar_counts_exactly_the_bytes_the_plan_announced(tmp_path: Path) -> None:
    from asynctier.cli.bench.plan import BenchOptions
    from asynctier.cli.bench.runner import make_plan, run_bench

    class Recorder:
        def __init__(self) -> None:
            self.done = 0
            self.phases: list[str] = []

        def phase(self, description: str) -> None:
            self.phases.append(description)

        def advance(self, nbytes: int) -> None:
            assert nbytes >= 0
            self.done += nbytes

    cfg = tmp_path / "tiers.toml"  # one tier that works and one whose every point fails
    cfg.write_text('[tiers.mem]\ntype = "memory"\n\n[tiers.broken]\ntype = "ForgetfulTier"\nmodule_path = "test_cli"\n')
    from asynctier.cli.tierfile import load_tier_file

    opts = BenchOptions(
        tiers=load_tier_file(cfg).tiers, chunk_sizes=[64 << 10], depths=[1, 2], data_bytes=256 << 10,
        root=str(tmp_path), fio=False, repeat=2,
    )  # fmt: skip
    plan = make_plan(opts)
    rec = Recorder()
    report = asyncio.run(run_bench(opts, rec, plan))
    assert {p.tier: p.ok for p in report.points} == {"mem": True, "broken": False}
    assert rec.done == plan.total_bytes > 0
    assert "mem 64 KiB depth 2: load" in rec.phases


# -- the first hour: checks before any byte moves -----------------------------------------------


def _nothing_ran(root: Path) -> bool:
    return not root.exists()  # checks come before the root is made


def test_bench_checks_named_tiers_before_fio_or_the_naive_loop_run(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for tiers, needle in (
        (["--tier", "bogus"], "Unknown secondary tier type: 'bogus'"),
        (["--tier", "memory", "--tier", "bogus"], "'bogus'"),
    ):
        r = CliRunner().invoke(main, ["bench", *tiers, "--root", str(root), "--json", str(tmp_path / "o.json")])
        assert r.exit_code == 2 and needle in r.output and "--tier" in r.output, r.output
        assert "Traceback" not in r.output and _nothing_ran(root) and not (tmp_path / "o.json").exists()
    cfg = tmp_path / "tiers.toml"
    cfg.write_text('[tiers.kv]\ntype = "memory"\nno_such_knob = 1\n')
    r = CliRunner().invoke(main, ["bench", "--config", str(cfg), "--root", str(root), *QUICK])
    assert r.exit_code == 2 and "no_such_knob" in r.output and "accepted:" in r.output, r.output
    assert _nothing_ran(root)


def test_bench_checks_every_output_before_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    base = ["bench", "--tier", "memory", "--root", str(root), *QUICK]
    (tmp_path / "adir").mkdir()
    for flag, target, needle in (
        ("--json", tmp_path / "nodir" / "o.json", "not a writable directory"),
        ("--markdown", tmp_path / "nodir" / "o.md", "not a writable directory"),
        ("--json", tmp_path / "adir", "is a directory"),
    ):
        r = CliRunner().invoke(main, [*base, flag, str(target)])
        assert r.exit_code == 2 and needle in r.output and flag in r.output, r.output
        assert _nothing_ran(root)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as on an install without the bench extra
    r = CliRunner().invoke(main, [*base, "--plot", str(tmp_path / "o.png")])
    assert r.exit_code == 2 and "asynctier[bench]" in r.output and "--plot" in r.output, r.output
    assert _nothing_ran(root)


@pytest.mark.parametrize("where", ["/proc", "/sys"])
def test_a_root_that_takes_no_files_is_one_line_and_exit_2(tmp_path: Path, where: str) -> None:
    if not os.path.isdir(where):
        pytest.skip(f"no {where} here")
    r = CliRunner().invoke(main, ["bench", "--tier", "fs", "--root", where, *QUICK, "-q"])
    assert r.exit_code == 2 and (r.exception is None or isinstance(r.exception, SystemExit)), r.output
    assert "Traceback" not in r.output and f"cannot create files in '{where}'" in r.output, r.output
    errors = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, r.output


def test_bench_creates_a_missing_root_only_when_its_parent_exists(tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b" / "root"
    r = CliRunner().invoke(main, ["bench", "--tier", "memory", "--root", str(deep), *QUICK, "-q"])
    assert r.exit_code == 2 and "neither does its parent" in r.output, r.output
    assert not (tmp_path / "a").exists()
    r = invoke("bench", "--tier", "memory", "--root", str(tmp_path / "new"), *QUICK, "-q")
    assert r.exit_code == 0 and (tmp_path / "new").is_dir(), r.output


# -- the first hour: tables that fit the terminal -----------------------------------------------


def test_tables_fit_the_width_and_keep_the_tier_name(tmp_path: Path) -> None:
    cfg = tmp_path / "tiers.toml"
    cfg.write_text('[tiers.kv-memory-tier]\ntype = "memory"\n')
    args = ["bench", "--config", str(cfg), "--root", str(tmp_path / "r"), "--chunk-sizes", "64K", "--depths", "1,4"]
    args += ["--data-size", "512K", "--fio-engines", "psync", "-q"]
    headers = {}
    for width in (80, 100, 200):
        r = CliRunner().invoke(main, args, env={"COLUMNS": str(width)}, catch_exceptions=False)
        assert r.exit_code == 0, r.output
        lines = r.stdout.splitlines()
        too_wide = [line for line in lines if len(line) > width]
        assert not too_wide, f"{width} columns: {too_wide}"
        rows = [line for line in lines if "kv-memory-tier" in line]
        assert len(rows) >= 3, r.stdout  # two points and the summary, the name whole
        headers[width] = r.stdout
    assert "lookups/s" in headers[200] and "offload p50 / p99 ms" in headers[200]  # every column when wide
    assert "lookups" not in headers[80]  # fewer columns when narrow


# -- the first hour: sizes, roots and module paths ----------------------------------------------


def test_sizes_are_accepted_wherever_a_size_goes(tmp_path: Path) -> None:
    from asynctier.cli.tierfile import normalize_config

    typed = {"capacity_bytes": "64MiB", "part_size": "8M", "coalesce_bytes": "0", "label_bytes": "abc"}
    got = normalize_config("--param", {**typed, "root": "128M", "nested": {"capacity_bytes": "1K"}})
    assert got == {
        **{"capacity_bytes": 64 << 20, "part_size": 8 << 20, "coalesce_bytes": 0, "label_bytes": "abc"},
        **{"root": "128M", "nested": {"capacity_bytes": 1024}},  # a size only under a size's name
    }
    r = invoke(
        "selfcheck", "--tier", "memory", "--chunks", "4", "--chunk-bytes", "4K", "--param", "capacity_bytes=64MiB"
    )
    assert r.exit_code == 0 and "4 x 4096 B" in r.output, r.output
    cfg = tmp_path / "tiers.toml"
    cfg.write_text('[bench]\ndata_size = "256K"\n\n[tiers.kv]\ntype = "memory"\ncapacity_bytes = "64MiB"\n')
    r = invoke("bench", "--config", str(cfg), "--root", str(tmp_path / "r"), "--chunk-sizes", "64K", "--depths",
               "1", "--no-fio", "--no-naive", "-q", "--json", str(tmp_path / "o.json"))  # fmt: skip
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "o.json").read_text())["tiers"]["kv"]["config"]["capacity_bytes"] == 64 << 20


def test_selfcheck_creates_a_missing_root_only_when_its_parent_exists(tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b" / "c"
    r = CliRunner().invoke(main, ["selfcheck", "--tier", "fs", "--chunks", "2", "--param", f"root={deep}"])
    assert r.exit_code == 2 and "neither does its parent" in r.output, r.output
    assert not (tmp_path / "a").exists()
    r = invoke("selfcheck", "--tier", "fs", "--chunks", "2", "--param", f"root={tmp_path / 'new'}")
    assert r.exit_code == 0 and (tmp_path / "new").is_dir(), r.output
    assert "created only when its parent directory exists" in " ".join(invoke("selfcheck", "--help").output.split())
    assert "fsck never creates anything" in " ".join(invoke("fsck", "--help").output.split())


def test_a_chain_members_missing_root_is_not_built_either(tmp_path: Path) -> None:
    """Only the top-level config was checked: a chain member's mistyped root was made with all
    its parents by selfcheck and bench."""
    deep = tmp_path / "nope" / "deep"
    tiers = json.dumps([{"type": "memory"}, {"type": "fs", "root": str(deep)}])
    r = CliRunner().invoke(main, ["selfcheck", "--tier", "chain", "--chunks", "2", "--param", f"tiers={tiers}"])
    assert r.exit_code == 2 and "neither does its parent" in r.output, r.output
    cfg = tmp_path / "deep.toml"
    cfg.write_text(f'[tiers.kv]\ntype = "chain"\ntiers = [{{type = "memory"}}, {{type = "fs", root = "{deep}"}}]\n')
    r = CliRunner().invoke(main, ["bench", "--config", str(cfg), "--tier", "kv", *QUICK, "-q"])
    assert r.exit_code == 2 and "neither does its parent" in r.output, r.output
    assert not (tmp_path / "nope").exists()


def test_tier_file_values_are_refused_not_read_another_way(tmp_path: Path) -> None:
    """A fractional byte count was truncated (``4096.9`` to 4096, ``"1.9"`` to 1), a namespace
    that is not a string was made one (so fsck looked for another layout), and a top-level tier
    silently replaced a [tiers.NAME] table of its name."""
    from asynctier.cli.sizes import parse_size
    from asynctier.cli.tierfile import load_tier_file, normalize_config, spec_from_table

    assert parse_size("1.5K") == 1536 and parse_size("4096") == 4096
    for bad in ("1.9", "0.3K", 4096.9, 4096.0):
        with pytest.raises(ValueError, match=r"whole number of bytes|an int or a string"):
            parse_size(bad)  # type: ignore[arg-type]
    with pytest.raises(TierConfigError, match=r"\[spec\] chunk_bytes: .*got float 4096.9"):
        spec_from_table({"chunk_bytes": 4096.9})
    with pytest.raises(TierConfigError, match=r"namespace must be a string; got bool True"):
        spec_from_table({"chunk_bytes": 4096, "namespace": True})
    with pytest.raises(TierConfigError, match=r"--param capacity_bytes: '1.9' is not a whole number"):
        normalize_config("--param", {"type": "memory", "capacity_bytes": "1.9"})
    r = CliRunner().invoke(main, ["selfcheck", "--tier", "memory", "--chunks", "2", "--chunk-bytes", "1.9"])
    assert r.exit_code == 2 and "not a whole number of bytes" in r.output, r.output
    both = tmp_path / "both.toml"
    both.write_text(f'type = "fs"\nroot = "{tmp_path}/a"\n\n[tiers.fs]\nroot = "{tmp_path}/b"\n')
    with pytest.raises(TierConfigError, match=r"a top-level tier \(type = 'fs'\) and \[tiers.NAME\] tables"):
        load_tier_file(both)


def test_a_chain_members_secrets_are_hidden_in_what_bench_stores() -> None:
    from asynctier.cli.tierfile import redact

    got = redact({"type": "chain", "tiers": [
        {"type": "valkey", "url": "redis://:hunter2secret@127.0.0.1:1"},
        {"type": "obj", "url": "s3://b/p", "credentials": {"secret_access_key": "s3cr3t-value"}},
    ]})  # fmt: skip
    assert "hunter2secret" not in json.dumps(got) and "s3cr3t-value" not in json.dumps(got), got
    assert got["tiers"][0]["url"] == "redis://***@127.0.0.1:1"
    headers = {"Authorization": "Bearer sk-live-1", "x-api-key": "k-2", "Cookie": "c-3", "accept": "text/xml"}
    cfg = {"config": {"account_key": "a-4", "service_account_key": "s-5", "account_name": "acct",
                      "sse_customer_key_base64": "k-6"},
           "client_options": {"default_headers": headers}, "key_prefix": "kv:"}  # fmt: skip
    shown = json.dumps(redact(cfg))
    assert not any(s in shown for s in ("sk-live-1", "k-2", "c-3", "a-4", "s-5", "k-6")), shown
    assert all(s in shown for s in ("text/xml", "acct", "kv:")), shown  # (names, not secrets)


def test_selfcheck_primary_buffer_is_page_aligned_so_fs_does_not_warn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from asynctier.cli.selfcheck import primary_buffer
    from asynctier.posix_io import buffer_address

    assert buffer_address(primary_buffer(3 * 4096 + 100)) % 4096 == 0
    with caplog.at_level("WARNING"):
        r = invoke("selfcheck", "--tier", "fs", "--chunks", "4", "--chunk-bytes", "64K", "--param", f"root={tmp_path}")
    assert r.exit_code == 0, r.output
    assert not [rec for rec in caplog.records if "aligned" in rec.getMessage()], caplog.text


_DICT_TIER = """
from asynctier import BlockingChunkTier, ChunkNotFoundError


class DictTier(BlockingChunkTier):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.chunks = {}

    def write_chunk(self, key, data):
        self.chunks[key] = bytes(data)

    def read_chunk(self, key, out):
        if key not in self.chunks:
            raise ChunkNotFoundError("not stored", key)
        out[:] = self.chunks[key]

    def chunk_exists(self, key):
        return key in self.chunks

    def delete_chunk(self, key):
        return self.chunks.pop(key, None) is not None
"""


def test_module_path_is_a_module_name_found_only_where_the_user_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # --path adds to it
    (tmp_path / "cli_dict_tier.py").write_text(_DICT_TIER)
    base = ["selfcheck", "--tier", "DictTier", "--chunks", "2", "--chunk-bytes", "4K"]
    for mp in ("./cli_dict_tier.py", "cli_dict_tier.py", str(tmp_path / "cli_dict_tier")):
        r = CliRunner().invoke(main, [*base, "--param", f"module_path={mp}"])
        assert r.exit_code == 2 and "looks like a file path" in r.output and "--path" in r.output, r.output
    cfg = tmp_path / "tiers.toml"
    cfg.write_text('[spec]\nchunk_bytes = 4096\n\n[tiers.kv]\ntype = "DictTier"\nmodule_path = "cli_dict_tier.py"\n')
    r = CliRunner().invoke(main, ["fsck", "--config", str(cfg)])
    assert r.exit_code == 2 and "looks like a file path" in r.output, r.output

    # the current directory is not searched unless named, run as `python -m asynctier.cli` too
    cmd = [sys.executable, "-m", "asynctier.cli", *base, "--param", "module_path=cli_dict_tier"]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "cannot import module 'cli_dict_tier'" in out.stderr, out.stderr
    out = subprocess.run([*cmd, "--path", "."], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "selfcheck ok: 2 x 4096 B through 'DictTier'" in out.stdout, out.stderr
    try:
        r = invoke(*base, "--param", "module_path=cli_dict_tier", "--path", str(tmp_path))
        assert r.exit_code == 0, r.output
    finally:
        sys.modules.pop("cli_dict_tier", None)


# -- the first hour: exit codes -----------------------------------------------------------------


def test_exit_codes_are_documented_and_distinct(tmp_path: Path) -> None:
    help_text = invoke("bench", "--help").output
    for line in ("0  every byte verified", "1  data did not verify", "2  usage or configuration error",
                 "3  data verified, but an output file could not be written", "4  could not run"):  # fmt: skip
        assert line in help_text, help_text
    assert "Exit status:" in invoke("--help").output
    # 3: the run verified, one output could not be written (a full device), the others were
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    md = tmp_path / "o.md"
    r = CliRunner().invoke(main, ["bench", "--tier", "memory", "--root", str(tmp_path / "r"), *QUICK, "-q",
                                  "--json", "/dev/full", "--markdown", str(md)])  # fmt: skip
    assert r.exit_code == 3, r.output
    assert "could not write --json /dev/full" in r.output and md.read_text().startswith("Run ")
    # 4: no tier could run (the only one of the file cannot be imported)
    cfg = tmp_path / "tiers.toml"
    cfg.write_text('[tiers.ghost]\ntype = "GhostTier"\nmodule_path = "no_such_module_anywhere"\n')
    r = CliRunner().invoke(main, ["bench", "--config", str(cfg), "--root", str(tmp_path / "r"), *QUICK, "-q"])
    assert r.exit_code == 4 and "no tier ran" in r.output, r.output


def test_import_asynctier_does_not_import_the_command_line() -> None:
    code = "import asynctier, sys; print([m for m in sys.modules if m.startswith(('asynctier.cli', 'rich', 'click'))])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


# -- chains: a tier of tiers from --tier chain and from a tier file --------------------------------


CHAIN_TOML = """
[tiers.kv]
type = "chain"
write = "through"

[[tiers.kv.tiers]]
type = "memory"
capacity_bytes = "{capacity}"

[[tiers.kv.tiers]]
type = "fs"
root = "{dir}/disk"
capacity_bytes = "64MiB"
"""


def test_chain_configs_get_sizes_placeholders_and_defaults_at_every_level(tmp_path: Path) -> None:
    from asynctier.cli.tierfile import load_tier_file, nested_configs, resolve_tiers, substitute, uses_placeholders

    default = resolve_tiers(["chain"], None)["chain"]
    assert default["type"] == "chain" and [t["type"] for t in default["tiers"]] == ["memory", "fs"]
    assert uses_placeholders(default)
    cfg = substitute(default, {"dir": tmp_path, "capacity": 1234})
    assert cfg["tiers"][0]["capacity_bytes"] == 1234 and cfg["tiers"][1]["root"] == f"{tmp_path}/fs"
    cfg["tiers"][0]["capacity_bytes"] = 1
    default["tiers"].append({"type": "obj"})  # a run's copy: the next --tier chain starts afresh
    assert resolve_tiers(["chain"], None)["chain"] == {
        "type": "chain",
        "tiers": [{"type": "memory", "capacity_bytes": "{capacity}"}, {"type": "fs", "root": "{dir}/fs"}],
    }
    toml = tmp_path / "chain.toml"
    toml.write_text(CHAIN_TOML)
    kv = load_tier_file(toml).tiers["kv"]
    assert [c["type"] for c in nested_configs(kv)] == ["chain", "memory", "fs"]
    assert kv["write"] == "through" and kv["tiers"][1]["capacity_bytes"] == 64 << 20  # a size, read as one
    cfg = substitute(kv, {"dir": tmp_path, "capacity": 99})
    assert cfg["tiers"] == [
        {"type": "memory", "capacity_bytes": 99},
        {"type": "fs", "root": f"{tmp_path}/disk", "capacity_bytes": 64 << 20},
    ]


def test_bench_runs_a_chain_by_type_and_from_a_tier_file(tmp_path: Path) -> None:
    toml = tmp_path / "chain.toml"
    toml.write_text(
        CHAIN_TOML + '\n[tiers.half]\ntype = "chain"\ntiers = [{type = "memory"}, '
        '{type = "GhostTier", module_path = "no_such_module_anywhere"}]\n'
    )
    out = tmp_path / "bench.json"
    # on a tmpfs the wait for a quiet device before each point is only a flush (a shared disk may keep it 15 s)
    shm = Path("/dev/shm")
    root_parent = shm if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path
    for extra in (["--tier", "chain"], ["--config", str(toml)]):
        with tempfile.TemporaryDirectory(dir=root_parent) as root:
            args = ["bench", "-q", "--root", root, *QUICK, "--no-naive", "--depths", "1,2", "--json", str(out)]
            r = invoke(*args, *extra)
        assert r.exit_code == 0, r.output
        report = json.loads(out.read_text())
        points = report["points"]
        assert [(p["tier"], p["tier_type"], p["depth"]) for p in points] == [
            (points[0]["tier"], "chain", 1),
            (points[0]["tier"], "chain", 2),
        ]
        assert all(p["ok"] and p["verified_bytes"] == (4 + 4) * 64 * 1024 for p in points), points
    # a chain one of whose tiers cannot be imported is skipped, saying which and why
    assert report["tiers"]["half"]["status"] == "skipped"
    assert "no_such_module_anywhere" in report["tiers"]["half"]["reason"]
    assert report["tiers"]["kv"]["config"]["tiers"][1]["root"] == "{dir}/disk"


# -- ends every command shares: a closed stdout, Ctrl-C ----------------------------------------------
def _cli(shell: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("asynctier")
    return subprocess.run(
        ["bash", "-c", f"set -o pipefail; {shell.replace('{at}', str(exe))}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip


def test_a_reader_that_closes_stdout_early_ends_with_3_quietly(tmp_path: Path) -> None:
    """``asynctier info | true`` exited 1 (which says the data did not verify) through rich's
    or click's own handling; now 3 (an output could not be written), no traceback."""
    r = _cli("{at} info | true", tmp_path)
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr


def test_bench_writes_its_files_before_a_closed_stdout_can_stop_it(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    r = _cli("{at} bench -q --no-fio --no-naive --tier memory --chunk-sizes 64K --depths 1 "
             f"--data-size 256K --json {out} | true", tmp_path)  # fmt: skip
    assert r.returncode == 3, (r.returncode, r.stderr)
    assert json.loads(out.read_text())["points"], "the --json file was not written"


def test_ctrl_c_ends_a_command_with_130(monkeypatch: pytest.MonkeyPatch) -> None:
    """click's own status for an interrupt is 1, which here says the data did not verify."""
    from asynctier.cli import info as info_module

    def interrupted() -> list[tuple[str, str]]:
        raise KeyboardInterrupt

    monkeypatch.setattr(info_module, "native_parts", interrupted)
    r = CliRunner().invoke(main, ["info"])
    assert r.exit_code == 130, r.output
    assert "interrupted" in r.output


def test_bench_says_4_when_a_tier_will_not_open_and_refuses_a_deep_missing_root(tmp_path: Path) -> None:
    """A tier whose medium does not open is exit 4 (it was 1, "data did not verify", though
    nothing moved); a root whose parent is missing too is refused (exit 2), as --root is."""
    afile = tmp_path / "afile"
    afile.write_bytes(b"x")
    cfg = tmp_path / "t.toml"
    cfg.write_text(f'[tiers.kv]\ntype = "fs"\nroot = "{afile}"\n')
    r = CliRunner().invoke(main, ["bench", "--config", str(cfg), *QUICK, "--no-naive", "-q"])
    assert r.exit_code == 4, r.output
    assert "could not be built or opened" in r.output
    cfg.write_text(f'[tiers.kv]\ntype = "fs"\nroot = "{tmp_path}/no/such"\n')
    r = CliRunner().invoke(main, ["bench", "--config", str(cfg), *QUICK, "--no-naive", "-q"])
    assert r.exit_code == 2 and "neither does its parent" in r.output, r.output
    assert not (tmp_path / "no").exists()


def test_bench_refuses_a_data_size_beyond_the_machines_memory() -> None:
    r = CliRunner().invoke(main, ["bench", "--tier", "memory", "--no-fio", "--data-size", "64T", "-q"])
    assert r.exit_code == 2 and "more than this machine's memory" in r.output, r.output


def test_fsck_of_a_slab_in_use_says_it_cannot_check(tmp_path: Path) -> None:
    """A server holds the slab open: fsck's open is refused (the slab is locked). That was a
    traceback; it is exit 4, 'cannot check', nothing written."""
    import threading

    root = tmp_path / "kv"
    root.mkdir()
    config = _tier_config("nvme", root)
    asyncio.run(_fill(config, 2))
    cfg = _fsck_config(tmp_path, config)
    opened, done = threading.Event(), threading.Event()

    def server() -> None:
        async def hold() -> None:
            spec = OffloadingSpec(CHUNK, 2, namespace=NAMESPACE)
            tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(bytearray(spec.total_bytes)), spec)
            async with tier:
                opened.set()
                await asyncio.to_thread(done.wait, 60)

        asyncio.run(hold())

    t = threading.Thread(target=server)
    t.start()
    try:
        assert opened.wait(30)
        before = _snapshot(root)
        r = invoke("fsck", "--config", str(cfg))
        assert r.exit_code == 4 and "cannot check" in r.output, r.output
        assert _snapshot(root) == before
    finally:
        done.set()
        t.join()


def test_info_prints_data_as_text_not_markup(monkeypatch: pytest.MonkeyPatch) -> None:
    """rich read cells as markup: "pip install 'asynctier[s3]'" printed as "pip install 'asynctier'"."""
    monkeypatch.setitem(sys.modules, "obstore", None)  # as if the s3 extra were not installed
    for name in [m for m in sys.modules if m.startswith("asynctier.tiers.obj")]:
        monkeypatch.delitem(sys.modules, name)
    r = invoke("info")
    assert r.exit_code == 0, r.output
    assert "asynctier[s3]" in "".join(r.output.split()), r.output


def test_a_missing_valkey_client_names_its_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "valkey", None)
    for name in [m for m in sys.modules if m.startswith("asynctier.tiers.valkey")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(TierConfigError, match=r"pip install 'asynctier\[valkey\]'"):
        SecondaryTierFactory.get_tier_class({"type": "valkey"})


def test_a_tier_file_with_the_tiers_keys_below_spec_says_where_they_went(tmp_path: Path) -> None:
    """TOML files every key after ``[spec]`` under it: "no tier configured (add a [tiers.NAME]
    table)" did not say why the top-level 'type' was not seen."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[spec]\nchunk_bytes = "256KiB"\ntype = "fs"\nroot = "{tmp_path}"\n')
    r = invoke("fsck", "--config", str(cfg))
    assert r.exit_code == 2 and "[spec] holds ['type']: a single tier's keys go above the [spec] table" in r.output


_UNREADABLE_TIER = """
from asynctier import BlockingChunkTier

STORED = {}


class UnreadableTier(BlockingChunkTier):
    def write_chunk(self, key, data):
        STORED[key] = bytes(data)

    def read_chunk(self, key, out):
        raise OSError(5, "unreadable medium")

    def chunk_exists(self, key):
        return key in STORED

    def delete_chunk(self, key):
        return STORED.pop(key, None) is not None
"""


def test_a_failed_selfcheck_removes_its_chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its chunks were removed only when every check passed: a failed run (or Ctrl-C) left them."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    (tmp_path / "unreadable_tier.py").write_text(_UNREADABLE_TIER)
    try:
        r = invoke("selfcheck", "--tier", "UnreadableTier", "--param", "module_path=unreadable_tier",
                   "--path", str(tmp_path), "--chunks", "3", "--chunk-bytes", "4K")  # fmt: skip
        assert r.exit_code == 1, r.output
        assert sys.modules["unreadable_tier"].STORED == {}
    finally:
        sys.modules.pop("unreadable_tier", None)


def test_fsck_leaves_the_fs_tiers_file_times_alone(tmp_path: Path) -> None:
    """Each chunk fsck verified was stamped as just used at close (lru_times): the LRU order
    every server opening the root next starts from was scrambled."""
    root = tmp_path / "kv"
    root.mkdir()
    config = _tier_config("fs", root)
    asyncio.run(_fill(config, 4))
    chunks = [p for p in root.rglob("*") if p.is_file() and p.stat().st_size > 4096]
    assert len(chunks) == 4
    for i, p in enumerate(chunks):
        os.utime(p, ns=(1_000_000_000 * (i + 1),) * 2)
    r = invoke("fsck", "--config", str(_fsck_config(tmp_path, config)))
    assert r.exit_code == 0, r.output
    assert [p.stat().st_mtime_ns for p in chunks] == [1_000_000_000 * (i + 1) for i in range(4)]


def test_a_python_spelling_in_a_param_gets_the_json_hint() -> None:
    """``--param verify=True`` said "verify must be True or False; got 'True'": the value was
    the string, since --param values are JSON."""
    r = CliRunner().invoke(main, ["selfcheck", "--tier", "memory", "--chunks", "2", "--param", "verify=True"])
    assert r.exit_code == 2 and "read as JSON: true, false, null" in r.output, r.output
    r = CliRunner().invoke(main, ["selfcheck", "--tier", "memory", "--param", "bogus=None"])  # not about 'None'
    assert r.exit_code == 2 and "read as JSON" not in r.output and "--param KEY=VALUE" in r.output, r.output


def test_selfcheck_builds_no_tree_under_a_literal_dir_placeholder(tmp_path: Path) -> None:
    """Only bench puts its own directory in place of ``{dir}``: selfcheck skipped the check for
    such a root and built ``a/{dir}/b/c``."""
    root = tmp_path / "a" / "{dir}" / "b"
    r = CliRunner().invoke(main, ["selfcheck", "--tier", "fs", "--chunks", "2", "--param", f"root={root}"])
    assert r.exit_code == 2 and "neither does its parent" in r.output, r.output
    assert not (tmp_path / "a").exists()
