"""The checkpoint file: the whole slot index as flat per-slot arrays, one checksum.

Reading it back is a few bulk copies, so reopening a large index stays fast
(``bench/bench_nvme.py`` measures it; figures in docs/benchmarks.md).
"""

from __future__ import annotations

import logging
import os
import time
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path

import xxhash

from asynctier.engines.speedups import speedups

from . import sysio
from .files import IndexDir
from .format import CHECKPOINT_HEAD, CK_MAGIC, U64, VERSION, xxh

__all__ = ["Checkpoint", "pack_keys", "read_checkpoint", "write_checkpoint"]

log = logging.getLogger(__name__)


@dataclass
class Checkpoint:
    """The whole index as per-slot arrays, so that reading it back is a few bulk copies.

    ``slot_key[s]`` is the key stored in slot ``s`` (``b""``: free; keys are never empty); ``prev``/``nxt`` link the
    used slots from least (``head``) to most (``tail``) recently used (-1 ends the list);
    ``slot_seq``/``slot_csum`` are each slot's sequence number and payload checksum. ``gen``
    is the first journal generation to replay on top of it.
    """

    slab_id: bytes
    gen: int
    nslots: int
    head: int
    tail: int
    slot_key: list[bytes]
    prev: array[int]
    nxt: array[int]
    slot_seq: array[int]
    slot_csum: array[int]

    @classmethod
    def from_lru(
        cls,
        slab_id: bytes,
        gen: int,
        nslots: int,
        entries: Sequence[tuple[bytes, int]],
        slot_seq: array[int] | None = None,
        slot_csum: array[int] | None = None,
    ) -> Checkpoint:
        """Build a checkpoint from ``(key, slot)`` pairs, least recently used first."""
        slot_key = [b""] * nslots
        prev = array("i", [-1]) * nslots
        nxt = array("i", [-1]) * nslots
        last = -1
        for k, s in entries:
            slot_key[s] = k
            prev[s] = last
            if last >= 0:
                nxt[last] = s
            last = s
        head = entries[0][1] if entries else -1
        zeros = array("Q", bytes(8 * nslots))
        return cls(
            slab_id,
            gen,
            nslots,
            head,
            last,
            slot_key,
            prev,
            nxt,
            slot_seq if slot_seq is not None else zeros,
            slot_csum if slot_csum is not None else array("Q", zeros),
        )

    def lru(self) -> list[tuple[bytes, int]]:
        """``(key, slot)`` pairs, least recently used first."""
        out: list[tuple[bytes, int]] = []
        s = self.head
        while s >= 0:
            out.append((self.slot_key[s], s))
            s = self.nxt[s]
        return out


@contextmanager
def _directory(path: Path, where: IndexDir | None) -> Iterator[IndexDir]:
    """``where`` (the open index directory holding ``path``), or ``path``'s directory opened
    for this one call."""
    if where is not None:
        yield where
        return
    d = IndexDir(path.parent, 0o600, 0o700)
    d.open()
    try:
        yield d
    finally:
        d.close()


#: slots the checkpointer copies or packs per step (here and in SlotIndex.snapshot): it holds
#: the GIL through each step (one C call), so the event loop waits for it no longer than the
#: switch interval and one step
STEP = 1 << 14


def steps(n: int, *, hand_over: bool = True) -> Iterator[tuple[int, int]]:
    """``range(n)`` as ``(start, stop)`` pieces of ``STEP``, for work on a large index off the
    event loop's thread: each piece is a few C calls holding the GIL, and between pieces
    (``hand_over``) the GIL is handed over at once (else the loop waits a switch interval).
    Not under the index lock, where stores would find it busy longer."""
    for i in range(0, n, STEP):
        if i and hand_over:
            time.sleep(0)
        yield i, min(n, i + STEP)


def pack_keys(keys: list[bytes], start: int, stop: int) -> tuple[bytes, bytes]:
    """``keys[start:stop]`` as a checkpoint stores them: each key's length (a native uint16),
    and the keys joined. The reference of its C twin (``asynctier/_speedups_nvme_publish.c``)."""
    if not 0 <= start <= stop <= len(keys):
        raise ValueError(f"pack_keys(): keys[{start}:{stop}] of a list of {len(keys)}")
    piece = keys[start:stop]
    for i, k in enumerate(piece, start):
        if type(k) is not bytes:
            raise TypeError(f"pack_keys(): keys[{i}] is a {type(k).__name__}, not bytes")
    return array("H", map(len, piece)).tobytes(), b"".join(piece)


