"""Trace-driven benchmark: a multi-turn chat workload replayed through single tiers and chains.

A synthetic trace (bench/trace_workload.py: Zipf-popular shared prefixes, conversations that
grow a few chunks a turn, turns of many conversations interleaved) is replayed through each
tier and chain as a prefix-caching server would: ``lookup_prefix``, load the prefix found,
"compute" the rest, offload what was computed (bench/trace_replay.py). Reported per run: the
prefix hit ratio (prompt chunks loaded instead of recomputed), p50/p99 load latency per turn
and per chunk, lookup and offload latency, CPU time; per tier: chunks served, hit ratio, bytes
read and written. Writes ``NAME.json``, ``NAME.md`` and ``NAME.png`` to ``--out``.

Capacities are in chunks: by default the memory tier holds a tenth of the trace's distinct
chunks (RAM is the scarce tier), the fs and nvme tiers a quarter, obj all (file:// by default; ``--moto`` for moto's S3
server on 127.0.0.1). Files live under ``--root`` (a directory under /var/tmp by default);
the page cache is not dropped, as on a server whose working set fits in RAM.

    .venv/bin/python bench/bench_trace.py                       # every default run, < 3 minutes
    .venv/bin/python bench/bench_trace.py --runs memory,memory+fs --conversations 400
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import os
import re
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from trace_configs import DEFAULT_RUNS, Capacities, build_config, parse_run
from trace_replay import replay
from trace_report import backlog_served, markdown, plot, tier_rows
from trace_workload import Trace, TraceOptions, describe, generate

from asynctier import SecondaryTierFactory
from asynctier.cli.benchkit import machine_info, write_results
from asynctier.cli.tierfile import redact

RESULTS = Path(__file__).resolve().parent / "results"


def _args(argv: list[str] | None) -> argparse.Namespace:
    d = TraceOptions()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    w = ap.add_argument_group("workload")
    w.add_argument("--seed", type=int, default=d.seed)
    w.add_argument("--conversations", type=int, default=d.conversations)
    w.add_argument("--turns", type=int, default=d.turns, help="most turns per conversation (each draws 1..N)")
    w.add_argument("--prefixes", type=int, default=d.prefixes, help="distinct shared prefixes")
    w.add_argument("--zipf-s", type=float, default=d.zipf_s, help="Zipf exponent of the prefixes' popularity")
    w.add_argument("--prefix-chunks", type=int, default=d.prefix_chunks, help="longest shared prefix (chunks)")
    w.add_argument("--suffix-chunks", type=int, default=d.suffix_chunks, help="chunks each turn adds")
    s = ap.add_argument_group("server and tiers")
    s.add_argument("--chunk-kib", type=int, default=256, help="chunk size in KiB")
    s.add_argument("--concurrency", type=int, default=4, help="turns in flight (1: hit counts exactly repeatable)")
    s.add_argument("--primary-chunks", type=int, default=0, help="primary slots (0: concurrency x longest sequence)")
    s.add_argument("--memory-chunks", type=int, default=0, help="memory tier capacity (0: 1/10 of distinct chunks)")
    s.add_argument("--disk-chunks", type=int, default=0, help="fs/nvme capacity (0: 1/4 of distinct chunks)")
    s.add_argument("--runs", default=",".join(DEFAULT_RUNS), help="comma-separated tiers and chains (a+b:through)")
    s.add_argument("--write", choices=("back", "through"), default="back", help="chains' write policy by default")
    s.add_argument(
        "--chain-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a chain parameter for every chain (JSON value, else a string): promote=false, backlog_chunks=256",
    )
    s.add_argument("--moto", action="store_true", help="obj on moto's S3 server (127.0.0.1), not file://")
    s.add_argument("--root", default=None, help="directory for the tiers' files (default: under /var/tmp)")
    o = ap.add_argument_group("output")
    o.add_argument("--out", default=str(RESULTS))
    o.add_argument("--name", default="trace", help="base name of the files written")
    o.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    for name in ("chunk_kib", "concurrency"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    for name in ("primary_chunks", "memory_chunks", "disk_chunks"):
        if getattr(args, name) < 0:
            ap.error(f"--{name.replace('_', '-')} must be >= 0")
    try:
        args.trace_options = TraceOptions(
            seed=args.seed,
            conversations=args.conversations,
            turns=args.turns,
            prefixes=args.prefixes,
            zipf_s=args.zipf_s,
            prefix_chunks=args.prefix_chunks,
            suffix_chunks=args.suffix_chunks,
        )
        args.run_names = [r.strip() for r in args.runs.split(",") if r.strip()]
        for r in args.run_names:
            parse_run(r)
    except ValueError as e:
        ap.error(str(e))
    if not args.run_names:
        ap.error("--runs names no run")
    args.chain_params = {}
    for item in args.chain_param:
        key, sep, raw = item.partition("=")
        if not sep or not key or key in ("type", "tiers"):
            ap.error(f"--chain-param takes KEY=VALUE for a chain parameter other than type and tiers; got {item!r}")
        try:
            args.chain_params[key] = json.loads(raw)
        except ValueError:
            args.chain_params[key] = raw
    return args


def _unavailable(config: dict[str, Any]) -> str | None:
    """Why a config's tier types cannot be imported here (a missing extra), or None."""
    for cfg in [config, *config.get("tiers", [])]:
        try:
            SecondaryTierFactory.get_tier_class(cfg)
        except Exception as e:
            return f"{cfg['type']}: {e}"
    return None


