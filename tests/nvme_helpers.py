"""Helpers of the nvme tier's tests: a tier on a small slab, primary data, faults on purpose."""

from __future__ import annotations

import errno
import mmap
import os
import random
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.posix_io import buffer_address
from asynctier.tiers.nvme import NvmeTier
from asynctier.tiers.nvme import sysio as nvme_sysio

CHUNK = 64 * 1024
NS = "nvme/test"


def aligned(nbytes: int) -> memoryview:
    return memoryview(mmap.mmap(-1, nbytes))


def misaligned(nbytes: int) -> memoryview:
    """A view 512 bytes past a page boundary: never O_DIRECT-aligned for a 4 KiB block."""
    raw = memoryview(bytearray(nbytes + 8192))
    start = -buffer_address(raw) % 4096 + 512
    return raw[start : start + nbytes]


def slab_capacity(slots: int, chunk: int = CHUNK, stripes: int = 1) -> int:
    """capacity_bytes giving ``slots`` slots of ``chunk`` bytes on 4 KiB blocks."""
    slot = 4096 + -(-chunk // 4096) * 4096
    return stripes * (4096 + slot * (slots // stripes))


def make(
    path: Path | list[Path],
    *,
    chunk: int = CHUNK,
    nchunks: int = 16,
    slots: int | None = 64,
    aligned_view: bool = True,
    namespace: str = NS,
    **cfg: Any,
) -> tuple[NvmeTier, memoryview]:
    """An nvme tier of ``slots`` slots on ``path`` (a list: stripes) and its primary view."""
    spec = OffloadingSpec(chunk, nchunks, namespace=namespace)
    view = aligned(spec.total_bytes) if aligned_view else misaligned(spec.total_bytes)
    conf: dict[str, Any] = {"type": "nvme", **cfg}
    if isinstance(path, list):
        conf["paths"] = [str(p) for p in path]
    else:
        conf["path"] = str(path)
    if slots is not None:
        conf["capacity_bytes"] = slab_capacity(slots, chunk, len(path) if isinstance(path, list) else 1)
    tier = SecondaryTierFactory.create_secondary_tier(conf, view, spec)
    assert isinstance(tier, NvmeTier)
    return tier, view


def fill(view: memoryview, chunk: int, seed: int) -> list[bytes]:
    """Random bytes in every chunk of ``view``; returns them."""
    rnd = random.Random(seed)
    out = []
    for i in range(view.nbytes // chunk):
        data = rnd.randbytes(chunk)
        view[i * chunk : (i + 1) * chunk] = data
        out.append(data)
    return out


def chunk_at(view: memoryview, chunk: int, i: int) -> bytes:
    return bytes(view[i * chunk : (i + 1) * chunk])


def flip(path: Path, offsets: list[int]) -> None:
    """Invert one byte of ``path`` at each offset."""
    with open(path, "r+b") as f:
        for off in offsets:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0xFF]))


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def find(path: Path, needle: bytes) -> int:
    pos = path.read_bytes().find(needle)
    assert pos >= 0
    return pos


def crash(tier: NvmeTier) -> None:
    """Leave without the closing checkpoint, as a killed process would."""
    cat = tier._catalog
    assert cat is not None
    cat.stop_checkpointer()
    cat.journal.close()
    tier._slabs.close()
    tier._state = "closed"


def corrupt_payload(tier: NvmeTier, key: bytes) -> None:
    """Overwrite 64 bytes in the payload of ``key``'s slot."""
    assert tier._catalog is not None and tier._slabs.geo is not None
    geo = tier._slabs.geo
    stripe, off = geo.locate(tier._catalog.index.entries[key])
    fd = os.open(tier.paths[stripe], os.O_RDWR)
    try:
        os.pwrite(fd, b"\xff" * 64, off + geo.hdr_area + 100)
        os.fsync(fd)
    finally:
        os.close(fd)


def _slot(tier: NvmeTier, key: bytes) -> tuple[Path, int, int]:
    """(slab path, offset of the slot, offset of its payload) of ``key``."""
    assert tier._catalog is not None and tier._slabs.geo is not None
    geo = tier._slabs.geo
    stripe, off = geo.locate(tier._catalog.index.entries[key])
    return tier.paths[stripe], off, off + geo.hdr_area


def damage_slot(tier: NvmeTier, key: bytes, how: str) -> None:
    """On the medium, ``"flip"`` one payload byte of ``key``'s slot, or ``"truncate"`` it: the
    second half of the payload zeroed, as a write cut short leaves a fixed slot."""
    path, _, payload = _slot(tier, key)
    n = tier.offloading_spec.chunk_bytes
    fd = os.open(path, os.O_RDWR)
    try:
        if how == "flip":
            b = os.pread(fd, 1, payload + n // 3)
            os.pwrite(fd, bytes([b[0] ^ 0x01]), payload + n // 3)
        elif how == "truncate":
            os.pwrite(fd, bytes(n - n // 2), payload + n // 2)
        else:
            raise ValueError(how)
        os.fsync(fd)
    finally:
        os.close(fd)


def swap_slots(tier: NvmeTier, key_a: bytes, key_b: bytes) -> None:
    """On the medium, swap the whole slots (header and payload) of two keys."""
    assert tier._slabs.geo is not None
    size = tier._slabs.geo.slot_size
    (pa, a, _), (pb, b, _) = _slot(tier, key_a), _slot(tier, key_b)
    fa, fb = os.open(pa, os.O_RDWR), os.open(pb, os.O_RDWR)
    try:
        ba, bb = os.pread(fa, size, a), os.pread(fb, size, b)
        os.pwrite(fa, bb, a)
        os.pwrite(fb, ba, b)
        os.fsync(fa)
        os.fsync(fb)
    finally:
        os.close(fa)
        os.close(fb)


def hold_first_flush(tier: NvmeTier, held: threading.Event, go_on: threading.Event) -> None:
    """The journal's next flush sets ``held`` and waits for ``go_on`` before it writes. (On the
    native engine, stores' commits then run as a thread's flush too, never as a worker job.)"""
    assert tier._catalog is not None
    journal = tier._catalog.journal
    flush = journal._flush
    journal.claim = lambda: None  # type: ignore[method-assign]

    def held_flush(*args: Any, **kw: Any) -> None:
        if not held.is_set():
            held.set()
            go_on.wait(30)
        flush(*args, **kw)

    journal._flush = held_flush  # type: ignore[method-assign]


def journal_full_once(tier: NvmeTier) -> Callable[[int, list[memoryview], int], None]:
    """A ``pwritev_all`` whose first write to ``tier``'s journal lands half a batch, then fails
    with ENOSPC (simulated, once); every other write goes through. Install it as
    ``asynctier.tiers.nvme.sysio.pwritev_all``."""
    real_write = nvme_sysio.pwritev_all
    faults = [1]

    def once_full(fd: int, bufs: list[memoryview], offset: int) -> None:
        cat = tier._catalog
        if faults[0] and cat is not None and fd == cat.journal.fd:
            faults[0] = 0
            mv = bufs[0]
            real_write(fd, [mv[: len(mv) // 2]], offset)  # half a batch reaches the file first
            raise OSError(errno.ENOSPC, "No space left on device (simulated, once)")
        real_write(fd, bufs, offset)

    return once_full
