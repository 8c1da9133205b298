"""One tier at one point (chunk size, depth): offload, lookup, load, verify, per-chunk latency."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from ...factory import SecondaryTierFactory, accepted_parameters
from ...spec import OffloadingSpec
from ...stats import TransferResult
from .. import benchkit
from ..sizes import MiB, format_size
from ..tierfile import nested_configs, substitute, uses_dir
from .plan import steady_half
from .primary import PrimaryBuffer
from .progress import Progress
from .results import Phase, PointResult

__all__ = ["PointRun", "capacity_for"]


def chunk_key(run_id: str, tier: str, chunk: int, depth: int, i: int, tag: str = "") -> bytes:
    """A key as real ones are (prefix hashes: 32 opaque bytes), unique to the run and point."""
    return hashlib.blake2b(f"{run_id}/{tier}/{chunk}/{depth}/{tag}{i}".encode(), digest_size=32).digest()


def capacity_for(chunks: int, chunk_bytes: int) -> int:
    """``"{capacity}"``: room for the point's chunks twice over, plus headers and block rounding."""
    return 2 * chunks * chunk_bytes + 64 * MiB


async def closed_loop(
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


class PointRun:
    """Measures one tier at one point and verifies every byte it loads back.

    Key ``i`` is loaded into slot ``i+1``: a tier that ignored the slot, or wrote nothing,
    fails verification. A failure marks the point failed (``ok=False``, the error kept); the
    run goes on.
    """

    def __init__(
        self,
        name: str,
        config: Mapping[str, Any],
        primary: PrimaryBuffer,
        point: tuple[int, int, int, int],
        workdir: Path,
        run_id: str,
        progress: Progress,
        *,
        steady: bool = False,
        steady_passes: int = 0,
    ) -> None:
        chunk, depth, chunks, probe = point
        self.res = PointResult(
            tier=name, tier_type=str(config.get("type")), chunk_bytes=chunk, depth=depth, chunks=chunks
        )
        self.res.probe_chunks = probe
        self.config, self.primary, self.progress = config, primary, progress
        self.chunk, self.depth, self.chunks, self.probe = chunk, depth, chunks, probe
        self.nbytes = chunk * chunks
        self.pointdir = workdir / f"{name}-{chunk}-{depth}"
        self.run_id = run_id
        self.local = uses_dir(config)
        self.label = f"{name} {format_size(chunk)} depth {depth}"
        self.keys = [chunk_key(run_id, name, chunk, depth, i) for i in range(chunks)]
        self.absent = [chunk_key(run_id, name, chunk, depth, i, "absent") for i in range(chunks)]
        self.probe_keys = [chunk_key(run_id, name, chunk, depth, i, "probe") for i in range(probe)]
        self.steady, self.passes = steady, steady_passes
        # the bytes the plan counted for this point (plan.tier_point_bytes)
        steady_bytes = chunk * (chunks + steady_passes * steady_half(chunks)) if steady else 0
        self._left = 2 * chunk * (chunks + probe) + steady_bytes

    def _advance(self, nbytes: int) -> None:
        self._left -= nbytes
        self.progress.advance(nbytes)

    def _tier_config(self, pointdir: Path | None = None) -> dict[str, Any]:
        cfg: dict[str, Any] = substitute(
            dict(self.config), {"dir": pointdir or self.pointdir, "capacity": capacity_for(self.chunks, self.chunk)}
        )
        # the tier's bound is the depth swept; a chain's tiers too (substitute made them copies)
        for tier_cfg in nested_configs(cfg):
            cls = SecondaryTierFactory.get_tier_class(tier_cfg)
            if isinstance(tier_cfg, dict) and "max_inflight" in accepted_parameters(cls):
                tier_cfg.setdefault("max_inflight", self.depth)
        return cfg

    async def _flush(self) -> float:
        t = time.perf_counter()
        if self.local:
            await asyncio.to_thread(benchkit.sync_tree, self.pointdir)
        return time.perf_counter() - t

    async def _cold(self) -> None:
        if self.local:
            await asyncio.to_thread(benchkit.drop_tree_cache, self.pointdir)

    def _check(self, op: str, failed: Mapping[bytes, BaseException]) -> None:
        if failed:
            self.res.failed_chunks += len(failed)
            raise RuntimeError(f"{op}: {len(failed)} chunks failed; first: {next(iter(failed.values()))!r}")

    def _verify(self, n: int) -> None:
        c = self.chunk
        bad = [i for i in range(n) if not self.primary.same(((i + 1) % n) * c, i * c, c)]
        if bad:
            raise RuntimeError(f"verify: {len(bad)} of {n} chunks came back different (first: chunk {bad[0]})")
        self.res.verified_bytes += n * c

    async def _throughput(self, tier: Any) -> tuple[float, float]:
        """One call with every chunk each way, the tier keeping ``depth`` I/Os in flight; returns
        (offload seconds up to the flush, load seconds)."""
        res, n = self.res, self.chunks
        self.progress.phase(f"{self.label}: offload")
        t = time.perf_counter()
        r = await tier.offload(self.keys, list(range(n)))
        elapsed = time.perf_counter() - t
        self._check("offload", r.failed)
        res.flush_s = await self._flush()
        res.offload_returned_bytes_per_s = self.nbytes / max(elapsed, 1e-9)
        self._advance(self.nbytes)

        self.progress.phase(f"{self.label}: lookup")
        t = time.perf_counter()
        hits = await tier.lookup(self.keys)
        misses = await tier.lookup(self.absent)
        res.lookup_ops_per_s = 2 * n / max(time.perf_counter() - t, 1e-9)
        if not all(hits) or any(misses):
            raise RuntimeError(
                f"lookup: {hits.count(False)} stored keys reported absent, {misses.count(True)} absent keys present"
            )

        self.progress.phase(f"{self.label}: load")
        await self._cold()
        self.primary.zero(self.nbytes)
        t = time.perf_counter()
        r = await tier.load(self.keys, [(i + 1) % n for i in range(n)])
        load_s = time.perf_counter() - t
        self._check("load", r.failed)
        self.progress.phase(f"{self.label}: verify")
        self._verify(n)
        self._advance(self.nbytes)
        return elapsed + res.flush_s, load_s

    async def _latency(self, tier: Any) -> tuple[list[float], list[float]]:
        """``depth`` callers awaiting one-chunk calls back to back (fio's iodepth); verified too."""
        probe, keys = self.probe, self.probe_keys
        self.progress.phase(f"{self.label}: per-chunk latency")
        self.primary.restore()
        _, off_lat, failed = await closed_loop(probe, self.depth, lambda i: tier.offload([keys[i]], [i]))
        self._check("offload", failed)
        await self._flush()
        self._advance(probe * self.chunk)
        await self._cold()
        self.primary.zero(probe * self.chunk)
        _, load_lat, failed = await closed_loop(probe, self.depth, lambda i: tier.load([keys[i]], [(i + 1) % probe]))
        self._check("load", failed)
        self._verify(probe)
        self._advance(probe * self.chunk)
        return off_lat, load_lat

    async def _steady(self, per_chunk: int) -> None:
        """A second tier holding half the point's chunks: filled (untimed), ``steady_passes``
        passes of as many new keys (untimed), then the other half offloaded as new keys, each
        evicting one (timed up to the flush): a cache at capacity."""
        half = steady_half(self.chunks)
        cfg = self._tier_config(self.pointdir / "steady")
        if "capacity_bytes" not in accepted_parameters(SecondaryTierFactory.get_tier_class(cfg)):
            return
        cfg["capacity_bytes"] = half * per_chunk
        spec = OffloadingSpec(self.chunk, self.chunks, namespace=f"asynctier/bench/{self.run_id}/steady")
        keys = [chunk_key(self.run_id, self.res.tier, self.chunk, self.depth, i, "steady") for i in range(2 * half)]
        (self.pointdir / "steady").mkdir(exist_ok=True)
        self.progress.phase(f"{self.label}: offload into a full tier")
        tier = SecondaryTierFactory.create_secondary_tier(cfg, self.primary.view[: self.nbytes], spec)
        async with tier:
            self._check("offload", (await tier.offload(keys[:half], list(range(half)))).failed)
            await self._flush()
            self._advance(half * self.chunk)
            filled = tier.stats().evictions
            for k in range(self.passes):
                self.progress.phase(f"{self.label}: pass {k + 1} of {self.passes} into a full tier")
                tag = f"pass{k}-"
                more = [chunk_key(self.run_id, self.res.tier, self.chunk, self.depth, i, tag) for i in range(half)]
                self._check("offload", (await tier.offload(more, [half + i for i in range(half)])).failed)
                await self._flush()
                self._advance(half * self.chunk)
            before = tier.stats().evictions
            self.res.steady_pass_evictions = before - filled
            if self.local:
                await asyncio.to_thread(benchkit.settle, self.pointdir)
            t = time.perf_counter()
            r = await tier.offload(keys[half:], [half + i for i in range(half)])
            self._check("offload", r.failed)
            elapsed = time.perf_counter() - t + await self._flush()
            self._advance(half * self.chunk)
            self.res.steady = Phase.of(elapsed, half * self.chunk, half)
            self.res.steady_evictions = tier.stats().evictions - before
            # every chunk the tier holds is a new key (the filling ones were older); a tier whose
            # capacity_bytes also holds its own metadata (nvme's superblock) fits fewer than
            # `half`, so some new keys went too: which ones depends on the order writes ended
            held = tier.stats().stored_chunks or 0
            hits = await tier.lookup(keys[half:])
            if held == 0 or hits.count(True) != min(half, held):
                raise RuntimeError(
                    f"offload into a full tier: {hits.count(True)} of {half} new keys stored, the tier holds {held}"
                )

    async def run(self) -> PointResult:
        """Measure the point; never raises for the tier's failures (they mark the point failed)."""
        res = self.res
        self.pointdir.mkdir(parents=True, exist_ok=True)
        opened = False
        try:
            spec = OffloadingSpec(self.chunk, self.chunks, namespace=f"asynctier/bench/{self.run_id}")
            tier = SecondaryTierFactory.create_secondary_tier(
                self._tier_config(), self.primary.view[: self.nbytes], spec
            )
            async with tier:
                opened = True
                self.primary.restore()
                if self.local:  # the previous point's deletes are not this one's to pay for
                    await asyncio.to_thread(benchkit.settle, self.pointdir)
                offload_s, load_s = await self._throughput(tier)
                off_lat, load_lat = await self._latency(tier)
                res.offload = Phase.of(offload_s, self.nbytes, self.chunks, off_lat)
                res.load = Phase.of(load_s, self.nbytes, self.chunks, load_lat)
                stats = tier.stats()
                per_chunk = (stats.used_bytes or 0) // max(1, stats.stored_chunks or 0)
                res.peak_in_flight = stats.peak_in_flight
                res.tier_extra = dict(stats.extra)
                with contextlib.suppress(Exception):  # cleanup only; a remote tier may refuse deletes
                    await tier.remove(self.keys + self.probe_keys)
            if self.steady and per_chunk:  # a tier that counts no bytes has no capacity to fill
                await self._steady(per_chunk)
            res.ok = True
        except Exception as e:
            res.error = f"{type(e).__name__}: {e}"
            res.failed_at_open = not opened
        finally:
            self.progress.advance(max(0, self._left))
            self.primary.restore()
            await asyncio.to_thread(shutil.rmtree, self.pointdir, True)
        return res
