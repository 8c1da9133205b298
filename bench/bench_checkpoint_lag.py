"""The event loop's lateness while an nvme tier streams through its own checkpoints.

A checkpoint holds the tier's index lock while it copies the index (the snapshot); loads and
stores that find the lock taken wait for it. Four producers keep 32-chunk offloads going into
a fresh nvme tier of ``--capacity`` for ``--seconds``, long enough for a few checkpoints
(one each ``checkpoint_every`` journal records), while a ticker asks to wake every 1 ms and
records how late it wakes. Each run reports the chunks stored, the checkpoints, the chunks
that found the index lock busy (``native_index_busy``), how long each checkpoint's snapshot
and journal rotation took (and whether the rotation ran under the lock: before the
twenty-fourth pass it did), the ticker's p99, p99.9, worst, and the ticks over 4 and 8 ms,
and how long each offload call took (p50, p99, worst): a call that meets the lock waits.

The two durations are timed by wrapping ``SlotIndex.snapshot`` and ``Journal.rotate``.

Run from the repository root: ``.venv/bin/python bench/bench_checkpoint_lag.py`` (``--help``).
It uses the installed asynctier, so an older one in a venv of its own runs the same script.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bench_loop_cpu import _aligned_view

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.cli.sizes import parse_size

# mypy checks tiers/ as the top-level package "tiers" (installed as asynctier.tiers): bench_nvme.py says more
if TYPE_CHECKING:
    from tiers.nvme import journal as nvme_journal
    from tiers.nvme import slots as nvme_slots
else:
    from asynctier.tiers.nvme import journal as nvme_journal
    from asynctier.tiers.nvme import slots as nvme_slots

_TIMES: dict[str, list[float]] = {"snapshot": [], "rotate": []}


def _timed(cls: Any, name: str) -> None:
    fn: Callable[..., Any] = getattr(cls, name)

    def timed(*args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kw)
        finally:
            _TIMES[name].append(time.perf_counter() - t0)

    setattr(cls, name, timed)


_timed(nvme_slots.SlotIndex, "snapshot")
_timed(nvme_journal.Journal, "rotate")


async def one_run(
    capacity: int, chunk: int, seconds: float, where: str | None, streams: int, every: int | None
) -> dict[str, Any]:
    for v in _TIMES.values():
        v.clear()
    root = tempfile.mkdtemp(prefix="asynctier-ckpt-lag-", dir=where)
    spec = OffloadingSpec(chunk, 32 * streams, namespace="bench/checkpoint-lag")
    cfg: dict[str, Any] = {"type": "nvme", "path": os.path.join(root, "slab"), "capacity_bytes": capacity,
                           "max_inflight": 16}  # fmt: skip
    if every is not None:
        cfg["checkpoint_every"] = every
    tier = SecondaryTierFactory.create_secondary_tier(cfg, _aligned_view(spec.total_bytes), spec)
    late: list[float] = []
    calls: list[float] = []  # each offload call's duration
    stored = 0
    try:
        async with tier:
            stop = asyncio.Event()

            async def ticker() -> None:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    await asyncio.sleep(0.001)
                    late.append(time.perf_counter() - t0 - 0.001)

            async def producer(s: int, t_end: float) -> None:
                nonlocal stored
                i = 0
                while time.perf_counter() < t_end:
                    keys = [b"s%d-%d-%d" % (s, i, j) for j in range(32)]
                    c0 = time.perf_counter()
                    res = await tier.offload(keys, [s * 32 + j for j in range(32)])
                    calls.append(time.perf_counter() - c0)
                    if res.failed:
                        raise RuntimeError(f"offload: {next(iter(res.failed.values()))!r}")
                    stored += 32
                    i += 1

            tick = asyncio.create_task(ticker())
            t0 = time.perf_counter()
            await asyncio.gather(*(producer(s, t0 + seconds) for s in range(streams)))
            elapsed = time.perf_counter() - t0
            stop.set()
            await tick
            extra = tier.stats().extra
    finally:
        shutil.rmtree(root, ignore_errors=True)
    late.sort()
    calls.sort()
    return {
        "chunks": stored,
        "GBps": stored * chunk / elapsed / 1e9,
        "checkpoints": extra.get("checkpoints", 0),  # (the closing one included)
        "index_busy_chunks": extra.get("native_index_busy", 0),
        "snapshot_ms": [round(t * 1e3, 1) for t in _TIMES["snapshot"]],
        "rotate_ms": [round(t * 1e3, 1) for t in _TIMES["rotate"]],
        "rotation_under_lock": not hasattr(nvme_journal.Journal, "start_rotation"),
        "lag_p99_ms": late[int(len(late) * 0.99)] * 1e3,
        "lag_p999_ms": late[int(len(late) * 0.999)] * 1e3,
        "lag_max_ms": late[-1] * 1e3,
        "ticks": len(late),
        "ticks_over_4ms": sum(1 for x in late if x > 0.004),
        "ticks_over_8ms": sum(1 for x in late if x > 0.008),
        "call_p50_ms": calls[len(calls) // 2] * 1e3,
        "call_p99_ms": calls[int(len(calls) * 0.99)] * 1e3,
        "call_max_ms": calls[-1] * 1e3,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--capacity", default="24G", help="the slab's size (its slots: capacity / (chunk + 4 KiB))")
    ap.add_argument("--chunk-kib", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0, help="streaming per run")
    ap.add_argument("--streams", type=int, default=4, help="concurrent producers of 32-chunk calls")
    ap.add_argument("--repeat", type=int, default=3, help="runs, each into a fresh tier")
    ap.add_argument("--checkpoint-every", type=int, default=None, help="journal records (default: the tier's)")
    ap.add_argument("--dir", default=None, help="where the slab goes (default: a temporary directory)")
    ap.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    ap.add_argument("--json", default=None, help="write the runs here")
    a = ap.parse_args()
    if a.loop == "uvloop":
        import uvloop

        uvloop.install()
    runs = []
    for r in range(a.repeat):
        run = one_run(parse_size(a.capacity), a.chunk_kib << 10, a.seconds, a.dir, a.streams, a.checkpoint_every)
        out = asyncio.run(run)
        runs.append(out)
        print(
            f"run {r}: {out['chunks']} chunks ({out['GBps']:.2f} GB/s), {out['checkpoints']} checkpoints, "
            f"{out['index_busy_chunks']} chunks found the index busy; snapshot ms {out['snapshot_ms']}, "
            f"rotation ms {out['rotate_ms']} ({'under' if out['rotation_under_lock'] else 'after'} the lock); "
            f"lag p99 {out['lag_p99_ms']:.2f} p99.9 {out['lag_p999_ms']:.2f} max {out['lag_max_ms']:.1f} ms, "
            f"ticks > 4 ms: {out['ticks_over_4ms']}, > 8 ms: {out['ticks_over_8ms']} (of {out['ticks']}); "
            f"offload calls p50 {out['call_p50_ms']:.1f} p99 {out['call_p99_ms']:.1f} max {out['call_max_ms']:.1f} ms",
            flush=True,
        )
    if len(runs) > 1:
        med = {k: statistics.median(r[k] for r in runs) for k in ("GBps", "index_busy_chunks", "lag_max_ms")}
        print(f"medians: {med['GBps']:.2f} GB/s, {med['index_busy_chunks']:.0f} chunks found the index busy, "
              f"worst lag {med['lag_max_ms']:.1f} ms")  # fmt: skip
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
