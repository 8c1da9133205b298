"""``asynctier bench`` and ``asynctier fsck``: the main job, measured against the machine.

``asynctier bench`` fills a primary buffer (a torch tensor when torch is installed, pinned
when CUDA is available) with random bytes, then for every tier, chunk size and depth:

1. **offload**: one ``offload`` call with every chunk of the point, the tier built with
   ``max_inflight=depth`` (so ``depth`` chunk I/Os are in flight, as fio's ``iodepth``), timed
   until the bytes are on the medium (a ``syncfs`` inside the timed window);
2. **lookup**: one call with every stored key and one with as many absent keys;
3. **load**: one call, from a cold page cache, into *other* slots than the ones offloaded
   from, after zeroing the buffer;
4. **verify**: every byte loaded is compared with what was offloaded;
5. **latency**: ``depth`` callers, each awaiting one-chunk ``offload`` (then ``load``) calls
   back to back, on a few more chunks: the p50/p99 a caller waiting for one chunk sees.
   These are loaded and verified too.

Before each timed write (the tiers', fio's, the naive loop's) the device is let settle
(:func:`asynctier.benchkit.settle`): on a file system mounted with ``discard``, the
deletes of the previous point leave work that would otherwise land on whoever writes next.
In the same run and on the same file system it measures fio (same block size and depth,
O_DIRECT) and a naive aiofiles loop (one file per chunk), and reports the tiers' throughput
as ratios of both. This module is imported lazily by the CLI: ``import asynctier`` stays light.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as _dt
import hashlib
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import benchkit
from .errors import TierConfigError
from .factory import SecondaryTierFactory, accepted_parameters
from .spec import OffloadingSpec
from .stats import TransferResult

__all__ = [
    "BenchOptions",
    "BenchReport",
    "DEFAULT_CHUNK_SIZES",
    "DEFAULT_DATA_BYTES",
    "DEFAULT_DEPTHS",
    "DEFAULT_TIERS",
    "FsckReport",
    "Phase",
    "PointResult",
    "RefResult",
    "TierFile",
    "format_size",
    "fsck",
    "load_tier_file",
    "parse_size",
    "render_markdown",
    "render_tables",
    "resolve_tiers",
    "run_bench",
    "spec_from_table",
    "total_steps",
    "uses_placeholders",
    "write_plot",
]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

#: Chunk sizes swept by default: a small KV block, a typical one, a large one.
DEFAULT_CHUNK_SIZES: tuple[int, ...] = (256 * KiB, 2 * MiB, 16 * MiB)
#: Concurrent chunk I/Os swept by default.
DEFAULT_DEPTHS: tuple[int, ...] = (1, 4, 16)
#: Bytes moved per (tier, chunk size, depth) point; raised to hold at least 2 x depth chunks.
DEFAULT_DATA_BYTES = 128 * MiB
#: At least this many chunks per point for each unit of depth, so every caller has work.
CHUNKS_PER_DEPTH = 2
#: One-chunk calls timed per point for the latency figures (at least ``depth``; at most the point's chunks).
LATENCY_PROBE_CHUNKS = 16

#: The embedded defaults: every point gets a fresh directory for ``{dir}``; ``"{capacity}"``
#: becomes a byte count that holds the point's chunks twice over.
DEFAULT_TIERS: dict[str, dict[str, Any]] = {
    "fs": {"type": "fs", "root": "{dir}"},
    "nvme": {"type": "nvme", "path": "{dir}/slab", "capacity_bytes": "{capacity}"},
    "obj": {"type": "obj", "url": "file://{dir}"},
}
#: Configs used for ``--tier TYPE`` when TYPE is not named in a config file.
_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {**DEFAULT_TIERS, "memory": {"type": "memory"}}

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Parse ``"256K"``, ``"2MiB"``, ``"1.5G"``, ``"4096"`` (binary units) into bytes."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text <= 0:
            raise ValueError(f"size must be positive; got {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 256K, 2MiB, 1G, 4096)")
    unit = {"": 1, "k": KiB, "m": MiB, "g": GiB, "t": GiB << 10}[m.group(2).lower()]
    value = int(float(m.group(1)) * unit)
    if value <= 0:
        raise ValueError(f"size must be positive; got {text!r}")
    return value


def format_size(n: int) -> str:
    """``262144`` -> ``"256 KiB"``."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


# -- tier files (TOML) -----------------------------------------------------------------------


@dataclass
class TierFile:
    """A parsed tier file: named tier configs, the layout (``[spec]``), bench defaults (``[bench]``)."""

    tiers: dict[str, dict[str, Any]]
    spec: dict[str, Any] = field(default_factory=dict)
    bench: dict[str, Any] = field(default_factory=dict)
    path: str = ""


def _toml_loads(text: str) -> dict[str, Any]:
    import importlib

    name = "tomllib" if sys.version_info >= (3, 11) else "tomli"  # tomllib is 3.11+
    try:
        toml: Any = importlib.import_module(name)
    except ImportError as e:  # pragma: no cover - 3.10 without the bench extra
        raise TierConfigError(
            "reading a tier file on Python 3.10 needs 'tomli' (pip install 'asynctier[bench]')"
        ) from e
    out: dict[str, Any] = toml.loads(text)
    return out


def load_tier_file(path: str | os.PathLike[str]) -> TierFile:
    """Read a TOML tier file.

    Either one table per tier under ``[tiers.NAME]`` (``type`` defaults to NAME), or a single
    tier given by top-level keys (``type = "fs"``, ``root = ...``). Optional tables: ``[spec]``
    (``chunk_bytes``, ``namespace``: the layout the chunks were written with, needed by fsck)
    and ``[bench]`` (``chunk_sizes``, ``depths``, ``data_size``). Raises
    :class:`~asynctier.errors.TierConfigError` for a malformed file.
    """
    p = Path(path)
    try:
        raw = _toml_loads(p.read_text())
    except OSError as e:
        raise TierConfigError(f"cannot read tier file {str(p)!r}: {e}") from e
    except ValueError as e:  # tomllib.TOMLDecodeError is a ValueError
        raise TierConfigError(f"{p}: not valid TOML: {e}") from e
    spec = raw.pop("spec", {})
    bench = raw.pop("bench", {})
    if not isinstance(spec, dict) or not isinstance(bench, dict):
        raise TierConfigError(f"{p}: [spec] and [bench] must be tables")
    tiers: dict[str, dict[str, Any]] = {}
    table = raw.pop("tiers", None)
    if table is not None:
        if not isinstance(table, dict):
            raise TierConfigError(f"{p}: 'tiers' must be a table of [tiers.NAME] tables")
        for name, cfg in table.items():
            if not isinstance(cfg, dict):
                raise TierConfigError(f"{p}: [tiers.{name}] must be a table")
            tiers[name] = {"type": name, **cfg}
    if "type" in raw:
        tiers[str(raw["type"])] = dict(raw)
    elif raw:
        raise TierConfigError(
            f"{p}: unexpected top-level keys {sorted(raw)}; put tier configs in [tiers.NAME] tables "
            "or give a single tier with a top-level 'type'"
        )
    if not tiers:
        raise TierConfigError(f"{p}: no tier configured (add a [tiers.NAME] table)")
    return TierFile(tiers=tiers, spec=dict(spec), bench=dict(bench), path=str(p))


