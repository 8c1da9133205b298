"""``asynctier selfcheck``: round-trip random chunks through one tier and verify every byte."""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import anyio
import click

from ..errors import TierConfigError
from .exits import EXIT_CODES_HELP, CliError, ExitCode
from .options import import_path_option, json_hint, parse_params, run_async, size_callback
from .roots import check_creatable
from .tierfile import normalize_config

__all__ = ["selfcheck"]


class _NotVerified(Exception):
    """A chunk failed, was not found, or came back different."""


def primary_buffer(nbytes: int) -> memoryview:
    """The primary buffer: page-aligned, as a server's pinned buffer is, so a tier that moves
    chunks with O_DIRECT can (a plain bytearray made the fs tier warn and fall back)."""
    from ..posix_io import aligned_buffer

    view = aligned_buffer(nbytes)
    view[:] = os.urandom(nbytes)
    return view


#: How long selfcheck waits for its chunks to be removed after a failure or an interrupt.
_CLEANUP_S = 10.0


async def _check(
    tier: Any, keys: list[bytes], ids: list[int], view: memoryview, original: bytes, c: int
) -> tuple[float, float]:
    """The round trip: offload, lookup, load into other slots, compare; the two durations."""
    t0 = time.perf_counter()
    (await tier.offload(keys, ids)).raise_for_failures()
    t_off = time.perf_counter() - t0
    hits = await tier.lookup(keys)
    if not all(hits):
        raise _NotVerified(f"lookup missed {hits.count(False)} of {len(keys)} stored chunks")
    view[:] = bytes(len(view))
    t0 = time.perf_counter()
    (await tier.load(keys, ids[::-1])).raise_for_failures()
    t_load = time.perf_counter() - t0
    for i, slot in enumerate(ids[::-1]):
        if view[slot * c : (slot + 1) * c] != original[i * c : (i + 1) * c]:
            raise _NotVerified(f"chunk {i} came back different")
    return t_off, t_load


async def roundtrip(config: dict[str, Any], chunk_bytes: int, num_chunks: int) -> dict[str, Any]:
    """Offload ``num_chunks`` random chunks, look them up, load them into other slots, compare."""
    from ..factory import SecondaryTierFactory
    from ..spec import OffloadingSpec
    from ..stats import TransferFailedError

    spec = OffloadingSpec(chunk_bytes, num_chunks, namespace="asynctier/selfcheck")
    view = primary_buffer(spec.total_bytes)
    original = bytes(view)
    keys = [f"selfcheck-{os.getpid()}-{i}".encode() for i in range(num_chunks)]
    ids = list(range(num_chunks))
    tier = SecondaryTierFactory.create_secondary_tier(config, view, spec)
    try:
        async with tier:
            try:
                t_off, t_load = await _check(tier, keys, ids, view, original, chunk_bytes)
            finally:
                # also after a failure, a cancellation or Ctrl-C: its chunks do not stay in the
                # tier; bounded, so that a stalled medium does not hold an interrupted run
                with anyio.move_on_after(_CLEANUP_S, shield=True):
                    with contextlib.suppress(Exception):  # (the check's own error is the one to say)
                        await tier.remove(keys)
            stats = tier.stats()
    except TransferFailedError as e:
        raise _NotVerified(str(e)) from None
    return {
        "tier": config["type"],
        "chunks": num_chunks,
        "chunk_bytes": chunk_bytes,
        "offload_GBps": spec.total_bytes / t_off / 1e9,
        "load_GBps": spec.total_bytes / t_load / 1e9,
        "peak_in_flight": stats.peak_in_flight,
        "failed": stats.failed,
    }


@click.command(epilog=EXIT_CODES_HELP)
@click.option("--tier", "tier_type", default="memory", show_default=True, help="Tier type to check.")
@click.option("--chunk-bytes", callback=size_callback, default="256K", show_default=True, metavar="SIZE")
@click.option("--chunks", "num_chunks", type=click.IntRange(min=1), default=256, show_default=True)
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="A tier parameter (repeatable), for example --param root=/mnt/cache; VALUE is read as JSON "
    "when it parses, else as a string; sizes may be written as sizes (capacity_bytes=64MiB).",
)
@import_path_option
def selfcheck(tier_type: str, chunk_bytes: int, num_chunks: int, params: tuple[str, ...]) -> None:
    """Round-trip random chunks through a tier and verify every byte.

    A missing root (or slab file) is created only when its parent directory exists: a typo
    deep in a path is an error, not a new tree.
    """
    given = parse_params(params)
    try:
        config = normalize_config("--param", {"type": tier_type, **given})
        check_creatable("--param", config)
        report = run_async(roundtrip(config, chunk_bytes, num_chunks))
    except TierConfigError as e:
        hint = json_hint(given, str(e)) or " (tier parameters go in with --param KEY=VALUE)"
        raise click.UsageError(f"{e}{hint}") from None
    except _NotVerified as e:
        raise CliError(f"selfcheck failed: {e}", ExitCode.NOT_VERIFIED) from None
    except OSError as e:  # a root that is a file, no permission, a failing disk: said, not a traceback
        raise CliError(f"selfcheck could not run: {e}", ExitCode.CANNOT_RUN) from None
    click.echo(
        f"selfcheck ok: {report['chunks']} x {report['chunk_bytes']} B through {report['tier']!r}: "
        f"offload {report['offload_GBps']:.2f} GB/s, load {report['load_GBps']:.2f} GB/s, "
        f"peak in flight {report['peak_in_flight']}, failures {report['failed']}"
    )
