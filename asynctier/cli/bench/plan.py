"""What ``asynctier bench`` will run, what it moves and roughly how long it takes, said before
the first byte moves; the progress bar counts the same bytes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..benchkit import SETTLE_LIMIT_S
from ..sizes import GiB, MiB, format_size

__all__ = [
    "CHUNKS_PER_DEPTH",
    "DEFAULT_CHUNK_SIZES",
    "DEFAULT_DATA_BYTES",
    "DEFAULT_DEPTHS",
    "LATENCY_PROBE_CHUNKS",
    "BenchOptions",
    "Plan",
]

#: Chunk sizes swept by default: a small KV block, a typical one, a large one.
DEFAULT_CHUNK_SIZES: tuple[int, ...] = (256 * 1024, 2 * MiB, 16 * MiB)
#: Concurrent chunk I/Os swept by default.
DEFAULT_DEPTHS: tuple[int, ...] = (1, 4, 16)
#: Bytes moved per (tier, chunk size, depth) point; raised to hold at least 2 x depth chunks.
DEFAULT_DATA_BYTES = 128 * MiB
#: At least this many chunks per point for each unit of depth, so every caller has work.
CHUNKS_PER_DEPTH = 2
#: One-chunk calls timed per point for the latency figures (at least ``depth``; at most the point's chunks).
LATENCY_PROBE_CHUNKS = 16

#: The rates the up-front estimate spans: guesses, said as such (a local NVMe SSD under a file
#: system, a throttled network disk); the progress bar's ETA takes this run's own rate instead.
FAST_BYTES_PER_S = 1e9
SLOW_BYTES_PER_S = 100e6
#: Fixed cost the estimate adds per measurement at best (opening the tier, starting fio).
STEP_OVERHEAD_S = 0.5


@dataclass
class BenchOptions:
    """What ``asynctier bench`` runs: tiers (name -> config), sweep, data per point, references."""

    tiers: dict[str, dict[str, Any]]
    chunk_sizes: Sequence[int] = DEFAULT_CHUNK_SIZES
    depths: Sequence[int] = DEFAULT_DEPTHS
    data_bytes: int = DEFAULT_DATA_BYTES
    root: str | None = None
    fio: bool = True
    fio_engines: Sequence[str] = ("io_uring", "psync")
    naive: bool = True
    #: Measure every point this many times, interleaved, and report the median run of each phase.
    repeat: int = 1
    #: Also time offloads into a full tier (each store evicting): a cache's steady state.
    steady: bool = False
    #: With ``steady``: untimed passes of new keys into the full tier before the timed one.
    steady_passes: int = 0
    #: The primary buffer on transparent huge pages where the system has them (as
    #: ``asynctier.buffers.allocate_buffer`` makes it); False: ordinary pages.
    huge_pages: bool = True
    command: str = "asynctier bench"

    def points(self) -> list[tuple[int, int]]:
        """Every (chunk size, depth) of the sweep, in the order they run."""
        return [(c, d) for c in self.chunk_sizes for d in self.depths]

    def chunks_for(self, chunk_bytes: int, depth: int) -> int:
        """Chunks moved at one point: ``data_bytes`` worth, at least ``CHUNKS_PER_DEPTH x depth``."""
        return max(1, self.data_bytes // chunk_bytes, CHUNKS_PER_DEPTH * depth)

    def probe_chunks(self, chunk_bytes: int, depth: int) -> int:
        """One-chunk calls timed at one point for the latency figures."""
        return min(self.chunks_for(chunk_bytes, depth), max(depth, LATENCY_PROBE_CHUNKS))

    def max_point_bytes(self) -> int:
        """The primary buffer's size: the largest point's chunks."""
        return max((c * self.chunks_for(c, d) for c, d in self.points()), default=0)


def tier_point_bytes(opts: BenchOptions, chunk: int, depth: int) -> int:
    """Bytes one tier moves at one point: the batch and the probes, each offloaded and loaded;
    with ``steady``, the batch offloaded once more into a tier half its size, and half the
    batch once per ``steady_passes`` pass."""
    chunks = opts.chunks_for(chunk, depth)
    steady = chunk * (chunks + opts.steady_passes * steady_half(chunks)) if opts.steady else 0
    return 2 * chunk * (chunks + opts.probe_chunks(chunk, depth)) + steady


def steady_half(chunks: int) -> int:
    """Chunks that fill the steady phase's tier, and chunks of each pass into it."""
    return max(1, chunks // 2)


def fio_side_bytes(size: int, rw: str) -> int:
    """Bytes one fio job moves: a read job and an overwrite job lay their file out first."""
    return size if rw == "write" else 2 * size


@dataclass
class Plan:
    """The sweep as the user sees it before it starts."""

    opts: BenchOptions
    tiers: list[str]
    skipped: dict[str, str] = field(default_factory=dict)
    fio_engines: list[str] = field(default_factory=list)

    @property
    def naive(self) -> bool:
        """Whether the naive loop runs."""
        return self.opts.naive

    def ref_bytes(self, chunk: int, depth: int) -> int:
        """Bytes fio and the naive loop move at one point."""
        size = chunk * self.opts.chunks_for(chunk, depth)
        sides = ["write", "read"] + (["overwrite"] if self.opts.steady else [])
        fio = len(self.fio_engines) * sum(fio_side_bytes(size, rw) for rw in sides)
        return fio + (2 * size if self.naive else 0)

    @property
    def total_bytes(self) -> int:
        """Every byte the run writes and reads, references included (what the bar counts)."""
        per_rep = sum(
            len(self.tiers) * tier_point_bytes(self.opts, c, d) + self.ref_bytes(c, d) for c, d in self.opts.points()
        )
        return per_rep * self.opts.repeat

    @property
    def steps(self) -> int:
        """Measurements: a tier at a point, an fio engine or the naive loop at a point."""
        per_point = len(self.tiers) + len(self.fio_engines) + (1 if self.naive else 0)
        return per_point * len(self.opts.points()) * self.opts.repeat

    @property
    def settles(self) -> int:
        """Waits for a quiet device: one before each timed write (each tier, fio, the naive loop)."""
        per_point = len(self.tiers) + (1 if self.fio_engines else 0) + (1 if self.naive else 0)
        return per_point * len(self.opts.points()) * self.opts.repeat

    @property
    def estimate_s(self) -> tuple[float, float]:
        """A rough duration, as a range: a fast medium whose device is idle at once, and a slow
        one where every settle waits its limit (:data:`~asynctier.cli.benchkit.SETTLE_LIMIT_S`)."""
        low = self.total_bytes / FAST_BYTES_PER_S + self.steps * STEP_OVERHEAD_S
        high = self.total_bytes / SLOW_BYTES_PER_S + self.steps * STEP_OVERHEAD_S + self.settles * SETTLE_LIMIT_S
        return low, high

    def describe(self) -> list[str]:
        """The plan in a few lines, for the terminal."""
        o = self.opts
        points = len(o.points())
        refs = [*(f"fio {e}" for e in self.fio_engines), *(["the naive loop"] if self.naive else [])]
        lines = [
            f"plan: {len(self.tiers)} tier{'s' * (len(self.tiers) != 1)} ({', '.join(self.tiers) or 'none'}) x "
            f"{len(o.chunk_sizes)} chunk size{'s' * (len(o.chunk_sizes) != 1)} "
            f"({', '.join(format_size(c) for c in o.chunk_sizes)}) x {len(o.depths)} "
            f"depth{'s' * (len(o.depths) != 1)} ({', '.join(map(str, o.depths))}) = "
            f"{points * len(self.tiers)} points{f', each run {o.repeat} times' if o.repeat > 1 else ''}",
            f"      references at each chunk size and depth: {', '.join(refs) if refs else 'none'}",
            f"      moves {_approx_size(self.total_bytes)} (written and read back, every byte verified)",
            f"      rough estimate {_duration(self.estimate_s[0])} to {_duration(self.estimate_s[1])} (each timed "
            f"write first waits for a quiet device, up to {SETTLE_LIMIT_S:.0f} s)",
        ]
        lines += [f"      {name}: skipped ({why})" for name, why in self.skipped.items()]
        return lines


def _approx_size(n: int) -> str:
    """``1572864`` -> ``"1.5 MiB"``: the largest unit, one decimal where it is not whole."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            return f"{n // size} {unit}" if n % size == 0 else f"{n / size:.1f} {unit}"
    return f"{n} B"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    return f"{seconds / 60:.0f} min"