def spec_from_table(table: Mapping[str, Any], *, default_namespace: str = "default") -> OffloadingSpec:
    """An :class:`OffloadingSpec` from a ``[spec]`` table (``chunk_bytes`` required)."""
    if "chunk_bytes" not in table:
        raise TierConfigError("the tier file's [spec] table needs 'chunk_bytes' (the chunk size the tier holds)")
    unknown = sorted(set(table) - {"chunk_bytes", "namespace", "num_chunks"})
    if unknown:
        raise TierConfigError(f"[spec]: unknown keys {unknown}; accepted: chunk_bytes, namespace, num_chunks")
    try:
        chunk = parse_size(table["chunk_bytes"])
    except ValueError as e:
        raise TierConfigError(f"[spec] chunk_bytes: {e}") from e
    num = table.get("num_chunks", 1)
    if isinstance(num, bool) or not isinstance(num, int):
        raise TierConfigError(f"[spec] num_chunks must be an int; got {num!r}")
    return OffloadingSpec(chunk, num, str(table.get("namespace", default_namespace)))


def _substitute(value: Any, mapping: Mapping[str, Any]) -> Any:
    """Replace ``{dir}`` in strings and the exact string ``"{capacity}"`` (an int) in a config."""
    if isinstance(value, str):
        if value == "{capacity}":
            return mapping["capacity"]
        return value.replace("{dir}", str(mapping["dir"]))
    if isinstance(value, dict):
        return {k: _substitute(v, mapping) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, mapping) for v in value]
    return value


def resolve_tiers(names: Sequence[str], tier_file: TierFile | None) -> dict[str, dict[str, Any]]:
    """The tiers ``asynctier bench`` runs: ``names`` looked up in the tier file, else taken as
    tier types with their embedded default config; no names: every tier of the file, else
    :data:`DEFAULT_TIERS`."""
    available = dict(tier_file.tiers) if tier_file else {k: dict(v) for k, v in DEFAULT_TIERS.items()}
    if not names:
        return available
    return {n: dict(available[n]) if n in available else dict(_TYPE_DEFAULTS.get(n, {"type": n})) for n in names}


def uses_placeholders(config: Mapping[str, Any]) -> bool:
    """Whether a config holds bench placeholders (``{dir}``, ``"{capacity}"``)."""
    return _uses_dir(dict(config)) or "{capacity}" in repr(dict(config))


def _uses_dir(value: Any) -> bool:
    if isinstance(value, str):
        return "{dir}" in value
    if isinstance(value, dict):
        return any(_uses_dir(v) for v in value.values())
    if isinstance(value, list):
        return any(_uses_dir(v) for v in value)
    return False


