"""What a new file costs the kernel with the fs tier's 256 shards placed apart or not.

The fs tier flags the namespace directory it makes with ``FS_TOPDIR_FL`` (``chattr +T``), so
that ext2/3/4 spread the shards over the block groups (docs/tiers/fs.md, "Where the shards
live"). This measures why, with no tier around it: each round makes a directory of 256 shards,
flagged (``spread``) or not (``plain``), creates ``--files`` files of 4 KiB round-robin in
them, and deletes it all, so that the next round creates right after a deletion, as a
benchmark's next run or a tier filling after a ``clear()`` does. Rounds alternate which
placement goes first; it prints each round's wall and kernel (system) time per file, the
block groups the shards landed in ((inode number - 1) // ``--inodes-per-group``, 8192 by default
on ext4), and the medians.

On ext4 without a journal every create skips the inodes of its group freed in the last
minute or more, one by one: the plain rounds pay for the previous round's deletions, the
spread ones meet a 256th of them. With a journal, on tmpfs or xfs, both are alike (and
``spread`` falls back to ``plain`` where the flag is refused: the output says so).

Run (from the repository root; ``--dir`` on the file system to measure)::

    .venv/bin/python bench/bench_shard_placement.py --dir /var/tmp/asynctier-placement

(``--json FILE`` keeps each round's figures.)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

from asynctier.posix_io import spread_subdirs

SHARDS = 256


def one_round(root: Path, spread: bool, files: int, per_group: int) -> tuple[float, float, int, bool]:
    """(wall µs a file, system µs a file, groups of the shards, whether the flag took)."""
    root.mkdir()
    took = False
    if spread:
        took = spread_subdirs(root)
    dirs = [root / f"{i:02x}" for i in range(SHARDS)]
    for d in dirs:
        d.mkdir()
    payload = b"x" * 4096
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF).ru_stime
    for i in range(files):
        fd = os.open(dirs[i % SHARDS] / f"f{i}", os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
        try:
            os.write(fd, payload)
        finally:
            os.close(fd)
    wall, c1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_stime
    groups = len({(d.stat().st_ino - 1) // per_group for d in dirs})  # (ext4 counts inodes from 1)
    shutil.rmtree(root)  # the next round creates right after these deletions
    return wall / files * 1e6, (c1 - c0) / files * 1e6, groups, took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", required=True, help="a directory on the file system to measure (made if missing)")
    ap.add_argument("--files", type=int, default=4096, help="files made per round")
    ap.add_argument("--rounds", type=int, default=6, help="rounds per placement, alternating")
    ap.add_argument("--inodes-per-group", type=int, default=8192, help="for the groups column only")
    ap.add_argument("--json", default=None, help="write each round's figures here")
    args = ap.parse_args()
    base = Path(args.dir)
    base.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[tuple[float, float, int, bool]]] = {"plain": [], "spread": []}
    for r in range(args.rounds):
        for name in ("plain", "spread") if r % 2 == 0 else ("spread", "plain"):
            res = one_round(base / f"placement-{os.getpid()}-{r}-{name}", name == "spread", args.files,
                            args.inodes_per_group)  # fmt: skip
            results[name].append(res)
            note = "" if name == "plain" or res[3] else " (flag refused here: the same as plain)"
            print(f"round {r} {name:6}: {res[0]:7.1f} µs a file ({res[1]:.1f} system), "
                  f"shards in {res[2]} groups{note}", flush=True)  # fmt: skip
    for name, rows in results.items():
        print(f"{name:6}: median {statistics.median(x[0] for x in rows):.1f} µs a file, "
              f"{statistics.median(x[1] for x in rows):.1f} system")  # fmt: skip
    if args.json:
        keys = ("us_per_file", "system_us_per_file", "groups", "flag_taken")
        out = {name: [dict(zip(keys, row)) for row in rows] for name, rows in results.items()}
        Path(args.json).write_text(json.dumps({"dir": str(base), "files": args.files, "rounds": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
