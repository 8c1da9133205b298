"""A synthetic multi-turn chat trace for ``bench_trace.py``: what a prefix-caching server is asked.

Every conversation opens with one of ``prefixes`` shared prefixes (a system prompt, a
document), picked with Zipf popularity, then grows by ``suffix_chunks`` chunks a turn (the
user's message and the reply). Conversations arrive at random times and their turns follow
after random think times, so turns of many conversations interleave, as a server sees them.
A chunk's key chains its predecessor's (like a prefix hash over token blocks), so two
sequences share keys exactly as far as they share content. Everything derives from ``seed``.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Trace", "TraceOptions", "Turn", "describe", "generate"]

KEY_BYTES = 32


@dataclass(frozen=True)
class TraceOptions:
    """The workload's shape; every figure of a run is a function of these and the tiers."""

    seed: int = 1
    conversations: int = 200
    #: Turns per conversation: each conversation draws its count uniformly from 1..turns.
    turns: int = 6
    prefixes: int = 24
    #: Zipf exponent of the prefixes' popularity (prefix of rank r is chosen ~ 1/r**s).
    zipf_s: float = 1.1
    #: Chunks of each shared prefix: drawn uniformly from prefix_chunks//2 .. prefix_chunks.
    prefix_chunks: int = 16
    #: Chunks a turn adds to its conversation (message and reply together).
    suffix_chunks: int = 4
    #: Mean seconds between conversation arrivals and between turns of one conversation
    #: (exponential); only the order they give matters: the replay does not sleep.
    arrival_s: float = 1.0
    think_s: float = 20.0

    def __post_init__(self) -> None:
        for name in ("conversations", "turns", "prefixes", "prefix_chunks", "suffix_chunks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1; got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an int; got {self.seed!r}")
        for name in ("zipf_s", "arrival_s", "think_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a number > 0; got {value!r}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Turn:
    """One request: the sequence's keys in order; the last ``new`` of them are this turn's own."""

    time_s: float
    conversation: int
    index: int
    prefix: int
    keys: tuple[bytes, ...]
    new: int

    @property
    def reusable(self) -> int:
        """Chunks that existed before this turn (the shared prefix and the conversation so far)."""
        return len(self.keys) - self.new


@dataclass(frozen=True)
class Trace:
    """The turns in arrival order, with the figures an infinite cache would reach on them."""

    options: TraceOptions
    turns: list[Turn]

    @property
    def distinct_chunks(self) -> int:
        return len({k for t in self.turns for k in t.keys})

    @property
    def prompt_chunks(self) -> int:
        return sum(len(t.keys) for t in self.turns)

    @property
    def longest_sequence(self) -> int:
        return max(len(t.keys) for t in self.turns)

    def ideal_hit_chunks(self) -> int:
        """Chunks an unbounded cache serves: each turn's longest prefix seen before (every
        chunk of an earlier turn is stored once that turn is done)."""
        seen: set[bytes] = set()
        hits = 0
        for t in self.turns:
            n = 0
            for k in t.keys:
                if k not in seen:
                    break
                n += 1
            hits += n
            seen.update(t.keys)
        return hits

    def summary(self) -> dict[str, Any]:
        return {
            "turns": len(self.turns),
            "prompt_chunks": self.prompt_chunks,
            "distinct_chunks": self.distinct_chunks,
            "longest_sequence": self.longest_sequence,
            "ideal_hit_chunks": self.ideal_hit_chunks(),
        }


def _chain(parent: bytes, label: str) -> bytes:
    return hashlib.blake2b(parent + label.encode(), digest_size=KEY_BYTES).digest()


def _zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (rank**s) for rank in range(1, n + 1)]


def _prefix_keys(rng: random.Random, opts: TraceOptions) -> list[tuple[bytes, ...]]:
    out: list[tuple[bytes, ...]] = []
    for p in range(opts.prefixes):
        n = rng.randint(max(1, opts.prefix_chunks // 2), opts.prefix_chunks)
        keys: list[bytes] = []
        parent = f"seed{opts.seed}".encode()
        for i in range(n):
            parent = _chain(parent, f"prefix{p}/{i}")
            keys.append(parent)
        out.append(tuple(keys))
    return out


def generate(opts: TraceOptions) -> Trace:
    """The trace of ``opts``: the same turns, keys and order for the same options."""
    rng = random.Random(opts.seed)
    prefixes = _prefix_keys(rng, opts)
    weights = _zipf_weights(opts.prefixes, opts.zipf_s)
    turns: list[Turn] = []
    start = 0.0
    for c in range(opts.conversations):
        start += rng.expovariate(1.0 / opts.arrival_s)
        p = rng.choices(range(opts.prefixes), weights=weights)[0]
        keys: list[bytes] = list(prefixes[p])
        when = start
        for t in range(rng.randint(1, opts.turns)):
            if t:
                when += rng.expovariate(1.0 / opts.think_s)
            parent = keys[-1]
            for j in range(opts.suffix_chunks):
                parent = _chain(parent, f"conv{c}/turn{t}/{j}")
                keys.append(parent)
            turns.append(Turn(when, c, t, p, tuple(keys), opts.suffix_chunks))
    turns.sort(key=lambda t: (t.time_s, t.conversation, t.index))
    return Trace(opts, turns)


def describe(trace: Trace) -> Sequence[str]:
    """The trace in a few lines, for the terminal and the markdown report."""
    o, s = trace.options, trace.summary()
    return [
        f"{s['turns']} turns of {o.conversations} conversations (1..{o.turns} turns each, seed {o.seed}); "
        f"{o.prefixes} shared prefixes of {max(1, o.prefix_chunks // 2)}..{o.prefix_chunks} chunks, Zipf s={o.zipf_s}; "
        f"{o.suffix_chunks} new chunks a turn",
        f"{s['prompt_chunks']} chunks asked for, {s['distinct_chunks']} distinct; an unbounded cache would "
        f"serve {s['ideal_hit_chunks']} ({s['ideal_hit_chunks'] / max(1, s['prompt_chunks']):.1%})",
    ]
