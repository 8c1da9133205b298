"""The throughput sweep: ``asynctier bench`` with its results written to bench/results/.

Runs the same code as the command (:mod:`asynctier.cli.bench`): every tier (fs, nvme slab and
obj on ``file://`` by default) at every chunk size (256 KiB, 2 MiB, 16 MiB) and depth (1, 4,
16): offload, lookup, load back from a cold page cache, verify every byte; fio (O_DIRECT,
same block size and depth) and a naive aiofiles loop measured in the same run, as ratios.

Run from the repository root; any ``asynctier bench`` option may follow::

    .venv/bin/python bench/bench_throughput.py
    .venv/bin/python bench/bench_throughput.py --tier fs --chunk-sizes 2M --depths 16

Writes ``bench/results/throughput.json``, ``throughput.md`` and ``throughput.png`` (when
matplotlib is installed: the ``bench`` extra).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from asynctier.cli import main as cli

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    out = REPO / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    args = ["bench", *sys.argv[1:]]
    args += ["--json", str(out / "throughput.json"), "--markdown", str(out / "throughput.md")]
    if importlib.util.find_spec("matplotlib") is not None:
        args += ["--plot", str(out / "throughput.png")]
    try:
        cli.main(args=args, prog_name="asynctier", standalone_mode=True)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
