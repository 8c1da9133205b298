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
(docs/benchmarks-issue-28.md, thirty-third pass).

``--beside`` times the same pieces beside a stream of another process: ``fio`` writing 256 KiB
blocks with O_DIRECT at depth 16 into a directory (the disk, tmpfs), conditions interleaved
``--repeat`` times. Where the piece costs the same beside a disk's stream as beside none, the
disk's I/O does not slow the loop's Python by itself: what it changes is how long the loop
sleeps (thirty-fifth pass). Run from the repository root:
``.venv/bin/python bench/bench_wake_cost.py`` (``--help`` for options).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
from rows_json import write_rows

from asynctier.cli import benchkit

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


@contextmanager
def beside(where: str, seen: dict[str, list[float]]) -> Iterator[None]:
    """A stream of another process while the pieces are timed: none, or fio writing into the
    directory ``where`` (256 KiB blocks, O_DIRECT, depth 16, over a 1 GiB file until stopped);
    the GB/s fio reports it wrote are added to ``seen[where]``."""
    if where == "none":
        yield
        return
    procs: list[subprocess.Popen[str]] = []
    got: list[benchkit.FioResult | BaseException] = []

    def stream() -> None:
        try:
            got.append(benchkit.run_fio(where, rw="write", bs=256 << 10, iodepth=16, size=1 << 30,
                                        fsync_at_end=False, until_stopped=True, started=procs.append))  # fmt: skip
        except BaseException as e:  # told to the measuring thread
            got.append(e)

    t = threading.Thread(target=stream, name="beside-fio")
    t.start()
    try:
        time.sleep(1.5)  # its file laid out and the stream at speed
        if not t.is_alive():
            raise RuntimeError(f"fio writing into {where} ended at once: {got[0]!r:.300}")
        yield
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        t.join()
    if isinstance(got[0], BaseException):
        raise got[0]
    seen.setdefault(where, []).append(got[0].bytes_per_s / 1e9)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sleeps-ms", default="0,1,5,20", help="sleeps before the piece, in ms, comma-separated")
    ap.add_argument("--rounds", type=int, default=60, help="pieces timed after each sleep, per loop")
    ap.add_argument("--backends", default="asyncio,uvloop,trio")
    ap.add_argument(
        "--beside",
        default="none",
        help="comma-separated: none, or a directory fio streams into meanwhile (O_DIRECT writes)",
    )
    ap.add_argument("--repeat", type=int, default=1, help="times the --beside conditions are interleaved")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    sleeps = [float(x) / 1e3 for x in args.sleeps_ms.split(",")]
    if args.rounds < 1 or any(s < 0 for s in sleeps) or 0.0 not in sleeps:
        ap.error("--rounds must be at least 1, and --sleeps-ms non-negative and include 0 (the reference)")
    unknown = set(args.backends.split(",")) - set(BACKENDS)
    if unknown:
        ap.error(f"--backends: {', '.join(sorted(unknown))} unknown; accepted: {', '.join(BACKENDS)}")
    conditions = args.beside.split(",")
    for c in conditions:
        if c != "none" and not os.path.isdir(c):
            ap.error(f"--beside: {c!r} is neither 'none' nor a directory")
    if conditions != ["none"] and not benchkit.fio_available():
        ap.error("--beside with a directory needs fio on the PATH (apt-get install fio)")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    # every piece's CPU, by (condition, loop, sleep): the conditions interleaved, medians over all
    cpu: dict[tuple[str, str, float], list[float]] = {}
    errors: dict[str, str] = {}
    streamed: dict[str, list[float]] = {}  # the GB/s fio wrote beside the pieces, by condition
    for _ in range(args.repeat):
        for c in conditions:
            with beside(c, streamed):
                for backend in args.backends.split(","):
                    if backend in errors:
                        continue
                    name, options = BACKENDS[backend]
                    try:
                        got = anyio.run(measure, sleeps, args.rounds, backend=name, backend_options=options)
                    except Exception as e:  # uvloop not installed, say
                        errors[backend] = f"{type(e).__name__}: {e}"[:120]
                        continue
                    for s, xs in got.items():
                        cpu.setdefault((c, backend, s), []).extend(xs)
    rows: list[dict[str, Any]] = []
    for c in conditions:
        for backend in args.backends.split(","):
            if backend in errors:
                rows.append({"beside": c, "backend": backend, "error": errors[backend]})
                continue
            ref = statistics.median(cpu[(c, backend, 0.0)])
            for s in sleeps:
                xs = sorted(cpu[(c, backend, s)])
                med = statistics.median(xs)
                rows.append({"beside": c, "backend": backend, "sleep_ms": s * 1e3, "cpu_us": med,
                             "ratio": med / ref, "p90_us": xs[int(0.9 * (len(xs) - 1))],
                             "stream_gbps": statistics.median(streamed[c]) if c in streamed else None})  # fmt: skip
    print("CPU of the same piece of Python on the loop thread after it slept (median, µs; ratio to no sleep)")
    print(f"{'beside':16} {'loop':8} {'slept ms':>8} {'cpu us':>8} {'p90 us':>8} {'ratio':>6}")
    for r in rows:
        where = r["beside"] if len(r["beside"]) <= 16 else "…" + r["beside"][-15:]
        if "error" in r:
            print(f"{where:16} {r['backend']:8} did not run: {r['error']}")
            continue
        print(
            f"{where:16} {r['backend']:8} {r['sleep_ms']:8.1f} {r['cpu_us']:8.1f} {r['p90_us']:8.1f} {r['ratio']:6.2f}"
        )
    for c, gbps in streamed.items():
        print(f"beside {c}: fio wrote {statistics.median(gbps):.2f} GB/s (median of {len(gbps)})")
    write_rows(args.json, args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