def _redact(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config safe to print or store: values of secret-looking keys hidden."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        if re.search(r"secret|password|token|credential|access_key|key_id|sas", k, re.IGNORECASE):
            out[k] = "***"
        elif isinstance(v, dict):
            out[k] = _redact(v)
        else:
            out[k] = v
    return out


# -- results ----------------------------------------------------------------------------------


@dataclass
class Phase:
    """One timed phase: throughput, chunk operations per second, per-chunk latency (seconds)."""

    seconds: float
    bytes_per_s: float
    ops_per_s: float
    lat_p50_s: float = 0.0
    lat_p99_s: float = 0.0
    lat_max_s: float = 0.0

    @classmethod
    def of(cls, seconds: float, nbytes: int, nops: int, latencies: Sequence[float] = ()) -> Phase:
        """Build from a duration, the bytes and chunk operations it covered, and their latencies."""
        lat = sorted(latencies)
        s = max(seconds, 1e-9)
        return cls(
            seconds=seconds,
            bytes_per_s=nbytes / s,
            ops_per_s=nops / s,
            lat_p50_s=benchkit.percentile(lat, 0.50),
            lat_p99_s=benchkit.percentile(lat, 0.99),
            lat_max_s=lat[-1] if lat else 0.0,
        )


@dataclass
class RefResult:
    """fio and the naive loop at one (chunk size, depth): the references a tier is divided by."""

    chunk_bytes: int
    depth: int
    chunks: int
    fio_write: dict[str, Any] | None = None
    fio_read: dict[str, Any] | None = None
    naive_write: Phase | None = None
    naive_read: Phase | None = None
    notes: list[str] = field(default_factory=list)
    #: Runs these figures are the median of (``--repeat``).
    repeats: int = 1

    def fio_bps(self, side: str) -> float:
        """Best fio bytes/s for ``"write"`` or ``"read"`` (0 when fio did not run)."""
        r = self.fio_write if side == "write" else self.fio_read
        return float(r["bytes_per_s"]) if r else 0.0

    def naive_bps(self, side: str) -> float:
        """Naive loop bytes/s for ``"write"`` or ``"read"`` (0 when it did not run)."""
        r = self.naive_write if side == "write" else self.naive_read
        return r.bytes_per_s if r else 0.0


@dataclass
class PointResult:
    """One tier at one (chunk size, depth)."""

    tier: str
    tier_type: str
    chunk_bytes: int
    depth: int
    chunks: int
    ok: bool = False
    error: str | None = None
    offload: Phase | None = None
    #: Offload throughput before the final flush (what the caller saw return).
    offload_returned_bytes_per_s: float = 0.0
    flush_s: float = 0.0
    load: Phase | None = None
    lookup_ops_per_s: float = 0.0
    #: Chunks timed one call at a time for the latency percentiles (also verified).
    probe_chunks: int = 0
    verified_bytes: int = 0
    failed_chunks: int = 0
    peak_in_flight: int = 0
    tier_extra: dict[str, int] = field(default_factory=dict)
    ratios: dict[str, float | None] = field(default_factory=dict)
    #: Runs this point's figures are the median of (``--repeat``); every run was verified.
    repeats: int = 1


@dataclass
class BenchReport:
    """Everything one ``asynctier bench`` run measured (``--json`` writes :meth:`as_dict`)."""

    started: str
    command: str
    machine: dict[str, Any]
    options: dict[str, Any]
    tiers: dict[str, dict[str, Any]]
    references: list[RefResult] = field(default_factory=list)
    points: list[PointResult] = field(default_factory=list)
    wall_s: float = 0.0
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when at least one tier ran and every point verified."""
        return bool(self.points) and all(p.ok for p in self.points)

    def ref(self, chunk_bytes: int, depth: int) -> RefResult | None:
        """The references measured at (chunk size, depth)."""
        for r in self.references:
            if r.chunk_bytes == chunk_bytes and r.depth == depth:
                return r
        return None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        d = asdict(self)
        d["ok"] = self.ok
        return d


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
    command: str = "asynctier bench"

    def chunks_for(self, chunk_bytes: int, depth: int) -> int:
        """Chunks moved at one point: ``data_bytes`` worth, at least ``CHUNKS_PER_DEPTH x depth``."""
        return max(1, self.data_bytes // chunk_bytes, CHUNKS_PER_DEPTH * depth)


# -- the primary buffer -----------------------------------------------------------------------


class _Primary:
    """A page-aligned primary buffer (torch when installed) and a reference copy of its bytes."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.kind = "bytearray"
        self._keep: Any = None
        self.view = self._allocate(nbytes)
        self._np: Any = None
        try:
            import numpy as np

            self._np = np
        except ImportError:  # pragma: no cover - numpy comes with torch
            pass
        self.ref = self._random(nbytes)
        self.view[:] = self.ref
        self.dirty_bytes = 0

    def _allocate(self, nbytes: int) -> memoryview:
        page = 4096
        try:
            import torch

            from .torch_interop import allocate_primary
        except ImportError:
            self._keep = bytearray(nbytes + page)
            mv = memoryview(self._keep)
        else:
            # allocate_primary pins when CUDA is available; torch's CPU allocator aligns to 64
            # bytes only, and O_DIRECT wants page-aligned buffers (as pinned memory is).
            tensor, mv = allocate_primary(OffloadingSpec(nbytes + page, 1, "asynctier/bench"))
            self._keep = tensor
            self.kind = f"torch.uint8 tensor{' (pinned)' if tensor.is_pinned() else ''}, torch {torch.__version__}"
        from .posix_io import buffer_address

        off = (-buffer_address(mv)) % page
        return mv[off : off + nbytes]

    def _random(self, nbytes: int) -> memoryview:
        try:
            import numpy as np
        except ImportError:  # pragma: no cover
            return memoryview(bytearray(os.urandom(nbytes)))
        # 64-bit integers: full-entropy bytes, several times quicker than os.urandom here
        rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
        top = np.iinfo(np.uint64).max
        words = rng.integers(0, top, size=(nbytes + 7) // 8, dtype=np.uint64, endpoint=True)
        data: Any = words.view(np.uint8)[:nbytes]
        return memoryview(data).cast("B")

    def restore(self) -> None:
        """Put the reference bytes back where a load or a reference run changed them."""
        if self.dirty_bytes:
            self.view[: self.dirty_bytes] = self.ref[: self.dirty_bytes]
            self.dirty_bytes = 0

    def zero(self, nbytes: int) -> None:
        """Zero the first ``nbytes`` (so a load that writes nothing cannot pass verification)."""
        self.dirty_bytes = max(self.dirty_bytes, nbytes)
        if self._np is not None:
            self._np.frombuffer(self.view[:nbytes], dtype=self._np.uint8).fill(0)  # memset in place
        else:
            self.view[:nbytes] = bytes(nbytes)

    def same(self, slot_off: int, ref_off: int, n: int) -> bool:
        """Whether ``n`` bytes at ``slot_off`` of the buffer equal the reference at ``ref_off``."""
        if self._np is not None:
            np = self._np
            a = np.frombuffer(self.view[slot_off : slot_off + n], dtype=np.uint8)
            b = np.frombuffer(self.ref[ref_off : ref_off + n], dtype=np.uint8)
            # compare 4 MiB at a time: one big temporary would cost more in page faults than the compare
            step = 4 * MiB
            return all(np.array_equal(a[i : i + step], b[i : i + step]) for i in range(0, n, step))
        return self.view[slot_off : slot_off + n] == self.ref[ref_off : ref_off + n]


# -- the run ----------------------------------------------------------------------------------

Progress = Callable[[str, bool], None]
"""Progress callback: (description of the step now running, whether a step just finished)."""


def _key(run_id: str, tier: str, chunk: int, depth: int, i: int, tag: str = "") -> bytes:
    # real keys are prefix hashes: 32 opaque bytes
    return hashlib.blake2b(f"{run_id}/{tier}/{chunk}/{depth}/{tag}{i}".encode(), digest_size=32).digest()


async def _closed_loop(
    n: int, depth: int, call: Callable[[int], Awaitable[TransferResult]]
) -> tuple[float, list[float], dict[bytes, BaseException]]:
    """``depth`` callers, each awaiting ``call(i)`` for the next i, back to back; like fio's iodepth."""
    latencies = [0.0] * n
    failed: dict[bytes, BaseException] = {}
    counter = iter(range(n))

    async def caller() -> None:
        for i in counter:  # shared iterator: each i goes to exactly one caller
            t = time.perf_counter()
            res = await call(i)
            latencies[i] = time.perf_counter() - t
            failed.update(res.failed)

    t0 = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(min(depth, n))))
    return time.perf_counter() - t0, latencies, failed


def _capacity_for(chunks: int, chunk_bytes: int) -> int:
    # room for the point's chunks twice over, plus headers and block rounding
    return 2 * chunks * chunk_bytes + 64 * MiB


