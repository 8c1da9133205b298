"""The machine's part of the loop's CPU a chunk: the same Python, run by the event-loop thread
right after it slept, costs more the longer it slept.

``bench_loop_cpu.py`` divides the loop thread's CPU time by the chunks moved. The loop sleeps
between calls' ends (a 256 KiB call of 32 chunks on a disk is in flight for tens of ms), and
each wake-up's burst of work (book the call that ended, plan the next) starts on caches,
branch predictors and TLBs that other work, or the hypervisor, used meanwhile. This measures
that effect with none of the library: on each loop, ``await anyio.sleep(x)`` for each ``x`` in
``--sleeps-ms``, then one fixed piece of Python (dict and list work: about 9,300 bytecodes, as
many as the tiers' bursts for two or three calls of 32 chunks), timed with the thread's CPU clock. Sleeps
are interleaved and repeated; it prints the median CPU after each sleep and its ratio to the
piece run right after another (``0`` ms: no sleep).

On a machine whose ratio at 20 ms is well above 1, the loop's CPU a chunk of a slow stream
(a disk) is larger than that of a fast one (tmpfs) for the same code by about that much
(docs/benchmarks-issue-28.md, thirty-third pass). Run from the repository root:
``.venv/bin/python bench/bench_wake_cost.py`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import anyio
from rows_json import write_rows

BACKENDS: dict[str, tuple[str, dict[str, Any]]] = {
    "asyncio": ("asyncio", {}),
    "uvloop": ("asyncio", {"use_uvloop": True}),
    "trio": ("trio", {}),
}


def piece() -> int:
    """A fixed piece of Python: keys made, a dict filled and read, a list sorted."""
    d: dict[bytes, tuple[int, int, bytes]] = {}
    out: list[int] = []
    for i in range(300):
        k = b"key-%d" % i
        d[k] = (i, i * 2, k)
        out.append(len(k) + d[k][0])
    return sum(sorted(out)[:10]) + len(d)


async def measure(sleeps: list[float], rounds: int) -> dict[float, list[float]]:
    """CPU µs of :func:`piece` after each sleep (seconds; 0: right after the last piece)."""
    cpu: dict[float, list[float]] = {s: [] for s in sleeps}
    for _ in range(3):  # warm the interpreter's caches of this code
        piece()
    for _ in range(rounds):
        for s in sleeps:
            if s:
                await anyio.sleep(s)
            else:
                piece()  # (the piece before the timed one: the same code, just run)
            c0 = time.thread_time_ns()
            piece()
            cpu[s].append((time.thread_time_ns() - c0) / 1e3)
    return cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sleeps-ms", default="0,1,5,20", help="sleeps before the piece, in ms, comma-separated")
    ap.add_argument("--rounds", type=int, default=60, help="pieces timed after each sleep, per loop")
    ap.add_argument("--backends", default="asyncio,uvloop,trio")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    sleeps = [float(x) / 1e3 for x in args.sleeps_ms.split(",")]
    if args.rounds < 1 or any(s < 0 for s in sleeps) or 0.0 not in sleeps:
        ap.error("--rounds must be at least 1, and --sleeps-ms non-negative and include 0 (the reference)")
    unknown = set(args.backends.split(",")) - set(BACKENDS)
    if unknown:
        ap.error(f"--backends: {', '.join(sorted(unknown))} unknown; accepted: {', '.join(BACKENDS)}")
    rows = []
    for backend in args.backends.split(","):
        name, options = BACKENDS[backend]
        try:
            cpu = anyio.run(measure, sleeps, args.rounds, backend=name, backend_options=options)
        except Exception as e:  # uvloop not installed, say
            rows.append({"backend": backend, "error": f"{type(e).__name__}: {e}"[:120]})
            continue
        ref = statistics.median(cpu[0.0])
        for s in sleeps:
            med = statistics.median(cpu[s])
            rows.append({"backend": backend, "sleep_ms": s * 1e3, "cpu_us": med, "ratio": med / ref,
                         "p90_us": sorted(cpu[s])[int(0.9 * (len(cpu[s]) - 1))]})  # fmt: skip
    print("CPU of the same piece of Python on the loop thread after it slept (median, µs; ratio to no sleep)")
    print(f"{'loop':8} {'slept ms':>8} {'cpu us':>8} {'p90 us':>8} {'ratio':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['backend']:8} did not run: {r['error']}")
            continue
        print(f"{r['backend']:8} {r['sleep_ms']:8.1f} {r['cpu_us']:8.1f} {r['p90_us']:8.1f} {r['ratio']:6.2f}")
    write_rows(args.json, args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
