"""bench_peers.py's two fio baselines, the ratios against them, and the tables it prints.

* ``fio``: one file, laid out before the clock starts, written and read at the chunk size
  and depth with ``O_DIRECT`` (best of the engines that work here): what the device gives.
* ``fio-files``: the same job over one file per chunk, each created by the job's own open
  during the run (``create_on_open``): the physical limit of a file-per-chunk layout on
  this file system, the inode's cost included.

Each is measured before and after every block; a contender's figure is divided by the
mean of the two (a drift during the block shows as a gap between them).
"""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from asynctier.cli import benchkit

#: baseline name -> whether fio writes one file per chunk
BASELINES: dict[str, bool] = {"fio": False, "fio-files": True}
SIDES = ("write", "read")

Rates = dict[str, float]  # side ("write"/"read") -> bytes/s
#: the default longest wait for the device to go quiet before a timed write (benchkit.settle):
#: the previous run's deleted files are discarded (a ``discard`` mount) and written back
#: meanwhile; on a machine others use, the device may never be quiet, hence a short limit
SETTLE_S = 3.0


def fio_best(
    workdir: Path, engines: list[str], chunk: int, depth: int, size: int, *, files: bool, settle_s: float = SETTLE_S
) -> Rates:
    """Best bytes/s of the fio engines that work here, writing then reading ``size`` bytes.
    An engine refused here (io_uring in a sandbox, say) is dropped from ``engines`` for good."""
    best = dict.fromkeys(SIDES, 0.0)
    for engine in list(engines):
        for rw in SIDES:
            workdir.mkdir(parents=True, exist_ok=True)
            benchkit.settle(workdir, limit_s=settle_s)
            try:
                r = benchkit.run_fio(
                    workdir, rw=rw, bs=chunk, iodepth=depth, size=size, ioengine=engine, direct=True,
                    file_per_block=files,
                )  # fmt: skip
            except Exception as e:
                print(f"  fio {engine} {rw} failed ({type(e).__name__}); dropped", flush=True)
                engines.remove(engine)
                break
            best[rw] = max(best[rw], r.bytes_per_s)
    shutil.rmtree(workdir, ignore_errors=True)
    return best


def measure_baselines(
    workdir: Path, engines: list[str], chunk: int, depth: int, size: int, settle_s: float = SETTLE_S
) -> dict[str, Rates]:
    return {
        name: fio_best(workdir / name, engines, chunk, depth, size, files=files, settle_s=settle_s)
        for name, files in BASELINES.items()
    }


def ratio(value: float, before: float, after: float) -> float | None:
    """``value`` over the mean of a baseline's two figures; None where either is missing (0)."""
    if before <= 0 or after <= 0:
        return None
    return value / ((before + after) / 2)


@dataclass
class Block:
    """One block's figures over its repeats (a chunk size and a depth)."""

    kib: int
    depth: int
    #: (contender, side, baseline) -> one ratio per repeat
    ratios: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    #: (baseline, side) -> bytes/s, before and after each repeat
    fio: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    #: anything else per repeat (CPU per chunk, inode cost), by name
    extra: dict[str, list[float]] = field(default_factory=dict)

    def add(self, contender: str, got: Rates, before: dict[str, Rates], after: dict[str, Rates]) -> None:
        for side in SIDES:
            for base in before.keys() & after.keys():  # fio may be missing, or fail midway
                r = ratio(got[side], before[base][side], after[base][side])
                if r is not None:
                    self.ratios.setdefault((contender, side, base), []).append(r)
        for key, value in got.items():
            self.note(f"{contender} {key}", value)

    def add_fio(self, measured: dict[str, Rates]) -> None:
        for base, rates in measured.items():
            for side in SIDES:
                self.fio.setdefault((base, side), []).append(rates[side])

    def note(self, name: str, value: float) -> None:
        self.extra.setdefault(name, []).append(value)

    def median(self, contender: str, side: str, base: str) -> float | None:
        values = self.ratios.get((contender, side, base))
        return statistics.median(values) if values else None

    def as_json(self) -> dict[str, object]:
        return {
            "ratios": {"/".join(k): statistics.median(v) for k, v in self.ratios.items()},
            "fio_bytes_per_s": {"/".join(k): statistics.median(v) for k, v in self.fio.items()},
            "extra": {k: statistics.median(v) for k, v in self.extra.items()},
        }


def _cell(value: float | None) -> str:
    return f"{value:6.2f}" if value is not None else "     -"


def _gbps(blk: Block, contender: str, side: str) -> str:
    values = blk.extra.get(f"{contender} {side}")
    return f"{statistics.median(values) / 1e9:5.2f}" if values else "    -"


def ratio_tables(blocks: Sequence[Block], contenders: Sequence[str], repeat: int) -> list[str]:
    """The ratios (median of the repeats) against each baseline, a table per side and baseline."""
    lines: list[str] = []
    bases = sorted({b for blk in blocks for (_, _, b) in blk.ratios}, key=list(BASELINES).index)
    for side in SIDES:
        for base in bases:
            lines += ["", f"{side}, x {base}, median of {repeat} ({base} before and after each block)"]
            lines.append(f"{'KiB':>5} {'depth':>5} | " + " | ".join(f"{c:>10}" for c in contenders))
            for blk in blocks:
                cells = " | ".join(f"{'':4}{_cell(blk.median(c, side, base))}" for c in contenders)
                lines.append(f"{blk.kib:5} {blk.depth:5} | {cells}")
    lines += ["", f"GB/s, write / read, median of {repeat}"]
    lines.append(f"{'KiB':>5} {'depth':>5} | " + " | ".join(f"{c:>13}" for c in contenders))
    for blk in blocks:
        cells = " | ".join(f"{_gbps(blk, c, 'write')} / {_gbps(blk, c, 'read')}" for c in contenders)
        lines.append(f"{blk.kib:5} {blk.depth:5} | {cells}")
    if any(blk.fio for blk in blocks):
        lines += ["", "fio itself, GB/s (median of before and after), write / read; fio-files over fio"]
        for blk in blocks:
            med = {k: statistics.median(v) / 1e9 for k, v in blk.fio.items()}
            cells = " | ".join(f"{b} {med.get((b, 'write'), 0):5.2f} / {med.get((b, 'read'), 0):5.2f}" for b in bases)
            w = med.get(("fio", "write"), 0)
            share = f"{med.get(('fio-files', 'write'), 0) / w:5.2f}" if w else "    -"
            lines.append(f"{blk.kib:5} {blk.depth:5} | {cells} | write {share}")
    return lines
