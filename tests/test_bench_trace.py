"""bench/bench_trace.py end to end at tiny sizes: the trace is what it says, every figure of the
report adds up, an unbounded tier reaches exactly the trace's ceiling, and a seed repeats a run.

A check that the benchmark is right, not a measurement: nothing here is timed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asynctier import SecondaryTierFactory

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import bench_trace  # noqa: E402
from trace_configs import Capacities, build_config, parse_run  # noqa: E402
from trace_report import backlog_served, markdown, tier_rows  # noqa: E402
from trace_workload import TraceOptions, generate  # noqa: E402

CHUNK = 4096
TINY = ["--conversations", "12", "--turns", "3", "--prefixes", "4", "--prefix-chunks", "6", "--suffix-chunks", "2"]
TINY += ["--chunk-kib", "4", "--concurrency", "1", "--seed", "7", "--memory-chunks", "16", "--disk-chunks", "32"]


def _has_obj() -> bool:
    try:
        SecondaryTierFactory.get_tier_class({"type": "obj"})
    except Exception:
        return False
    return True


def _run(out: Path, runs: list[str], *extra: str) -> dict[str, Any]:
    cmd = [sys.executable, str(REPO / "bench" / "bench_trace.py"), *TINY, "--runs", ",".join(runs)]
    cmd += ["--out", str(out), "--root", str(out / "scratch"), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout[-2000:] + r.stderr[-3000:]
    report: dict[str, Any] = json.loads((out / "trace.json").read_text())
    return report


def test_the_trace_shares_prefixes_and_grows_conversations_and_repeats_under_its_seed() -> None:
    opts = TraceOptions(seed=3, conversations=30, turns=4, prefixes=5, prefix_chunks=8, suffix_chunks=3)
    trace = generate(opts)
    assert trace.turns == generate(opts).turns
    assert trace.turns != generate(TraceOptions(seed=4, conversations=30, turns=4, prefixes=5)).turns
    assert [t.time_s for t in trace.turns] == sorted(t.time_s for t in trace.turns)
    last: dict[int, tuple[bytes, ...]] = {}
    for t in trace.turns:
        assert t.new == 3 and len(set(t.keys)) == len(t.keys)
        if t.conversation in last:  # a turn extends its conversation's previous turn
            prev = last[t.conversation]
            assert t.keys[: len(prev)] == prev and len(t.keys) == len(prev) + 3
        else:
            assert t.index == 0 and 4 <= t.reusable <= 8  # the shared prefix alone
        last[t.conversation] = t.keys
    by_prefix: dict[int, set[bytes]] = {}
    for t in trace.turns:  # every conversation on one prefix starts with the same keys
        by_prefix.setdefault(t.prefix, set()).add(t.keys[0])
    assert all(len(firsts) == 1 for firsts in by_prefix.values())
    # Zipf: the most popular prefix opens more conversations than the least popular
    opens = [sum(1 for t in trace.turns if t.index == 0 and t.prefix == p) for p in range(5)]
    assert opens[0] > opens[4]
    assert 0 < trace.ideal_hit_chunks() <= sum(t.reusable for t in trace.turns)


def test_run_names_build_tiers_and_chains_and_refuse_what_is_not_one(tmp_path: Path) -> None:
    caps = Capacities(memory_chunks=4, disk_chunks=8, chunk_bytes=CHUNK)
    assert build_config("memory", tmp_path, caps) == {"type": "memory", "capacity_bytes": 4 * CHUNK}
    chain = build_config("memory+fs+obj:through", tmp_path, caps)
    assert chain["type"] == "chain" and chain["write"] == "through"
    assert [t["type"] for t in chain["tiers"]] == ["memory", "fs", "obj"]
    assert chain["tiers"][1]["capacity_bytes"] == 8 * (CHUNK + 4096)  # the header block counted
    assert build_config("memory+fs", tmp_path, caps, write="back")["write"] == "back"
    assert parse_run("fs") == (["fs"], None)
    for bad, needle in (("disk", "unknown tier 'disk'"), ("fs+fs", "twice"), ("fs:through", "after a chain")):
        with pytest.raises(ValueError, match=needle):
            parse_run(bad)


def _check_run(run: dict[str, Any], trace: dict[str, Any]) -> None:
    """Every figure of one run adds up."""
    assert run["ok"], run["error"]
    c = run["counters"]
    assert c["lookups"] == trace["turns"] == c["hit_turns"] + c["miss_turns"]
    assert c["prompt_chunks"] == trace["prompt_chunks"] == c["loaded_chunks"] + c["computed_chunks"]
    assert c["loaded_chunks"] <= c["lookup_hit_chunks"] <= c["reusable_chunks"]
    assert c["wrong_content_chunks"] == c["load_failed_chunks"] == c["offload_failed_chunks"] == 0
    assert c["offloaded_chunks"] == c["computed_chunks"]
    # a chunk the lookup found may be evicted before its load (a miss: lookup is a hint); the
    # prefix ends there and the chunks loaded after it are of no use
    if not c["load_missed_chunks"]:
        assert c["loaded_unused_chunks"] == 0
    read = c["loaded_chunks"] + c["loaded_unused_chunks"]
    assert c["bytes_loaded"] == CHUNK * read
    assert run["prefix_hit_ratio"] == pytest.approx(c["loaded_chunks"] / c["prompt_chunks"])
    lat = run["latency"]
    assert lat["lookup"]["count"] == c["lookups"] and lat["turn_offload"]["count"] == c["lookups"]
    assert lat["turn_load"]["count"] == lat["chunk_load"]["count"] <= c["lookups"]
    assert lat["turn_load"]["p99_s"] >= lat["turn_load"]["p50_s"] > 0
    tiers = run["tiers"]
    # each chunk loaded came from exactly one tier, or from a chain's write-back queue (a chunk
    # the first tier evicted before the tier below had it)
    assert sum(t["served"] for t in tiers) + run["backlog_served"] == read
    if run["config"]["type"] != "chain" or run["config"].get("write") == "through":
        assert run["backlog_served"] == 0
    assert tiers[0]["reaching"] == c["reusable_chunks"]
    st = run["stats"]  # the tier's (or the chain's) own count of what it gave the caller
    assert st["loaded"] == read and st["bytes_read"] == c["bytes_loaded"]
    assert st["offloaded"] + st["skipped"] == c["offloaded_chunks"]
    assert st["bytes_written"] == CHUNK * st["offloaded"]
    for t in tiers:  # a chain's tier may also read for promotions, and write what is promoted into it
        assert t["bytes_read"] >= CHUNK * t["served"] and t["bytes_written"] == CHUNK * t["offloaded"]
    if run["config"]["type"] != "chain":
        (t,) = tiers
        assert t["bytes_read"] == st["bytes_read"] and t["bytes_written"] == st["bytes_written"]


def test_bench_trace_reports_figures_that_add_up_and_repeat_under_a_seed(tmp_path: Path) -> None:
    runs = ["memory", "fs", "nvme"] + (["obj"] if _has_obj() else [])
    report = _run(tmp_path / "a", runs)
    trace = report["trace"]
    assert [r["name"] for r in report["runs"]] == runs and not report["skipped"]
    for run in report["runs"]:
        _check_run(run, trace)
    by = {r["name"]: r for r in report["runs"]}
    # 16 chunks in memory against 32 on disk: memory serves fewer
    assert by["memory"]["counters"]["loaded_chunks"] < by["fs"]["counters"]["loaded_chunks"]
    assert by["memory"]["stats"]["evictions"] > 0
    if "obj" in by:  # unbounded, one turn at a time: exactly what an infinite cache serves
        assert by["obj"]["counters"]["loaded_chunks"] == trace["ideal_hit_chunks"]
    md = (tmp_path / "a" / "trace.md").read_text()
    assert report["command"] in md and all(f"| {name} |" in md for name in runs)
    assert (tmp_path / "a" / "trace.png").stat().st_size > 0
    assert not any((tmp_path / "a" / "scratch").iterdir())  # every run's files are gone

    again = _run(tmp_path / "b", runs, "--no-plot")
    assert [r["counters"] for r in again["runs"]] == [r["counters"] for r in report["runs"]]
    assert [r["tiers"] for r in again["runs"]] == [r["tiers"] for r in report["runs"]]
    assert not (tmp_path / "b" / "trace.png").exists()


def test_bench_trace_through_chains_serves_each_hit_from_one_tier(tmp_path: Path) -> None:
    runs = ["memory+fs:through", "memory+nvme"] + (["memory+fs+obj:through"] if _has_obj() else [])
    report = _run(tmp_path, runs, "--no-plot")
    for run in report["runs"]:
        _check_run(run, report["trace"])
        assert run["config"]["type"] == "chain" and len(run["tiers"]) == run["name"].count("+") + 1
    by = {r["name"]: r for r in report["runs"]}
    # memory holds 16 chunks: the fs tier behind it serves what memory evicted
    assert by["memory+fs:through"]["tiers"][1]["served"] > 0
    if "memory+fs+obj:through" in by:  # the unbounded last tier: the trace's ceiling
        assert by["memory+fs+obj:through"]["counters"]["loaded_chunks"] == report["trace"]["ideal_hit_chunks"]


def test_chunks_served_from_a_chains_write_back_queue_are_a_row_of_their_own() -> None:
    """A write-back chain looks in its queue after the first tier: those chunks never reached the
    second tier, and the report says where they came from."""

    def tier(loaded: int, hits: int) -> dict[str, Any]:
        return {"loaded": loaded, "bytes_read": loaded * CHUNK, "bytes_written": 0, "extra": {"chain_hits": hits}}

    stats = {
        "loaded": 10,
        "children": {"0:memory": tier(6, 6), "1:fs": tier(3, 3)},
        "extra": {"backlog_hits": 1},
    }
    run: dict[str, Any] = {"stats": stats, "config": {"type": "chain"}, "counters": {"reusable_chunks": 12}}
    rows = tier_rows(run)
    assert backlog_served(run) == 1 and [r["served"] for r in rows] == [6, 3]
    assert [r["reaching"] for r in rows] == [12, 5]  # 12 - 6 served by memory - 1 by the queue
    assert backlog_served({"stats": {"loaded": 3, "extra": {"backlog_hits": 9}}}) == 0  # not a chain
    lat = {k: {"p50_s": 0.001, "p99_s": 0.002} for k in ("turn_load", "chunk_load", "lookup", "turn_offload")}
    run.update(name="memory+fs", ok=True, tiers=rows, backlog_served=1, latency=lat, prefix_hit_ratio=0.5)
    run.update(turn_hit_ratio=0.5, cpu_us_per_chunk_moved=1.0, cpu_s=0.1, wall_s=0.2)
    text = markdown({"runs": [run], "command": "x", "trace": {"ideal_hit_chunks": 6, "prompt_chunks": 12}}, [])
    lines = [line for line in text.splitlines() if line.startswith("| memory+fs |")]
    assert [line.split("|")[2].strip() for line in lines[1:]] == ["0:memory", "write-back queue", "1:fs"]
    assert lines[2].split("|")[3].strip() == "1" and lines[2].split("|")[4].strip() == "16.7"  # 1 of 6


def test_bench_trace_refuses_bad_options_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for args, needle in (
        (["--runs", "memory+disk"], "unknown tier 'disk'"),
        (["--conversations", "0"], "conversations must be an int >= 1"),
        (["--chunk-kib", "0"], "--chunk-kib must be >= 1"),
        (["--primary-chunks", "2"], "must hold the longest sequence"),
        (["--chain-param", "tiers=[]"], "--chain-param takes KEY=VALUE"),
    ):
        try:
            status = bench_trace.main([*args, "--out", str(tmp_path)])
        except SystemExit as e:  # argparse's way out
            status = e.code
        err = capsys.readouterr().err
        assert status == 2 and needle in err, (args, err)
    assert not any(tmp_path.iterdir())  # refused before anything ran or was written