def _start_moto() -> tuple[Any, dict[str, Any]]:
    from bench_obj import AKID, BUCKET, SECRET, start_moto

    proc, endpoint = start_moto()
    return proc, {
        "type": "obj",
        "url": f"s3://{BUCKET}/trace",
        "endpoint": endpoint,
        "region": "us-east-1",
        "credentials": {"access_key_id": AKID, "secret_access_key": SECRET},
        "client_options": {"allow_http": True},
    }


async def _run_all(args: argparse.Namespace, trace: Trace, caps: Capacities, root: Path) -> dict[str, Any]:
    obj_cfg: dict[str, Any] | None = None
    moto: Any = None
    if args.moto:
        moto, obj_cfg = _start_moto()
    runs: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    try:
        for i, name in enumerate(args.run_names):
            where = root / f"{i:02d}-{re.sub(r'[^A-Za-z0-9]+', '-', name)}"
            config = build_config(name, where, caps, write=args.write, obj=obj_cfg)
            if config["type"] == "chain":
                config.update(args.chain_params)
            why = _unavailable(config)
            if why is not None:
                skipped[name] = why
                print(f"{name}: skipped ({why})", file=sys.stderr)
                continue
            where.mkdir(parents=True)
            print(f"{name}: replaying {len(trace.turns)} turns ...", file=sys.stderr, flush=True)
            try:
                res = await replay(
                    trace,
                    name,
                    config,
                    chunk_bytes=caps.chunk_bytes,
                    primary_chunks=args.primary_chunks,
                    concurrency=args.concurrency,
                    namespace=f"asynctier/trace/{name}",
                    shown_config=redact(config),
                )
            finally:
                await asyncio.to_thread(shutil.rmtree, where, True)
            summary = res.summary()
            summary["tiers"] = tier_rows(summary)
            summary["backlog_served"] = backlog_served(summary)
            runs.append(summary)
            status = res.error or f"prefix hit {100 * res.prefix_hit_ratio:.1f}%"
            print(f"{name}: {status} ({res.wall_s:.1f} s, CPU {res.cpu_s:.1f} s)", file=sys.stderr, flush=True)
    finally:
        if moto is not None:
            moto.terminate()
            moto.wait(10)
    return {"runs": runs, "skipped": skipped}


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    trace = generate(args.trace_options)
    distinct = trace.distinct_chunks
    chunk = args.chunk_kib * 1024
    caps = Capacities(
        memory_chunks=args.memory_chunks or max(1, distinct // 10),
        disk_chunks=args.disk_chunks or max(1, distinct // 4),
        chunk_bytes=chunk,
    )
    args.primary_chunks = args.primary_chunks or args.concurrency * trace.longest_sequence
    if args.primary_chunks < trace.longest_sequence:
        print(f"--primary-chunks must hold the longest sequence: {trace.longest_sequence} chunks", file=sys.stderr)
        return 2
    header = [
        *describe(trace),
        f"chunks of {args.chunk_kib} KiB; {args.concurrency} turns in flight; primary buffer of "
        f"{args.primary_chunks} chunks",
        f"capacities: memory {caps.memory_chunks} chunks, fs/nvme {caps.disk_chunks} chunks, obj unbounded "
        f"({'moto S3 on 127.0.0.1' if args.moto else 'file://'}); chains write '{args.write}' unless named"
        + "".join(f", {k}={v!r}" for k, v in args.chain_params.items()),
    ]
    for line in header:
        print(line, file=sys.stderr)
    own_root = args.root is None
    base = "/var/tmp" if os.path.isdir("/var/tmp") else None
    root = Path(tempfile.mkdtemp(prefix="asynctier-trace-", dir=base)) if own_root else Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    started = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    try:
        outcome = asyncio.run(_run_all(args, trace, caps, root))
    finally:
        if own_root:
            shutil.rmtree(root, ignore_errors=True)
    command = " ".join(["bench/bench_trace.py", *(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))])
    report: dict[str, Any] = {
        "command": command,
        "started": started,
        "machine": machine_info(),
        "title": f"{describe(trace)[0]}; {args.chunk_kib} KiB chunks",
        "options": {
            **args.trace_options.as_dict(),
            "chunk_bytes": chunk,
            "concurrency": args.concurrency,
            "primary_chunks": args.primary_chunks,
            "memory_chunks": caps.memory_chunks,
            "disk_chunks": caps.disk_chunks,
            "write": args.write,
            "chain_params": args.chain_params,
            "obj": "moto" if args.moto else "file://",
        },
        "trace": trace.summary(),
        **outcome,
    }
    for path in write_results(args.out, args.name, report, markdown(report, header)):
        print(f"wrote {path}", file=sys.stderr)
    if not args.no_plot:
        png = Path(args.out) / f"{args.name}.png"
        plot(report, str(png))
        print(f"wrote {png}", file=sys.stderr)
    failed = [r["name"] for r in report["runs"] if not r["ok"]]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
