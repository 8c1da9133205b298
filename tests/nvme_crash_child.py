"""Child process for the nvme crash test: offload a stream of keys, report each success.

Usage: ``python nvme_crash_child.py SLAB CAPACITY CHUNK_BYTES START ALIGNED``

Prints ``ready`` once the tier is open, then ``P <hex key>`` after each offload that
returned success, ``D <hex key>`` before each remove and ``R <hex key>`` after each remove
that returned success, flushing every line, until killed. Every fifth batch removes one key
of the previous batch, so freed slots get reused. Chunk contents derive from the key (:func:`chunk_data`), so the parent
can check any chunk it is served.
"""

from __future__ import annotations

import asyncio
import mmap
import random
import sys
from typing import Any

from asynctier import OffloadingSpec, SecondaryTierFactory

BATCH = 8


def key_of(i: int) -> bytes:
    """The i-th key of the stream."""
    return b"crash-key-%08d" % i


def chunk_data(key: bytes, chunk_bytes: int) -> bytes:
    """The bytes stored under ``key``."""
    return random.Random(key).randbytes(chunk_bytes)


def report(out: Any, line: str) -> None:
    """One line in one write: with PYTHONUNBUFFERED, ``print`` writes its pieces separately,
    and a kill between them would leave half a record in the pipe."""
    out.write(line + "\n")
    out.flush()


async def main(slab: str, capacity: int, chunk_bytes: int, start: int, aligned: bool) -> None:
    spec = OffloadingSpec(chunk_bytes, BATCH, namespace="crash-test")
    buf: bytearray | mmap.mmap = mmap.mmap(-1, spec.total_bytes) if aligned else bytearray(spec.total_bytes)
    view = memoryview(buf)
    cfg = {"type": "nvme", "path": slab, "capacity_bytes": capacity, "durability": "fsync", "max_inflight": 4}
    tier = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
    out = sys.stdout
    async with tier:
        report(out, "ready")
        i = start
        batch_no = 0
        prev: list[bytes] = []
        while True:
            keys = [key_of(i + j) for j in range(BATCH)]
            for j, k in enumerate(keys):
                view[j * chunk_bytes : (j + 1) * chunk_bytes] = chunk_data(k, chunk_bytes)
            res = await tier.offload(keys, list(range(BATCH)))
            for k in res.succeeded:
                report(out, f"P {k.hex()}")
            batch_no += 1
            if batch_no % 5 == 0 and prev:
                victim = prev[batch_no % len(prev)]
                report(out, f"D {victim.hex()}")  # removal started: either outcome is fine
                if (await tier.remove([victim])).ok:
                    report(out, f"R {victim.hex()}")
            prev = keys
            i += BATCH


if __name__ == "__main__":
    a = sys.argv[1:]
    asyncio.run(main(a[0], int(a[1]), int(a[2]), int(a[3]), a[4] == "1"))