async def _run_point(
    name: str,
    config: Mapping[str, Any],
    primary: _Primary,
    chunk: int,
    depth: int,
    chunks: int,
    workdir: Path,
    run_id: str,
    progress: Progress,
) -> PointResult:
    res = PointResult(tier=name, tier_type=str(config.get("type")), chunk_bytes=chunk, depth=depth, chunks=chunks)
    res.probe_chunks = min(chunks, max(depth, LATENCY_PROBE_CHUNKS))
    nbytes = chunk * chunks
    pointdir = workdir / f"{name}-{chunk}-{depth}"
    pointdir.mkdir(parents=True, exist_ok=True)
    cfg = _substitute(dict(config), {"dir": pointdir, "capacity": _capacity_for(chunks, chunk)})
    if "max_inflight" in accepted_parameters(SecondaryTierFactory.get_tier_class(cfg)) and "max_inflight" not in config:
        cfg["max_inflight"] = depth  # the tier's bound is the depth swept
    spec = OffloadingSpec(chunk, chunks, namespace=f"asynctier/bench/{run_id}")
    view = primary.view[:nbytes]
    keys = [_key(run_id, name, chunk, depth, i) for i in range(chunks)]
    absent = [_key(run_id, name, chunk, depth, i, "absent") for i in range(chunks)]
    probe = res.probe_chunks
    probe_keys = [_key(run_id, name, chunk, depth, i, "probe") for i in range(probe)]
    local = _uses_dir(config)
    label = f"{name} {format_size(chunk)} depth {depth}"

    async def flush() -> float:
        t = time.perf_counter()
        if local:
            await asyncio.to_thread(benchkit.sync_tree, pointdir)
        return time.perf_counter() - t

    async def cold() -> None:
        if local:
            await asyncio.to_thread(benchkit.drop_tree_cache, pointdir)

    def check(op: str, failed: Mapping[bytes, BaseException]) -> None:
        if failed:
            res.failed_chunks += len(failed)
            raise RuntimeError(f"{op}: {len(failed)} chunks failed; first: {next(iter(failed.values()))!r}")

    def verify(n: int) -> None:
        # key i was loaded into slot i+1: a tier that ignored the slot, or wrote nothing, fails here
        bad = [i for i in range(n) if not primary.same(((i + 1) % n) * chunk, i * chunk, chunk)]
        if bad:
            raise RuntimeError(f"verify: {len(bad)} of {n} chunks came back different (first: chunk {bad[0]})")
        res.verified_bytes += n * chunk

    shifted = [(i + 1) % chunks for i in range(chunks)]
    try:
        tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
        async with tier:
            primary.restore()
            if local:  # the previous point's deletes are not this one's to pay for
                await asyncio.to_thread(benchkit.settle, pointdir)
            # 1. throughput: one call with every chunk, the tier keeping `depth` chunk I/Os in flight
            progress(f"{label}: offload", False)
            t = time.perf_counter()
            r = await tier.offload(keys, list(range(chunks)))
            elapsed = time.perf_counter() - t
            check("offload", r.failed)
            res.flush_s = await flush()
            res.offload_returned_bytes_per_s = nbytes / max(elapsed, 1e-9)

            progress(f"{label}: lookup", False)
            t = time.perf_counter()
            hits = await tier.lookup(keys)
            misses = await tier.lookup(absent)
            res.lookup_ops_per_s = 2 * chunks / max(time.perf_counter() - t, 1e-9)
            if not all(hits) or any(misses):
                raise RuntimeError(
                    f"lookup: {hits.count(False)} stored keys reported absent, {misses.count(True)} absent keys present"
                )

            progress(f"{label}: load", False)
            await cold()
            primary.zero(nbytes)
            t = time.perf_counter()
            r = await tier.load(keys, shifted)
            load_s = time.perf_counter() - t
            check("load", r.failed)
            progress(f"{label}: verify", False)
            verify(chunks)

            # 2. latency: `depth` callers awaiting one-chunk calls back to back (fio's iodepth)
            progress(f"{label}: per-chunk latency", False)
            primary.restore()
            _, off_lat, failed = await _closed_loop(probe, depth, lambda i: tier.offload([probe_keys[i]], [i]))
            check("offload", failed)
            await flush()
            await cold()
            primary.zero(probe * chunk)
            _, load_lat, failed = await _closed_loop(
                probe, depth, lambda i: tier.load([probe_keys[i]], [(i + 1) % probe])
            )
            check("load", failed)
            verify(probe)

            res.offload = Phase.of(elapsed + res.flush_s, nbytes, chunks, off_lat)
            res.load = Phase.of(load_s, nbytes, chunks, load_lat)
            stats = tier.stats()
            res.peak_in_flight = stats.peak_in_flight
            res.tier_extra = dict(stats.extra)
            with contextlib.suppress(Exception):  # cleanup only; a remote tier may refuse deletes
                await tier.remove(keys + probe_keys)
            res.ok = True
    except Exception as e:
        res.error = f"{type(e).__name__}: {e}"
    finally:
        primary.restore()
        await asyncio.to_thread(shutil.rmtree, pointdir, True)
    return res


def _fio(state: dict[str, Any], directory: Path, rw: str, chunk: int, depth: int, size: int) -> dict[str, Any] | None:
    """Best of the configured fio engines (an engine that fails here is dropped for the run)."""
    best: benchkit.FioResult | None = None
    for engine in list(state["engines"]):
        try:
            r = benchkit.run_fio(directory, rw=rw, bs=chunk, iodepth=depth, size=size, ioengine=engine, direct=True)
        except Exception as e:  # e.g. io_uring refused by the kernel or a sandbox
            state["engines"].remove(engine)
            state["notes"].append(f"fio engine {engine} failed ({type(e).__name__}); not used")
            continue
        if best is None or r.bytes_per_s > best.bytes_per_s:
            best = r
    return best.as_dict() if best else None


async def _run_refs(
    opts: BenchOptions,
    primary: _Primary,
    chunk: int,
    depth: int,
    chunks: int,
    workdir: Path,
    state: dict[str, Any],
    progress: Progress,
) -> RefResult:
    ref = RefResult(chunk_bytes=chunk, depth=depth, chunks=chunks)
    size = chunk * chunks
    label = f"reference {format_size(chunk)} depth {depth}"
    if opts.fio and state["engines"]:
        progress(f"{label}: fio write", False)
        await asyncio.to_thread(benchkit.settle, workdir)
        ref.fio_write = await asyncio.to_thread(_fio, state, workdir / "fio", "write", chunk, depth, size)
        progress(f"{label}: fio read", False)
        ref.fio_read = await asyncio.to_thread(_fio, state, workdir / "fio", "read", chunk, depth, size)
    if opts.naive:
        d = workdir / f"naive-{chunk}-{depth}"
        view = primary.view[:size]
        try:
            progress(f"{label}: naive aiofiles write", False)
            await asyncio.to_thread(benchkit.settle, workdir)
            lat: list[float] = []
            t = time.perf_counter()
            await benchkit.naive_aiofiles(d, view, chunk, chunks, depth=depth, mode="write", sync="none", latencies=lat)
            await asyncio.to_thread(benchkit.sync_tree, d)  # timed like the tiers: until on disk
            ref.naive_write = Phase.of(time.perf_counter() - t, size, chunks, lat)
            await asyncio.to_thread(benchkit.drop_tree_cache, d)
            progress(f"{label}: naive aiofiles read", False)
            lat = []
            primary.dirty_bytes = max(primary.dirty_bytes, size)
            t = time.perf_counter()
            await benchkit.naive_aiofiles(d, view, chunk, chunks, depth=depth, mode="read", latencies=lat)
            ref.naive_read = Phase.of(time.perf_counter() - t, size, chunks, lat)
        except Exception as e:
            ref.notes.append(f"naive loop failed: {type(e).__name__}: {e}")
        finally:
            primary.restore()
            await asyncio.to_thread(shutil.rmtree, d, True)
    return ref