_fast = speedups()
_pack_keys = pack_keys if _fast is None else _fast.pack_keys


def _keys_in_pieces(keys: list[bytes]) -> tuple[array[int], list[bytes]]:
    """Each key's length and the keys joined, ``STEP`` keys at a time, handing the GIL over
    between steps: done whole, ``array("H", map(len, keys))`` and ``b"".join(keys)`` were
    each one C call holding it (16 and 7 ms at 370,000 slots)."""
    keylens: array[int] = array("H")
    blobs: list[bytes] = []
    for i, j in steps(len(keys)):
        lens, blob = _pack_keys(keys, i, j)
        keylens.frombytes(lens)
        blobs.append(blob)
    return keylens, blobs


def write_checkpoint(path: Path, ck: Checkpoint, *, where: IndexDir | None = None) -> None:
    """Write ``ck`` to ``path`` atomically and durably (temporary file, fsync, rename, fsync
    dir), never through a link; ``where``: the open :class:`~.files.IndexDir` holding it."""
    n = ck.nslots
    if not (len(ck.slot_key) == len(ck.prev) == len(ck.nxt) == len(ck.slot_seq) == len(ck.slot_csum) == n):
        raise ValueError("inconsistent checkpoint arrays")
    keylens, blobs = _keys_in_pieces(ck.slot_key)
    head = CHECKPOINT_HEAD.pack(CK_MAGIC, VERSION, 0, ck.gen, ck.slab_id, n, ck.head, ck.tail, sum(map(len, blobs)))
    parts: list[bytes | memoryview] = [
        head,
        memoryview(keylens).cast("B"),
        *blobs,
        memoryview(ck.prev).cast("B"),
        memoryview(ck.nxt).cast("B"),
        memoryview(ck.slot_seq).cast("B"),
        memoryview(ck.slot_csum).cast("B"),
    ]
    h = xxhash.xxh3_64()
    for p in parts:
        h.update(p)
    parts.append(U64.pack(h.intdigest()))
    with _directory(path, where) as d:
        tmp = d.temp_name(path.name)  # unguessable, made with O_EXCL: nothing planted can redirect it
        fd = d.create(tmp)
        try:
            try:
                for p in parts:
                    sysio.write_all(fd, memoryview(p))
                os.fsync(fd)
            finally:
                os.close(fd)
            d.replace(tmp, path.name)
        except BaseException:
            d.unlink(tmp)
            raise
        d.sync()


def read_checkpoint(path: Path, *, where: IndexDir | None = None) -> Checkpoint | None:
    """Read a checkpoint; None when absent, torn or corrupt (the caller starts from empty).
    A link or a non-regular file at its name is refused (:class:`TierConfigError`)."""
    if where is None and not path.parent.is_dir():
        return None
    with _directory(path, where) as d:
        data = d.read(path.name)
    if data is None:
        return None
    if len(data) < CHECKPOINT_HEAD.size + 8:
        return None
    body = memoryview(data)[:-8]
    if xxh(body) != U64.unpack_from(data, len(data) - 8)[0]:
        log.warning("nvme: checkpoint %s fails its checksum; ignoring it", path)
        return None
    magic, version, _flags, gen, slab_id, n, head, tail, keys_len = CHECKPOINT_HEAD.unpack_from(data)
    if magic != CK_MAGIC or version != VERSION:
        return None
    off = CHECKPOINT_HEAD.size
    keylens = array("H")
    keylens.frombytes(body[off : off + 2 * n])
    off += 2 * n
    blob = data[off : off + keys_len]
    off += keys_len
    arrays: list[array[int]] = []
    for code, size in (("i", 4), ("i", 4), ("Q", 8), ("Q", 8)):
        a = array(code)
        a.frombytes(body[off : off + size * n])
        off += size * n
        arrays.append(a)
    if off != len(body):
        return None
    # bulk slicing (map over slices runs in C; free slots come out as b""), in steps: whole,
    # a million keys' slices were one call of 160-220 ms holding the GIL
    slot_key: list[bytes] = []
    at = 0
    for i, j in steps(n):
        ends = list(accumulate(keylens[i:j], initial=at))
        slot_key += map(blob.__getitem__, map(slice, ends[:-1], ends[1:]))
        at = ends[-1]
    return Checkpoint(slab_id, gen, n, head, tail, slot_key, *arrays)
