"""A store or load job's steps on the nvme tier's native engine, each for the whole job: the
Python references of their C twins (``asynctier/_speedups_nvme.c`` and
``_speedups_nvme_publish.c``, the index steps, and ``_speedups_nvme_runs.c``, a job's runs),
which the tier calls where built.

Why: a store job works on the event loop's thread a few steps per chunk: on the slot index,
under its lock (evict a victim, number the write, end it, publish it; a load's pins), and for its runs of
adjacent slots (each header, its two iovecs, a descriptor per run, each run's outcome). As
Python those steps came to several µs a chunk of a full slab (docs/benchmarks-issue-28.md, fifteenth
pass). The index steps have the effect of the :class:`~.slots.SlotIndex` methods they are
written with; call them with the index lock held.
"""

from __future__ import annotations

import struct
from typing import Any

from asynctier.engines.descriptors import JOB_LAYOUT, READV, RESULT_LAYOUT, WRITEV
from asynctier.integrity import header_matches, pack_headers_into

from .slab import Run
from .slots import SlotIndex

__all__ = [
    "Record",
    "Run",
    "begin_writes",
    "end_writes",
    "evict_oldest",
    "pack_slot_reads",
    "pack_slot_writes",
    "pin_many",
    "put_published",
    "release_many",
    "runs_loaded",
    "runs_written",
    "take_free",
    "unpin_many",
]


#: a journal record's fields: key, slot, sequence number, checksum (0 for ``EVICT``)
Record = tuple[bytes, int, int, int]


def evict_oldest(idx: SlotIndex, n: int, more: int) -> list[Record]:
    """Drop the keys of ``idx.oldest_unpinned(n, more)``, in that order: the ``EVICT``
    records' fields, one per victim (its slots are freed by :func:`release_many` once the
    records are queued)."""
    out: list[Record] = []
    for s in idx.oldest_unpinned(n, more):
        k = idx.slot_key[s]
        assert k
        idx.drop(k)
        out.append((k, s, idx.slot_seq[s], 0))
    return out


def release_many(idx: SlotIndex, slots: list[int], first_ticket: int) -> None:
    """``idx.release(slot, ticket)`` for each of ``slots``, the tickets counting up from
    ``first_ticket`` (their records' tickets)."""
    for t, s in enumerate(slots, first_ticket):
        idx.release(s, t)


def take_free(idx: SlotIndex, n: int, pick_max: int) -> list[int]:
    """``idx.take_free(n, pick_max)``: ``n`` free slots in as few runs as the free list holds."""
    return idx.take_free(n, pick_max)


def begin_writes(idx: SlotIndex, keys: list[bytes], taken: list[int], first_seq: int) -> int:
    """The writes of ``keys`` into the slots ``taken`` begin, numbered from ``first_seq``:
    each slot's sequence number set, each key's writes in flight counted. Returns the journal
    ticket to flush before any is written: the latest of the ``EVICT`` records that freed
    them (each slot's taken from ``reuse_ticket``), 0 for none."""
    slot_seq, writing, reuse = idx.slot_seq, idx.writing, idx.reuse_ticket
    for k, slot, seq in zip(keys, taken, range(first_seq, first_seq + len(taken)), strict=True):
        slot_seq[slot] = seq
        writing[k] = writing.get(k, 0) + 1
    return max([reuse.pop(s, 0) for s in taken], default=0) if reuse else 0


def end_writes(
    idx: SlotIndex, keys: list[bytes], written: list[int], slots: dict[int, tuple[int, int]], csums: dict[int, int]
) -> list[Record]:
    """The writes at positions ``written`` ended whole (``slots[p]``: slot and sequence
    number; ``csums[p]``: the payload's checksum): the ``PUBLISH`` records' fields, in that
    order, each slot's checksum set. A write whose key was removed meanwhile gets no record:
    its slot is freed (:meth:`~.slots.SlotIndex.done_writing`)."""
    slot_csum = idx.slot_csum
    recs: list[Record] = []
    for p in written:
        k = keys[p]
        slot, seq = slots[p]
        if idx.done_writing(k, seq):
            idx.release(slot, 0)
            continue
        slot_csum[slot] = c = csums[p]
        recs.append((k, slot, seq, c))
    return recs