def _fs_type(path: Path) -> str:
    """The file system type holding ``path`` (longest mount prefix in /proc/mounts)."""
    best, fstype = "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) > 2 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                    best, fstype = parts[1], parts[2]
    except OSError:
        pass
    return fstype


def _machine(root: Path, loop_name: str, primary_kind: str) -> dict[str, Any]:
    return {
        **benchkit.machine_info(),
        "event_loop": loop_name,
        "primary_buffer": primary_kind,
        "root": str(root),
        "root_fs": _fs_type(root),
    }


def _loop_name() -> str:
    loop = asyncio.get_running_loop()
    mod = type(loop).__module__.split(".")[0]
    if mod == "uvloop":
        import uvloop

        return f"uvloop {getattr(uvloop, '__version__', '?')}"
    return f"asyncio ({type(loop).__name__})"


def _check_tiers(tiers: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Which tiers can run: a missing module or client library means 'skipped', not a crash."""
    status: dict[str, dict[str, Any]] = {}
    for name, cfg in tiers.items():
        entry: dict[str, Any] = {"config": _redact(cfg)}
        try:
            cls = SecondaryTierFactory.get_tier_class(cfg)
        except (TierConfigError, ImportError) as e:
            entry.update(status="skipped", reason=str(e))
        else:
            entry.update(status="ok", cls=f"{cls.__module__}.{cls.__qualname__}")
        status[name] = entry
    return status


async def run_bench(opts: BenchOptions, progress: Progress | None = None) -> BenchReport:
    """Run the sweep described by ``opts`` and return every figure.

    Tiers that cannot be imported are reported as skipped; a tier that fails at a point has
    that point marked failed (``ok=False`` with the error) and the run goes on.
    """
    t_start = time.perf_counter()
    prog: Progress = progress or (lambda _desc, _done: None)
    status = _check_tiers(opts.tiers)
    runnable = [n for n, s in status.items() if s["status"] == "ok"]
    points = [(c, d) for c in opts.chunk_sizes for d in opts.depths]
    max_bytes = max((c * opts.chunks_for(c, d) for c, d in points), default=0)

    own_root = opts.root is None
    root = Path(tempfile.mkdtemp(prefix="asynctier-bench-")) if own_root else Path(opts.root or ".")
    root.mkdir(parents=True, exist_ok=True)
    run_id = f"{os.getpid()}-{int(time.time() * 1000)}"
    workdir = Path(tempfile.mkdtemp(prefix=f"run-{run_id}-", dir=root))
    prog("allocating and filling the primary buffer", False)
    primary = await asyncio.to_thread(_Primary, max_bytes)
    report = BenchReport(
        started=_dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        command=opts.command,
        machine=_machine(root, _loop_name(), primary.kind),
        options={
            "chunk_sizes": list(opts.chunk_sizes),
            "depths": list(opts.depths),
            "data_bytes_per_point": opts.data_bytes,
            "chunks_per_depth_min": CHUNKS_PER_DEPTH,
            "fio": opts.fio and benchkit.fio_available(),
            "fio_engines": list(opts.fio_engines),
            "naive": opts.naive,
            "repeat": opts.repeat,
        },
        tiers=status,
    )
    state: dict[str, Any] = {
        "engines": list(opts.fio_engines) if opts.fio and benchkit.fio_available() else [],
        "notes": [],
    }
    if opts.fio and not benchkit.fio_available():
        state["notes"].append("fio is not installed: no fio ratios")
    try:
        for chunk, depth in points:
            chunks = opts.chunks_for(chunk, depth)
            ref_runs: list[RefResult] = []
            tier_runs: dict[str, list[PointResult]] = {n: [] for n in runnable}
            # repeats are interleaved (references, then each tier, again): drift hits them all alike
            for rep in range(opts.repeat):
                tag = f" (run {rep + 1}/{opts.repeat})" if opts.repeat > 1 else ""
                if opts.fio or opts.naive:
                    ref_runs.append(await _run_refs(opts, primary, chunk, depth, chunks, workdir, state, prog))
                    prog(f"reference {format_size(chunk)} depth {depth}{tag}", True)
                for name in runnable:
                    pr = await _run_point(name, opts.tiers[name], primary, chunk, depth, chunks, workdir, run_id, prog)
                    tier_runs[name].append(pr)
                    prog(f"{name} {format_size(chunk)} depth {depth}{tag}", True)
            ref = _median_ref(ref_runs) if ref_runs else None
            if ref is not None:
                report.references.append(ref)
            for name in runnable:
                pr = _median_point(tier_runs[name])
                if ref is not None:
                    pr.ratios = _ratios(pr, ref)
                report.points.append(pr)
    finally:
        await asyncio.to_thread(shutil.rmtree, workdir, True)
        if own_root:
            await asyncio.to_thread(shutil.rmtree, root, True)
    report.summary = _summary(report, state["notes"])
    report.wall_s = time.perf_counter() - t_start
    return report


def total_steps(opts: BenchOptions) -> int:
    """Steps :func:`run_bench` reports as done (for a progress bar)."""
    runnable = sum(1 for s in _check_tiers(opts.tiers).values() if s["status"] == "ok")
    per = runnable + (1 if (opts.fio or opts.naive) else 0)
    return len(opts.chunk_sizes) * len(opts.depths) * per * opts.repeat


def _median_of(items: Sequence[Any], key: Callable[[Any], float]) -> Any:
    """The item with the median ``key`` (the lower one of the middle two for an even count)."""
    ranked = sorted(items, key=key)
    return ranked[(len(ranked) - 1) // 2]


def _median_ref(runs: list[RefResult]) -> RefResult:
    """One reference per side from repeated runs: each side's median run (its latencies with it)."""
    if len(runs) == 1:
        return runs[0]
    out = RefResult(chunk_bytes=runs[0].chunk_bytes, depth=runs[0].depth, chunks=runs[0].chunks)
    for side in ("fio_write", "fio_read"):
        vals = [getattr(r, side) for r in runs if getattr(r, side)]
        setattr(out, side, _median_of(vals, lambda v: float(v["bytes_per_s"])) if vals else None)
    for side in ("naive_write", "naive_read"):
        phases = [getattr(r, side) for r in runs if getattr(r, side)]
        setattr(out, side, _median_of(phases, lambda ph: ph.bytes_per_s) if phases else None)
    out.notes = sorted({n for r in runs for n in r.notes})
    out.repeats = len(runs)
    return out


def _median_point(runs: list[PointResult]) -> PointResult:
    """One point from repeated runs: failed if any run failed; else each phase's median run."""
    bad = [r for r in runs if not r.ok]
    if len(runs) == 1 or bad:
        out = bad[0] if bad else runs[0]
        out.repeats = len(runs)
        return out
    off = _median_of(runs, lambda r: r.offload.bytes_per_s if r.offload else 0.0)
    ld = _median_of(runs, lambda r: r.load.bytes_per_s if r.load else 0.0)
    out = PointResult(
        tier=off.tier,
        tier_type=off.tier_type,
        chunk_bytes=off.chunk_bytes,
        depth=off.depth,
        chunks=off.chunks,
        ok=True,
        offload=off.offload,
        offload_returned_bytes_per_s=off.offload_returned_bytes_per_s,
        flush_s=off.flush_s,
        load=ld.load,
        lookup_ops_per_s=_median_of(runs, lambda r: r.lookup_ops_per_s).lookup_ops_per_s,
        probe_chunks=off.probe_chunks,
        verified_bytes=sum(r.verified_bytes for r in runs),
        peak_in_flight=max(r.peak_in_flight for r in runs),
        tier_extra=off.tier_extra,
        repeats=len(runs),
    )
    return out


def _ratios(p: PointResult, ref: RefResult) -> dict[str, float | None]:
    out: dict[str, float | None] = {"fio_write": None, "fio_read": None, "naive_write": None, "naive_read": None}
    if p.offload is not None:
        out["fio_write"] = benchkit.ratio(p.offload.bytes_per_s, ref.fio_bps("write"))
        out["naive_write"] = benchkit.ratio(p.offload.bytes_per_s, ref.naive_bps("write"))
    if p.load is not None:
        out["fio_read"] = benchkit.ratio(p.load.bytes_per_s, ref.fio_bps("read"))
        out["naive_read"] = benchkit.ratio(p.load.bytes_per_s, ref.naive_bps("read"))
    return out


def _geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v and v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in vals)) if vals else None


