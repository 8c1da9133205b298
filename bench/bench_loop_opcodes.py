"""Python bytecodes the event-loop thread runs per chunk while a tier streams, by function.

``bench_loop_cpu.py`` measures the loop thread's CPU time per chunk; on a machine shared with
the workers (and with other work) that figure moves 10-30 % from run to run, more than most
changes to the per-chunk path. The number of bytecodes the interpreter runs for the same
calls moves by a few percent at most (how many ends one wake-up of the loop reaps varies), and
where they are spent is the list of what to cut. This streams
as ``bench_loop_cpu.py`` does (four callers of 32 chunks, ``max_inflight`` 16, the native
engine) through one tier: fill it, then time nothing but count, with ``sys.settrace`` opcode
events on the loop thread, one more pass of the operation asked for (``load``: the keys
stored; ``fill``: new keys into room; ``steady``: new keys into the full tier, each store
evicting). The count includes the caller's own lines (building each call's chunk ids, as a
server does); C functions count as the one call that reaches them. Tracing slows the loop
thread's own work about 25x (not the workers'): the GB/s it would print mean nothing, so it
prints none.

Run from the repository root: ``.venv/bin/python bench/bench_loop_opcodes.py --tier fs --op
steady`` (``--help`` for options). ``PYTHONPATH=that/checkout`` counts an older checkout:
only the public API is used.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
from types import CodeType, FrameType
from typing import Any

import anyio

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_loop_cpu import BACKENDS, _aligned_view, _config, stream

from asynctier import OffloadingSpec, SecondaryTierFactory

OPS = ("load", "fill", "steady")


def _short(path: str) -> str:
    """A file's folder and name ("engines/native.py", "fs/native.py"): enough to tell apart."""
    head, name = os.path.split(path)
    return f"{os.path.basename(head)}/{name}"


class Counter:
    """Opcodes run per (file, function) and per (file, line), on the thread that starts it."""

    def __init__(self) -> None:
        self._counts: collections.Counter[tuple[CodeType, int]] = collections.Counter()

    def _call(self, frame: FrameType, event: str, arg: object) -> Any:
        frame.f_trace_opcodes = True
        return self._opcode

    def _opcode(self, frame: FrameType, event: str, arg: object) -> Any:
        if event == "opcode":  # (names are made once, at the end: this runs per bytecode)
            self._counts[(frame.f_code, frame.f_lineno)] += 1
        return self._opcode

    def start(self) -> None:
        sys.settrace(self._call)

    def stop(self) -> None:
        sys.settrace(None)

    @property
    def functions(self) -> collections.Counter[tuple[str, str]]:
        out: collections.Counter[tuple[str, str]] = collections.Counter()
        for (code, _), n in self._counts.items():
            out[(_short(code.co_filename), code.co_name)] += n
        return out

    @property
    def lines(self) -> collections.Counter[tuple[str, int]]:
        out: collections.Counter[tuple[str, int]] = collections.Counter()
        for (code, line), n in self._counts.items():
            out[(_short(code.co_filename), line)] += n
        return out


async def count(tier_type: str, kib: int, op: str, chunks: int, batch: int, streams: int, depth: int) -> Counter:
    chunk = kib << 10
    slots = max(batch * streams, 64)
    spec = OffloadingSpec(chunk, slots, namespace="bench/loop-opcodes")
    view = _aligned_view(spec.total_bytes)
    root = tempfile.mkdtemp(prefix="asynctier-loopops-")
    counter = Counter()
    try:
        config = _config(tier_type, "native", root, depth, chunks, chunk, steady=True)
        tier = SecondaryTierFactory.create_secondary_tier(config, view, spec)
        async with tier:
            first = [b"loop-ops-%d" % i for i in range(chunks)]
            if op == "fill":  # the counted pass is the fill; the untimed one warms the engine
                await stream(tier, "offload", [b"loop-ops-warm-%d" % i for i in range(batch * streams)], slots,
                             batch, streams)  # fmt: skip
                keys, what = first, "offload"
            else:
                await stream(tier, "offload", first, slots, batch, streams)
                await stream(tier, "load", first, slots, batch, streams)  # (once untimed: the same state)
                keys, what = (first, "load") if op == "load" else ([b"loop-ops-new-%d" % i for i in range(chunks)],
                                                                   "offload")  # fmt: skip
            counter.start()
            try:
                await stream(tier, what, keys, slots, batch, streams)
            finally:
                counter.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return counter


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tier", default="fs", choices=("fs", "nvme"))
    ap.add_argument("--op", default="steady", choices=OPS)
    ap.add_argument("--chunk-kib", type=int, default=64)
    ap.add_argument("--chunks", type=int, default=2048)
    ap.add_argument("--depth", type=int, default=16, help="max_inflight")
    ap.add_argument("--batch", type=int, default=32, help="chunks per call")
    ap.add_argument("--streams", type=int, default=4, help="concurrent callers")
    ap.add_argument("--backend", default="asyncio", choices=sorted(BACKENDS))
    ap.add_argument("--top", type=int, default=25, help="functions listed (and as many lines with --lines)")
    ap.add_argument("--lines", action="store_true", help="also list the lines that run the most opcodes")
    ap.add_argument("--json", default=None, help="write the counts here")
    args = ap.parse_args()
    name, options = BACKENDS[args.backend]
    c = anyio.run(count, args.tier, args.chunk_kib, args.op, args.chunks, args.batch, args.streams, args.depth,
                  backend=name, backend_options=options)  # fmt: skip
    per = 1 / args.chunks
    functions = c.functions
    total = sum(functions.values()) * per
    print(f"{args.tier} {args.chunk_kib} KiB {args.op} on {args.backend}: {total:.1f} opcodes a chunk (loop thread)")
    for (file, fn), v in functions.most_common(args.top):
        print(f"{v * per:8.2f}  {file}:{fn}")
    if args.lines:
        print("lines:")
        for (file, line), v in c.lines.most_common(args.top):
            print(f"{v * per:8.2f}  {file}:{line}")
    if args.json:
        by_function = {f"{a}:{b}": v * per for (a, b), v in functions.most_common()}
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "opcodes_per_chunk": total, "functions": by_function}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