def put_published(idx: SlotIndex, recs: list[Record], first_ticket: int) -> list[tuple[int, int]]:
    """Map each record's key to its slot, most recently used last, the slot's ticket the
    record's (counting up from ``first_ticket``): ``idx.put_many``'s ``(position, slot it
    had)`` of each key that had another slot."""
    slot_ticket = idx.slot_ticket
    for t, (_, slot, _, _) in enumerate(recs, first_ticket):
        slot_ticket[slot] = t
    return idx.put_many([(k, slot) for k, slot, _, _ in recs])


def pack_slot_writes(
    table: bytearray, offset: int, prio: int, runs: list[Run], keys: list[bytes], cids: list[int],
    slots: dict[int, tuple[int, int]], fds: list[int], hbs: Any, hb_addr: int, hb_len: int, iovs: Any,
    iov_addr: int, sums_addr: int, view_addr: int, n: int, layout_digest: bytes,
) -> None:  # fmt: skip
    """For each run ``j``, the ``WRITEV`` descriptor (group -1) written at ``table[offset + j *
    JOB_LAYOUT.size:]``: one ``pwritev`` at the run's offset of its stripe's ``fds``, of each
    chunk's header block (``hb_len`` bytes of ``hbs``, at ``hb_addr``; the header of its key and
    sequence number, checksum left to the worker) and payload (chunk ``cids[p]`` of ``n`` bytes
    of the view at ``view_addr``); the chunks' iovecs in ``iovs`` (at ``iov_addr``), their
    checksums to ``sums_addr``, the chunks of all runs one after another in all three. A run's
    keys are one length (its headers share where the checksum goes)."""
    iov: list[int] = []
    size, i = JOB_LAYOUT.size, 0
    for j, run in enumerate(runs):
        ps = [p for p, _, _, _ in run]
        if len({len(keys[p]) for p in ps}) != 1:
            raise ValueError("pack_slot_writes(): a run's keys are one length")
        head = pack_headers_into(hbs, i, hb_len, [keys[p] for p in ps], n, layout_digest, [slots[p][1] for p in ps])
        for k, p in enumerate(ps, i):
            iov += (hb_addr + k * hb_len, hb_len, view_addr + cids[p] * n, n)
        JOB_LAYOUT.pack_into(table, offset + j * size, -1, 0, WRITEV, prio, -1, 0, fds[run[0][2]], -1, 0, 0,
                             head - 8, 0, iov_addr + 32 * i, 2 * len(run), sums_addr + 8 * i, len(run), run[0][3],
                             b"", b"", b"")  # fmt: skip
        i += len(run)
    struct.pack_into(f"={len(iov)}Q", iovs, 0, *iov)


def runs_written(
    res: Any, offset: int, runs: list[Run], sums: Any, csums: dict[int, int], written: list[int]
) -> list[int]:
    """Read each run's outcome (``RESULT_LAYOUT`` at ``res[offset + j * RESULT_LAYOUT.size:]``):
    of a run written whole, each chunk's checksum (from ``sums``, the chunks of all runs one
    after another) into ``csums`` by position, and its positions appended to ``written``; the
    indices of the other runs."""
    bad: list[int] = []
    i = 0
    for j, run in enumerate(runs):
        _, _, stage, info = RESULT_LAYOUT.unpack_from(res, offset + j * RESULT_LAYOUT.size)
        if not stage and info == 1:
            ps = [p for p, _, _, _ in run]
            csums.update(zip(ps, sums[i : i + len(ps)]))
            written += ps
        else:
            bad.append(j)
        i += len(run)
    return bad


