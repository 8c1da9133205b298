"""The per-tier bench scripts still run end to end (tiny sizes: a smoke test, not a measurement).

Each script verifies every byte it loads back and exits non-zero otherwise; here it must
also write a report whose figures are all there and positive.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from asynctier import benchkit

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not benchkit.fio_available(), reason="fio is not installed")


def _run(script: str, *args: str) -> None:
    cmd = [sys.executable, str(REPO / "bench" / script), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def test_bench_fs_reports_tier_fio_and_bare_figures(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run("bench_fs.py", "--dir", str(tmp_path / "scratch"), "--sizes-kib", "256", "--depths", "2", "--mib", "4",
         "--repeat", "1", "--no-naive", "--no-full", "--no-fio-files", "--out", str(out))  # fmt: skip
    report = json.loads((out / "fs.json").read_text())
    (point,) = report["points"]
    for side in ("write", "read"):
        for name in (f"fs_{side}", f"fio_{side}", f"bare_{side}", f"fs_{side}_x_fio", f"fs_{side}_x_bare"):
            assert point[name] > 0, name
    md = (out / "fs.md").read_text()
    assert "| fs x bare |" in md and "256 KiB" in md


def test_bench_nvme_reports_both_engines_and_reopen(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _run("bench_nvme.py", "--dir", str(tmp_path / "scratch"), "--gib", "0.02", "--reps", "1", "--small-ops", "256",
         "--slots", "10000", "--ceiling-dir", "", "--no-naive", "--out", str(out))  # fmt: skip
    report = json.loads((out / "nvme.json").read_text())
    assert report["runs"], "no runs reported"
    for run in report["runs"]:
        assert run["offload_Bps"] > 0 and run["load_Bps"] > 0, run
    assert report["reopen"]["slots"] == 10000 and report["reopen"]["open_s"] > 0