def _summary(report: BenchReport, notes: list[str]) -> dict[str, Any]:
    per_tier: dict[str, Any] = {}
    for name, st in report.tiers.items():
        pts = [p for p in report.points if p.tier == name]
        if not pts:
            per_tier[name] = {"status": st["status"], "reason": st.get("reason")}
            continue
        good = [p for p in pts if p.ok]
        entry: dict[str, Any] = {
            "status": "ok" if len(good) == len(pts) else "failed",
            "points": len(pts),
            "points_ok": len(good),
            "verified_bytes": sum(p.verified_bytes for p in pts),
            "best_offload_bytes_per_s": max((p.offload.bytes_per_s for p in good if p.offload), default=0.0),
            "best_load_bytes_per_s": max((p.load.bytes_per_s for p in good if p.load), default=0.0),
        }
        for r in ("fio_write", "fio_read", "naive_write", "naive_read"):
            entry[f"geomean_{r}"] = _geomean([p.ratios.get(r) or 0.0 for p in good])
        errors = [f"{format_size(p.chunk_bytes)} depth {p.depth}: {p.error}" for p in pts if p.error]
        if errors:
            entry["errors"] = errors
        per_tier[name] = entry
    notes = list(notes) + [n for r in report.references for n in r.notes]
    return {"tiers": per_tier, "notes": notes}


# -- output -----------------------------------------------------------------------------------


def _decimal(nbytes: int) -> str:
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.1f} MB"


def _gbps(bps: float | None) -> str:
    return "-" if not bps else f"{bps / 1e9:.2f}"