def pack_slot_reads(
    table: bytearray, offset: int, prio: int, runs: list[Run], cids: list[int], fds: list[int], hb_addr: int,
    hb_len: int, iovs: Any, iov_addr: int, sums_addr: int, view_addr: int, n: int, hashed: int,
) -> None:  # fmt: skip
    """For each run ``j`` of a load job, the ``READV`` descriptor (group -1) written at
    ``table[offset + j * JOB_LAYOUT.size:]``: one ``preadv`` at the run's offset of its
    stripe's ``fds``, into each chunk's header block (``hb_len`` bytes at ``hb_addr``) and
    payload (chunk ``cids[p]`` of ``n`` bytes of the view at ``view_addr``), the payloads'
    checksums (``hashed``) to ``sums_addr``; the chunks' iovecs in ``iovs`` (at ``iov_addr``),
    the chunks of all runs one after another in all three."""
    iov: list[int] = []
    size, i = JOB_LAYOUT.size, 0
    for j, run in enumerate(runs):
        for k, (p, _, _, _) in enumerate(run, i):
            iov += (hb_addr + k * hb_len, hb_len, view_addr + cids[p] * n, n)
        JOB_LAYOUT.pack_into(table, offset + j * size, -1, 0, READV, prio, -1, 0, fds[run[0][2]], -1, 0, hashed, 0,
                             0, iov_addr + 32 * i, 2 * len(run), sums_addr + 8 * i, len(run), run[0][3], b"", b"",
                             b"")  # fmt: skip
        i += len(run)
    struct.pack_into(f"={len(iov)}Q", iovs, 0, *iov)


def runs_loaded(
    res: Any, offset: int, runs: list[Run], keys: list[bytes], found: dict[int, tuple[int, int, int]], hbs: Any,
    hb_len: int, sums: Any, n: int, layout_digest: bytes, verify: bool, bad: list[int], unpins: list[int],
) -> int:  # fmt: skip
    """Read each run's outcome (``RESULT_LAYOUT`` at ``res[offset + j * RESULT_LAYOUT.size:]``,
    as :func:`pack_slot_reads` packed them): a chunk of a run read whole whose header block
    (``hb_len`` bytes of ``hbs``) starts with the header its key was stored with (``found[p]``:
    slot, sequence number, checksum) and, with ``verify``, whose payload's checksum (``sums``)
    is that one, is loaded; the positions of the others are appended to ``bad``, every
    chunk's slot to ``unpins``. Returns how many are loaded."""
    good, i = 0, 0
    for j, run in enumerate(runs):
        _, _, stage, info = RESULT_LAYOUT.unpack_from(res, offset + j * RESULT_LAYOUT.size)
        whole = not stage and info == 1
        for p, slot, _, _ in run:
            _, seq, want = found[p]
            if (whole and (not verify or sums[i] == want)
                    and header_matches(hbs[i * hb_len :], keys[p], n, want, layout_digest, seq)):  # fmt: skip
                good += 1
            else:
                bad.append(p)
            unpins.append(slot)
            i += 1
    return good


def pin_many(idx: SlotIndex, keys: list[bytes]) -> tuple[dict[int, tuple[int, int, int]], list[int]]:
    """Pin the slot of each of ``keys`` that is stored, made most recently used, in order (a
    load job's): ``(position -> (slot, seq, checksum), the positions not stored)``."""
    entries, pins, seqs, csums = idx.entries, idx.pins, idx.slot_seq, idx.slot_csum
    found: dict[int, tuple[int, int, int]] = {}
    missing: list[int] = []
    for p, k in enumerate(keys):
        slot = entries.get(k)
        if slot is None:
            missing.append(p)
            continue
        idx.touch_slot(slot)
        pins[slot] = pins.get(slot, 0) + 1
        found[p] = (slot, seqs[slot], csums[slot])
    return found, missing


def unpin_many(idx: SlotIndex, slots: list[int]) -> None:
    """``idx.unpin_many(slots)``: the reads of ``slots`` ended (a slot freed meanwhile is freed now)."""
    idx.unpin_many(slots)
