"""Replay a chat trace through one tier (or chain) as a prefix-caching server would, through
the public API only, and count what happened.

Each turn: ``lookup_prefix`` over the sequence's keys; ``load`` that many leading chunks into
primary slots; "compute" the rest (no compute: each slot is stamped with its key, so a load
that brought back the wrong chunk is caught); ``offload`` the chunks computed. Turns of one
conversation run in order; up to ``concurrency`` turns run at once, each holding as many
primary slots as its sequence has chunks.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from trace_workload import KEY_BYTES, Trace, Turn

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.errors import failure_kind
from asynctier.posix_io import aligned_buffer
from asynctier.stats import TierStats

__all__ = ["Counters", "ReplayResult", "percentile", "replay"]


def percentile(samples: Sequence[float], p: float) -> float:
    """Nearest rank: the smallest sample with at least ``p`` of them at or below (0 when empty)."""
    if not samples:
        return 0.0
    s = sorted(samples)
    return s[max(0, math.ceil(p * len(s)) - 1)]


@dataclass
class Counters:
    """What the server saw, summed over the turns. Self-consistent by construction:
    ``hit_turns + miss_turns == lookups`` and ``loaded + computed == prompt``."""

    lookups: int = 0
    hit_turns: int = 0
    miss_turns: int = 0
    prompt_chunks: int = 0
    reusable_chunks: int = 0
    lookup_hit_chunks: int = 0
    loaded_chunks: int = 0
    #: chunks loaded after one that failed (evicted since the lookup): read, but of no use
    loaded_unused_chunks: int = 0
    #: chunks the lookup found and the load did not: evicted in between (a miss; lookup is a hint)
    load_missed_chunks: int = 0
    #: chunks whose load failed otherwise (I/O, checksum, timeout, ...): the run is marked failed
    load_failed_chunks: int = 0
    computed_chunks: int = 0
    offloaded_chunks: int = 0
    offload_failed_chunks: int = 0
    bytes_loaded: int = 0
    bytes_offloaded: int = 0
    wrong_content_chunks: int = 0


@dataclass
class ReplayResult:
    """One configuration's run of the trace: counters, latencies, and the tier's own stats."""

    name: str
    config: dict[str, Any]
    counters: Counters = field(default_factory=Counters)
    turn_load_s: list[float] = field(default_factory=list)
    chunk_load_s: list[float] = field(default_factory=list)
    lookup_s: list[float] = field(default_factory=list)
    turn_offload_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def prefix_hit_ratio(self) -> float:
        """Share of the chunks asked for that came from the tiers instead of being computed."""
        c = self.counters
        return c.loaded_chunks / c.prompt_chunks if c.prompt_chunks else 0.0

    def summary(self) -> dict[str, Any]:
        """Every figure as plain data (for JSON)."""
        c = self.counters
        lat = {
            name: {"count": len(xs), "p50_s": percentile(xs, 0.5), "p99_s": percentile(xs, 0.99)}
            for name, xs in (
                ("turn_load", self.turn_load_s),
                ("chunk_load", self.chunk_load_s),
                ("lookup", self.lookup_s),
                ("turn_offload", self.turn_offload_s),
            )
        }
        return {
            "name": self.name,
            "config": self.config,
            "ok": self.error is None,
            "error": self.error,
            "counters": asdict(c),
            "prefix_hit_ratio": self.prefix_hit_ratio,
            "turn_hit_ratio": c.hit_turns / c.lookups if c.lookups else 0.0,
            "reusable_hit_ratio": c.loaded_chunks / c.reusable_chunks if c.reusable_chunks else 0.0,
            "latency": lat,
            "wall_s": self.wall_s,
            "cpu_s": self.cpu_s,
            "cpu_us_per_chunk_moved": 1e6 * self.cpu_s / max(1, c.loaded_chunks + c.offloaded_chunks),
            "stats": self.stats,
        }


def stats_dict(st: TierStats) -> dict[str, Any]:
    """A :class:`TierStats` snapshot as plain data."""
    out = asdict(st)
    out["failed"] = st.failed
    return out


class SlotPool:
    """The primary buffer's free slots; a turn takes all the slots it needs at once, so two
    waiting turns never hold half of what each needs."""

    def __init__(self, n: int) -> None:
        self._free = list(range(n - 1, -1, -1))
        self._cond = asyncio.Condition()

    async def take(self, n: int) -> list[int]:
        async with self._cond:
            await self._cond.wait_for(lambda: len(self._free) >= n)
            return [self._free.pop() for _ in range(n)]

    async def give(self, slots: list[int]) -> None:
        async with self._cond:
            self._free.extend(reversed(slots))
            self._cond.notify_all()


class _Server:
    """The replaying server: a tier, the primary buffer, and the counters it keeps."""

    def __init__(self, tier: Any, view: memoryview, chunk_bytes: int, slots: int, res: ReplayResult) -> None:
        self.tier, self.view, self.chunk, self.res = tier, view, chunk_bytes, res
        self.pool = SlotPool(slots)

    def _stamp(self, slot: int, key: bytes) -> None:
        # the key at both ends of the chunk: a load into the wrong slot or a torn one shows
        base = slot * self.chunk
        self.view[base : base + KEY_BYTES] = key
        self.view[base + self.chunk - KEY_BYTES : base + self.chunk] = key

    def _holds(self, slot: int, key: bytes) -> bool:
        base = slot * self.chunk
        end = base + self.chunk
        return self.view[base : base + KEY_BYTES] == key and self.view[end - KEY_BYTES : end] == key

    async def turn(self, turn: Turn) -> None:
        c, keys = self.res.counters, list(turn.keys)
        t = time.perf_counter()
        hit = await self.tier.lookup_prefix(keys)
        self.res.lookup_s.append(time.perf_counter() - t)
        c.lookups += 1
        c.prompt_chunks += len(keys)
        c.reusable_chunks += turn.reusable
        c.lookup_hit_chunks += hit
        slots = await self.pool.take(len(keys))
        try:
            usable = await self._load_prefix(keys[:hit], slots[:hit]) if hit else 0
            c.loaded_chunks += usable
            c.hit_turns += int(usable > 0)
            c.miss_turns += int(usable == 0)
            for i in range(usable, len(keys)):
                self._stamp(slots[i], keys[i])
            c.computed_chunks += len(keys) - usable
            t = time.perf_counter()
            r = await self.tier.offload(keys[usable:], slots[usable:])
            self.res.turn_offload_s.append(time.perf_counter() - t)
            c.offloaded_chunks += len(r.succeeded)
            c.offload_failed_chunks += len(r.failed)
            c.bytes_offloaded += r.bytes_transferred
        finally:
            await self.pool.give(slots)

    async def _load_prefix(self, keys: list[bytes], slots: list[int]) -> int:
        """Load ``keys`` into ``slots``; returns how many leading chunks came back right."""
        c = self.res.counters
        for s in slots:  # what a slot held before must not pass for a loaded chunk
            self.view[s * self.chunk : s * self.chunk + KEY_BYTES] = bytes(KEY_BYTES)
        t = time.perf_counter()
        r = await self.tier.load(keys, slots)
        dt = time.perf_counter() - t
        self.res.turn_load_s.append(dt)
        self.res.chunk_load_s.append(dt / len(keys))
        c.bytes_loaded += r.bytes_transferred
        missed = sum(1 for e in r.failed.values() if failure_kind(e) == "not_found")
        c.load_missed_chunks += missed
        c.load_failed_chunks += len(r.failed) - missed
        usable = 0
        while usable < len(keys) and keys[usable] not in r.failed:
            usable += 1
        bad = [i for i in range(usable) if not self._holds(slots[i], keys[i])]
        if bad:  # counted and reported: the run is then marked failed
            c.wrong_content_chunks += len(bad)
            usable = bad[0]
        c.loaded_unused_chunks += len(r.succeeded) - usable
        return usable


async def replay(
    trace: Trace,
    name: str,
    config: Mapping[str, Any],
    *,
    chunk_bytes: int,
    primary_chunks: int,
    concurrency: int,
    namespace: str,
    shown_config: Mapping[str, Any] | None = None,
) -> ReplayResult:
    """Replay ``trace`` through a tier built from ``config``; never raises for the tier's failures
    (they are counted, or the result carries the error)."""
    res = ReplayResult(name, dict(shown_config if shown_config is not None else config))
    longest = trace.longest_sequence
    if longest > primary_chunks:
        raise ValueError(f"the primary buffer holds {primary_chunks} chunks; the longest sequence needs {longest}")
    view = aligned_buffer(chunk_bytes * primary_chunks)
    spec = OffloadingSpec(chunk_bytes, primary_chunks, namespace=namespace)
    w0, c0 = time.perf_counter(), time.process_time()
    try:
        tier = SecondaryTierFactory.create_secondary_tier(dict(config), view, spec)
        async with tier:
            server = _Server(tier, view, chunk_bytes, primary_chunks, res)
            await _drive(trace.turns, server, concurrency)
            await tier.drain()
            res.stats = stats_dict(tier.stats())
    except Exception as e:
        res.error = f"{type(e).__name__}: {e}"
    res.wall_s, res.cpu_s = time.perf_counter() - w0, time.process_time() - c0
    if res.error is None and res.counters.wrong_content_chunks:
        res.error = f"{res.counters.wrong_content_chunks} loaded chunks held another chunk's bytes"
    return res


async def _drive(turns: Sequence[Turn], server: _Server, concurrency: int) -> None:
    """Start the turns in arrival order, at most ``concurrency`` at once; a turn starts only after
    its conversation's previous turn has finished (the reply it continues)."""
    sem = asyncio.Semaphore(concurrency)
    done: dict[tuple[int, int], asyncio.Event] = {}
    errors: list[BaseException] = []

    async def run(turn: Turn, after: asyncio.Event | None) -> None:
        try:
            if after is not None:
                await after.wait()
            await server.turn(turn)
        except Exception as e:
            errors.append(e)
        finally:
            done[(turn.conversation, turn.index)].set()
            sem.release()

    tasks: list[asyncio.Task[None]] = []
    for turn in turns:
        if errors:
            break
        await sem.acquire()
        done[(turn.conversation, turn.index)] = asyncio.Event()
        tasks.append(asyncio.create_task(run(turn, done.get((turn.conversation, turn.index - 1)))))
    await asyncio.gather(*tasks)
    if errors:
        raise errors[0]