def _x(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def _ops(v: float | None) -> str:
    if not v:
        return "-"
    return f"{v / 1000:.1f}k" if v >= 10_000 else f"{v:.0f}"


def _lat(p: Phase | None) -> str:
    if p is None or not p.lat_p50_s:
        return "-"
    return f"{p.lat_p50_s * 1e3:.2f} / {p.lat_p99_s * 1e3:.2f}"


def _fio_lat(r: Mapping[str, Any] | None) -> str:
    if not r:
        return "-"
    return f"{r['lat_p50_s'] * 1e3:.2f} / {r['lat_p99_s'] * 1e3:.2f}"


POINT_COLUMNS = (
    "tier",
    "chunk",
    "depth",
    "offload GB/s",
    "x fio",
    "x naive",
    "offload ops/s",
    "offload p50 / p99 ms",
    "load GB/s",
    "x fio",
    "x naive",
    "load ops/s",
    "load p50 / p99 ms",
    "lookups/s",
)
REF_COLUMNS = (
    "chunk",
    "depth",
    "fio write GB/s",
    "fio write p50 / p99 ms",
    "fio read GB/s",
    "fio read p50 / p99 ms",
    "naive write GB/s",
    "naive read GB/s",
)


def point_rows(report: BenchReport) -> Iterator[list[str]]:
    """Rows of the per-tier table (see :data:`POINT_COLUMNS`)."""
    order = list(report.tiers)
    for p in sorted(report.points, key=lambda p: (order.index(p.tier), p.chunk_bytes, p.depth)):
        head = [p.tier, format_size(p.chunk_bytes), str(p.depth)]
        if not p.ok:
            yield [*head, f"FAILED: {p.error}", *[""] * (len(POINT_COLUMNS) - 4)]
            continue
        o, ld, r = p.offload, p.load, p.ratios
        yield [
            *head,
            _gbps(o.bytes_per_s if o else None),
            _x(r.get("fio_write")),
            _x(r.get("naive_write")),
            _ops(o.ops_per_s if o else None),
            _lat(o),
            _gbps(ld.bytes_per_s if ld else None),
            _x(r.get("fio_read")),
            _x(r.get("naive_read")),
            _ops(ld.ops_per_s if ld else None),
            _lat(ld),
            _ops(p.lookup_ops_per_s),
        ]


def ref_rows(report: BenchReport) -> Iterator[list[str]]:
    """Rows of the reference table (see :data:`REF_COLUMNS`)."""
    for r in report.references:
        yield [
            format_size(r.chunk_bytes),
            str(r.depth),
            _gbps(r.fio_bps("write")),
            _fio_lat(r.fio_write),
            _gbps(r.fio_bps("read")),
            _fio_lat(r.fio_read),
            _gbps(r.naive_bps("write")),
            _gbps(r.naive_bps("read")),
        ]


SUMMARY_COLUMNS = (
    "tier",
    "points ok",
    "best offload GB/s",
    "best load GB/s",
    "x fio write",
    "x fio read",
    "x naive write",
    "x naive read",
)


def summary_rows(report: BenchReport) -> Iterator[list[str]]:
    """One row per tier that ran: best GB/s and the geometric mean of each ratio over its points."""
    for name, t in report.summary.get("tiers", {}).items():
        if "points" not in t:
            continue
        yield [
            name,
            f"{t['points_ok']}/{t['points']}",
            _gbps(t["best_offload_bytes_per_s"]),
            _gbps(t["best_load_bytes_per_s"]),
            *(_x(t.get(f"geomean_{r}")) for r in ("fio_write", "fio_read", "naive_write", "naive_read")),
        ]


def _skipped_lines(report: BenchReport) -> list[str]:
    return [f"{n}: skipped ({s.get('reason')})" for n, s in report.tiers.items() if s["status"] != "ok"]


def render_tables(report: BenchReport) -> list[Any]:
    """rich renderables: the per-tier table, the reference table, notes."""
    from rich.table import Table
    from rich.text import Text

    out: list[Any] = []
    m = report.machine
    t = Table(
        title=f"asynctier bench: {m['cpus']} CPUs, {m['root_fs']} at {m['root']}, {m['event_loop']}",
        caption="GB/s and ops/s: one call with every chunk, depth = chunk I/Os in flight; offload timed until the "
        "bytes are on the medium, load from a cold page cache. x fio / naive: the tier's GB/s over fio's (O_DIRECT, "
        "same block size and depth) and over a naive aiofiles loop's. p50/p99: one-chunk calls, depth callers.",
        header_style="bold",
    )
    cols = (
        "tier",
        "chunk",
        "depth",
        "offload GB/s",
        "x fio / naive",
        "ops/s",
        "p50/p99 ms",
        "load GB/s",
        "x fio / naive",
        "ops/s",
        "p50/p99 ms",
        "lookups/s",
    )
    for col in cols:
        t.add_column(col, justify="left" if col in ("tier", "chunk") else "right", no_wrap=col != "tier")
    for row in point_rows(report):
        if row[3].startswith("FAILED"):
            t.add_row(*row[:3], row[3], *[""] * (len(cols) - 4), style="red")
            continue
        t.add_row(*row[:4], f"{row[4]} / {row[5]}", *row[6:9], f"{row[9]} / {row[10]}", *row[11:])
    out.append(t)
    st = Table(title="per tier (ratios: geometric mean over its points)", header_style="bold")
    for col in SUMMARY_COLUMNS:
        st.add_column(col, justify="left" if col == "tier" else "right")
    for row in summary_rows(report):
        st.add_row(*row)
    if st.row_count:
        out.append(st)
    if report.references:
        rt = Table(title="references (same run, same file system)", header_style="bold")
        for col in REF_COLUMNS:
            rt.add_column(col, justify="right")
        for row in ref_rows(report):
            rt.add_row(*row)
        out.append(rt)
    lines = _skipped_lines(report) + report.summary.get("notes", [])
    verified = sum(p.verified_bytes for p in report.points)
    lines.append(
        f"verified {_decimal(verified)} byte for byte; {sum(p.ok for p in report.points)}/{len(report.points)} "
        f"points ok; wall time {report.wall_s:.1f} s"
    )
    out.append(Text("\n".join(lines)))
    return out


def _md_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "| " + " | ".join(columns) + " |"
    sep = "| " + " | ".join("---" for _ in columns) + " |"
    body = ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join([head, sep, *body])


def render_markdown(report: BenchReport) -> str:
    """The results as markdown: what ran, where, the command line, the tables."""
    m = report.machine
    lines = [
        f"Run {report.started} on {m['cpus']} CPUs, {m['memory_bytes'] / GiB:.0f} GiB, {m['platform']}; "
        f"Python {m['python']}, {m['event_loop']}; primary buffer: {m['primary_buffer']}; "
        f"{m['fio'] or 'no fio'}; files on {m['root_fs']}.",
        "",
        "```",
        report.command,
        "```",
        "",
        f"Wall time {report.wall_s:.0f} s; {_decimal(sum(p.verified_bytes for p in report.points))} loaded back "
        f"and verified byte for byte; {sum(p.ok for p in report.points)}/{len(report.points)} points ok.",
        "",
        "Per tier (ratios: geometric means over its chunk sizes and depths):",
        "",
        _md_table(SUMMARY_COLUMNS, list(summary_rows(report))),
        "",
        "Every point:",
        "",
        _md_table(POINT_COLUMNS, list(point_rows(report))),
    ]
    if report.references:
        lines += ["", "References measured in the same run:", "", _md_table(REF_COLUMNS, list(ref_rows(report)))]
    extra = _skipped_lines(report) + report.summary.get("notes", [])
    if extra:
        lines += ["", *[f"- {x}" for x in extra]]
    return "\n".join(lines) + "\n"


def write_plot(report: BenchReport, path: str | os.PathLike[str]) -> None:
    """A PNG: GB/s against depth, one panel per (offload|load, chunk size), a line per tier,
    fio and the naive loop as references. Needs matplotlib (the ``bench`` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chunks = sorted({p.chunk_bytes for p in report.points} | {r.chunk_bytes for r in report.references})
    if not chunks:
        raise ValueError("nothing to plot: no tier ran and no reference was measured")
    fig, axes = plt.subplots(2, len(chunks), figsize=(4.2 * len(chunks), 7), squeeze=False, sharex=True)
    for col, chunk in enumerate(chunks):
        for row, (side, label) in enumerate((("write", "offload"), ("read", "load"))):
            ax = axes[row][col]
            refs = sorted((r for r in report.references if r.chunk_bytes == chunk), key=lambda r: r.depth)
            if any(r.fio_bps(side) for r in refs):
                ax.plot([r.depth for r in refs], [r.fio_bps(side) / 1e9 for r in refs], "k--", label="fio O_DIRECT")
            if any(r.naive_bps(side) for r in refs):
                ax.plot(
                    [r.depth for r in refs],
                    [r.naive_bps(side) / 1e9 for r in refs],
                    ":",
                    color="gray",
                    label="naive aiofiles",
                )
            for tier in report.tiers:
                pts = sorted(
                    (p for p in report.points if p.tier == tier and p.chunk_bytes == chunk and p.ok),
                    key=lambda p: p.depth,
                )
                phases = [(p.depth, p.offload if side == "write" else p.load) for p in pts]
                xs = [d for d, ph in phases if ph]
                ys = [ph.bytes_per_s / 1e9 for _, ph in phases if ph]
                if xs:
                    ax.plot(xs, ys, "o-", label=tier)
            ax.set_xscale("log", base=2)
            depths = sorted({r.depth for r in refs} | {p.depth for p in report.points if p.chunk_bytes == chunk})
            ax.set_xticks(depths, [str(d) for d in depths])
            ax.minorticks_off()
            ax.set_title(f"{label}, {format_size(chunk)} chunks")
            ax.set_xlabel("depth (chunk I/Os in flight)")
            ax.set_ylabel("GB/s")
            ax.grid(True, alpha=0.3)
            ax.set_ylim(bottom=0)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.suptitle(f"asynctier bench, {report.started}: GB/s by depth", y=0.995, fontsize=10)
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.965), ncol=max(1, len(labels)))
    fig.tight_layout(rect=(0, 0, 1, 0.91))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- fsck -------------------------------------------------------------------------------------


@dataclass
class FsckReport:
    """What ``asynctier fsck`` found in one tier."""

    tier: str
    checked: int = 0
    ok: int = 0
    bad: dict[str, str] = field(default_factory=dict)  # key (hex) -> why
    removed: int = 0
    #: Bad chunks the tier dropped by itself when they failed verification (without ``remove``).
    dropped_by_tier: int = 0
    vanished: int = 0
    errors: dict[str, str] = field(default_factory=dict)  # key (hex) -> I/O error

    @property
    def clean(self) -> bool:
        """No bad chunk left behind and no chunk unreadable."""
        return (not self.bad or self.removed == len(self.bad)) and not self.errors


def _check_medium_exists(name: str, cfg: Mapping[str, Any]) -> None:
    """A check creates nothing: a mistyped ``root``/``path`` is said, not made."""
    for k in ("root", "path", "paths"):
        value = cfg.get(k)
        for where in value if isinstance(value, list) else [value]:
            if isinstance(where, (str, os.PathLike)) and not os.path.exists(where):
                raise TierConfigError(f"[tiers.{name}] {k}: {os.fspath(where)!r} does not exist: nothing to check")


def _check_layout_exists(name: str, tier: Any, spec: OffloadingSpec) -> None:
    """A tier that keeps a directory per layout (fs) has one for ``spec``, else the spec is
    not the one the chunks were written with (opening would make an empty one)."""
    layout_dir = getattr(tier, "dir", None)
    if isinstance(layout_dir, Path) and not layout_dir.exists():
        parent = layout_dir.parent
        there = sorted(d.name for d in parent.iterdir() if d.is_dir()) if parent.is_dir() else []
        raise TierConfigError(
            f"[tiers.{name}]: nothing stored with this layout (chunk_bytes {spec.chunk_bytes}, namespace "
            f"{spec.namespace!r}) under {parent}: no {layout_dir.name}; layouts there: {there or 'none'}"
        )


async def fsck(
    name: str,
    config: Mapping[str, Any],
    spec: OffloadingSpec,
    *,
    remove: bool = False,
    batch: int = 1024,
    progress: Callable[[int, int], None] | None = None,
) -> FsckReport:
    """Verify every chunk a tier holds (``stored_keys`` + ``verify_chunks``); remove bad ones on request.

    ``spec`` must be the layout the chunks were written with (chunk size, namespace): tiers
    scope their storage by it. Checksums are always verified here, whatever ``verify`` says
    in the config.
    """
    from .chunked import ChunkTier
    from .errors import IntegrityError, failure_kind
    from .posix_io import aligned_buffer

    cfg = dict(config)
    cls = SecondaryTierFactory.get_tier_class(cfg)
    if not issubclass(cls, ChunkTier):
        raise TierConfigError(
            f"tier {name!r} ({cls.__module__}.{cls.__qualname__}) cannot be checked: fsck needs a ChunkTier "
            "(stored_keys and verify_chunks)"
        )
    accepted = accepted_parameters(cls)
    if "verify" in accepted:
        cfg["verify"] = True
    if "background_scan" in accepted:
        cfg["background_scan"] = False  # list every chunk: the index must be complete before stored_keys()
    _check_medium_exists(name, cfg)
    scratch = aligned_buffer(spec.total_bytes)  # never touched by verify_chunks; the tier wants a view
    tier = SecondaryTierFactory.create_secondary_tier(cfg, scratch, spec)
    assert isinstance(tier, ChunkTier)
    _check_layout_exists(name, tier, spec)
    report = FsckReport(tier=name)
    async with tier:
        keys = await tier.stored_keys()
        total = len(keys)
        if progress:
            progress(0, total)
        for start in range(0, total, batch):
            part = keys[start : start + batch]
            res = await tier.verify_chunks(part, remove_bad=remove)
            report.checked += len(part)
            report.ok += len(res.succeeded)
            for k, exc in res.failed.items():
                if isinstance(exc, IntegrityError):
                    report.bad[k.hex()] = str(exc)
                    if remove:
                        report.removed += 1
                elif failure_kind(exc) == "not_found":
                    report.vanished += 1  # evicted or removed by another user since the listing
                else:
                    report.errors[k.hex()] = f"{type(exc).__name__}: {exc}"
            if progress:
                progress(report.checked, total)
        if report.bad and not remove:
            # some tiers forget a chunk that failed a read at once; say so rather than claim it is still there
            bad_keys = [bytes.fromhex(k) for k in report.bad]
            report.dropped_by_tier = sum(1 for present in await tier.lookup(bad_keys) if not present)
    return report
