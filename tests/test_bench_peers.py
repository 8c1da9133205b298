"""bench/bench_peers.py and its fio helpers: the ratios are computed against the right
baseline, a contender's knobs parse or are refused, fio-files really creates its files
inside the job, and the script runs end to end at a tiny size. Nothing here is timed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from asynctier.cli import benchkit

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from bench_peers import parse_contender  # noqa: E402
from peers_fio import Block, ratio, ratio_tables  # noqa: E402

needs_fio = pytest.mark.skipif(not benchkit.fio_available(), reason="fio is not installed")


def test_ratio_is_over_the_mean_of_before_and_after() -> None:
    assert ratio(3.0, 2.0, 4.0) == 1.0
    assert ratio(1.0, 0.0, 4.0) is None  # a baseline that failed gives no ratio, not a huge one
    assert ratio(1.0, 4.0, 0.0) is None


def test_block_keeps_each_baseline_apart_and_takes_medians() -> None:
    blk = Block(256, 4)
    before = {"fio": {"write": 4.0, "read": 2.0}, "fio-files": {"write": 1.0, "read": 2.0}}
    after = {"fio": {"write": 4.0, "read": 2.0}, "fio-files": {"write": 3.0, "read": 2.0}}
    for w in (1.0, 2.0, 8.0):
        blk.add("fs-native", {"write": w, "read": 1.0, "write_cpu_us": 5.0}, before, after)
    assert blk.median("fs-native", "write", "fio") == 0.5
    assert blk.median("fs-native", "write", "fio-files") == 1.0
    assert blk.median("fs-native", "read", "fio-files") == 0.5
    assert blk.median("nvme", "write", "fio") is None
    assert blk.extra["fs-native write_cpu_us"] == [5.0, 5.0, 5.0]
    # fio measured only before (it failed after): no ratio against it, the other stays
    blk2 = Block(64, 1)
    blk2.add("x", {"write": 1.0, "read": 1.0}, before, {"fio-files": after["fio-files"]})
    assert set(blk2.ratios) == {("x", "write", "fio-files"), ("x", "read", "fio-files")}
    text = "\n".join(ratio_tables([blk], ["fs-native", "nvme"], 3))
    assert "write, x fio-files, median of 3" in text and "  1.00 |" in text
    assert json.loads(json.dumps(blk.as_json()))["ratios"]["fs-native/write/fio"] == 0.5


def test_contender_knobs_parse_and_bad_ones_are_refused() -> None:
    assert parse_contender("fs-native") == ("fs-native", {})
    assert parse_contender("fs-native/verify=false/tmpfile_pool=0/publish=rename") == (
        "fs-native",
        {"verify": False, "tmpfile_pool": 0, "publish": "rename"},
    )
    with pytest.raises(ValueError, match="unknown contender 'ext5'"):
        parse_contender("ext5")
    with pytest.raises(ValueError, match="takes no knobs"):
        parse_contender("os-threads/verify=false")
    with pytest.raises(ValueError, match="key=value"):
        parse_contender("fs-threads/verify")


@needs_fio
def test_fio_one_file_per_block_creates_each_file_in_the_job(tmp_path: Path) -> None:
    """A write over one file per block asks fio to make each file at its open, in the timed
    job (without create_on_open, fio's untimed layout step makes and fallocates them all),
    and this fio takes the option and leaves one whole file per block."""
    args = benchkit._fio_args(tmp_path, "write", 4096, 2, 8 * 4096, "psync", True, True, True)
    assert "--create_on_open=1" in args
    assert "--create_on_open=1" not in benchkit._fio_args(
        tmp_path, "read", 4096, 2, 8 * 4096, "psync", True, True, True
    )
    out = subprocess.run([*args, "--end_fsync=1"], check=True, capture_output=True, text=True, timeout=60).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0]
    assert job["write"]["io_bytes"] == 8 * 4096
    assert sorted(p.stat().st_size for p in tmp_path.iterdir()) == [4096] * 8


@needs_fio
def test_bench_peers_runs_end_to_end_with_both_baselines(tmp_path: Path) -> None:
    out = tmp_path / "peers.json"
    cmd = [sys.executable, str(REPO / "bench" / "bench_peers.py"), "--dir", str(tmp_path / "scratch"),
           "--sizes-kib", "64", "--depths", "2", "--mib", "1", "--repeat", "1", "--fio-engines", "psync",
           "--settle-s", "0",
           "--contenders", "fs-native,fs-threads/tmpfile_pool=0,os-threads", "--json", str(out)]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-2000:] + r.stderr[-2000:]
    (block,) = json.loads(out.read_text())["results"].values()
    for c in ("fs-native", "fs-threads/tmpfile_pool=0", "os-threads"):
        for side in ("write", "read"):
            for base in ("fio", "fio-files"):
                assert block["ratios"][f"{c}/{side}/{base}"] > 0
    assert block["fio_bytes_per_s"]["fio-files/write"] > 0
    assert block["extra"]["fs-native write_cpu_us"] > 0
    assert "write, x fio-files" in r.stdout
