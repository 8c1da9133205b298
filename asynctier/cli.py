"""The ``asynctier`` command line."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
import time
from typing import Any

import click

from .factory import SecondaryTierFactory, TierInfo, accepted_parameters
from .spec import OffloadingSpec

__all__ = ["main"]


def _run(coro: Any) -> Any:
    """Run on uvloop when installed (what servers use), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)
    return uvloop.run(coro)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="asynctier")
def main() -> None:
    """asynctier: move KV-cache chunks between a primary buffer and storage tiers, from asyncio."""


def _describe(info: TierInfo) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": info.tier_type,
        "class": f"{info.module_path}.{info.class_name}",
        "source": info.source,
    }
    try:
        cls = SecondaryTierFactory.get_tier_class({"type": info.tier_type})
    except Exception as e:  # a tier whose module or client library is missing
        out["error"] = str(e)
        return out
    params = {}
    for name, p in sorted(accepted_parameters(cls).items()):
        params[name] = "required" if p.default is inspect.Parameter.empty else repr(p.default)
    out["parameters"] = params
    out["doc"] = (inspect.getdoc(cls) or "").split("\n")[0]
    return out


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def info(as_json: bool) -> None:
    """List the registered tiers, where each comes from, and its parameters."""
    tiers = [_describe(i) for i in SecondaryTierFactory.registered()]
    if as_json:
        click.echo(json.dumps(tiers, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="asynctier tiers", show_lines=True)
    for col in ("type", "class", "source", "parameters (default)"):
        table.add_column(col, overflow="fold")
    for t in tiers:
        params = t.get("error") or ", ".join(f"{k}={v}" for k, v in t["parameters"].items())
        table.add_row(t["type"], t["class"], t["source"], params)
    Console().print(table)


async def _selfcheck(config: dict[str, Any], chunk_bytes: int, num_chunks: int) -> dict[str, Any]:
    spec = OffloadingSpec(chunk_bytes, num_chunks, namespace="asynctier/selfcheck")
    buf = bytearray(os.urandom(spec.total_bytes))
    original = bytes(buf)
    view = memoryview(buf)
    keys = [f"selfcheck-{os.getpid()}-{i}".encode() for i in range(num_chunks)]
    ids = list(range(num_chunks))
    tier = SecondaryTierFactory.create_secondary_tier(config, view, spec)
    async with tier:
        t0 = time.perf_counter()
        res = await tier.offload(keys, ids)
        t_off = time.perf_counter() - t0
        res.raise_for_failures()
        hits = await tier.lookup(keys)
        if not all(hits):
            raise click.ClickException(f"lookup missed {hits.count(False)} of {len(keys)} stored chunks")
        buf[:] = bytes(len(buf))
        t0 = time.perf_counter()
        res = await tier.load(keys, ids[::-1])
        t_load = time.perf_counter() - t0
        res.raise_for_failures()
        c = chunk_bytes
        for i, slot in enumerate(ids[::-1]):
            if view[slot * c : (slot + 1) * c] != original[i * c : (i + 1) * c]:
                raise click.ClickException(f"chunk {i} came back different")
        await tier.remove(keys)
        stats = tier.stats()
    return {
        "tier": config["type"],
        "chunks": num_chunks,
        "chunk_bytes": chunk_bytes,
        "offload_GBps": spec.total_bytes / t_off / 1e9,
        "load_GBps": spec.total_bytes / t_load / 1e9,
        "peak_in_flight": stats.peak_in_flight,
        "failed": stats.failed,
    }


@main.command()
@click.option("--tier", "tier_type", default="memory", show_default=True, help="Tier type to check.")
@click.option("--chunk-bytes", default=256 * 1024, show_default=True)
@click.option("--chunks", "num_chunks", default=256, show_default=True)
def selfcheck(tier_type: str, chunk_bytes: int, num_chunks: int) -> None:
    """Round-trip random chunks through a tier and verify every byte."""
    report = _run(_selfcheck({"type": tier_type}, chunk_bytes, num_chunks))
    click.echo(
        f"selfcheck ok: {report['chunks']} x {report['chunk_bytes']} B through {report['tier']!r}: "
        f"offload {report['offload_GBps']:.2f} GB/s, load {report['load_GBps']:.2f} GB/s, "
        f"peak in flight {report['peak_in_flight']}, failures {report['failed']}"
    )


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
