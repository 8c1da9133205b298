"""The README shows real code: its custom tier is examples/dir_tier.py, and its tour runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_custom_tier_is_the_tested_example() -> None:
    assert (ROOT / "examples" / "dir_tier.py").read_text() in README


def test_readme_tour_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    tour = next(b for b in blocks if "asyncio.run(main())" in b)
    out = subprocess.run([sys.executable, "-c", tour], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "TierStats(" in out.stdout


def test_readme_main_job_runs() -> None:
    first = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first is not None
    lines = first.group(1).strip().splitlines()
    assert len(lines) == 3 and "pytest" in lines[1] and "vllm" in lines[2]
    main_job = lines[0].split("#")[0].split("&&")[-1].split()
    assert main_job[:2] == ["asynctier", "bench"]
    # the README's command, shrunk to one small point per tier (the full default run takes
    # about a minute and is what the README's results come from)
    small = ["--chunk-sizes", "256K", "--depths", "2", "--data-size", "2M", "--no-fio", "--no-naive", "-q"]
    out = subprocess.run(
        [sys.executable, "-m", "asynctier.cli", *main_job[1:], *small], capture_output=True, text=True, timeout=170
    )
    assert out.returncode == 0, out.stderr[-2000:]
    for tier in ("fs", "nvme", "obj"):
        assert tier in out.stdout


def test_ci_runs_the_readme_test_install_and_command() -> None:
    first = re.search(r"```bash\n(.*?)```", README, re.S)
    assert first is not None
    test_line = first.group(1).strip().splitlines()[1].split("#")[0].strip()
    install, command = (part.strip() for part in test_line.split("&&"))
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"python -m {install}" in ci, (install, ci)
    assert command in ci.splitlines(), command
    vllm_install = first.group(1).strip().splitlines()[2].split("#")[0].strip()
    assert f"python -m {vllm_install}" in ci.splitlines(), (vllm_install, ci)
    assert ci.index(f"python -m {vllm_install}") < ci.index(f"\n{command}\n"), "vLLM goes in before the tests run"
