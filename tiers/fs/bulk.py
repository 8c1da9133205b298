"""A group job's descriptors packed, and its outcomes checked, for all its chunks at once:
the Python references of the C twins in ``asynctier/_speedups.c`` (which serve where built;
:class:`.native.NativeIO` binds one set). The loop thread runs these once per group job of
up to :data:`.native.GROUP_CHUNKS` files, instead of a descriptor and a check per chunk.
"""

from __future__ import annotations

from collections.abc import Sequence

from asynctier.engines import native as nativeio
from asynctier.integrity import header_matches, pack_header

from . import layout

__all__ = ["jobs_failed", "pack_reads", "pack_recycles", "pack_writes", "reads_failed", "split_plain"]


#: What :func:`split_plain` gives: the positions of the chunks that recycle their one victim's
#: file, of those that make a new file, of the others; the keys, victims and chunks of the
#: first, the keys and chunks of the second.
Split = tuple[list[int], list[int], list[int], list[bytes], list[bytes], list[int], list[bytes], list[int]]


def split_plain(keys: Sequence[bytes], cids: Sequence[int], reserved: Sequence[object], tmpfile: bool,
                recycle: bool) -> Split:  # fmt: skip
    """A group of stores sorted by what the index's reservations (``reserved[j]``, as
    :meth:`~asynctier.lru.LRUIndex.reserve_many` gives them) leave to do: a list of one
    victim and ``recycle`` on, its file taken over; an empty list and ``tmpfile`` on, a new
    file; anything else (a key stored already, victims to delete first, an error) planned
    one by one. The reference of ``asynctier._speedups.split_plain``."""
    rec: list[int] = []
    new: list[int] = []
    others: list[int] = []
    for j, r in enumerate(reserved):
        if type(r) is list and len(r) < 2 and (tmpfile if not r else recycle):
            (rec if r else new).append(j)
        else:
            others.append(j)
    return (rec, new, others, [keys[j] for j in rec], [reserved[j][0] for j in rec],  # type: ignore[index]
            [cids[j] for j in rec], [keys[j] for j in new], [cids[j] for j in new])  # fmt: skip


def pack_reads(
    table: bytearray, offset: int, prio: int, keys: Sequence[bytes], cids: Sequence[int], blocks: Sequence[int],
    dfds: Sequence[int], flags: int, hashed: int, hb_addr: int, hb_len: int, view_addr: int, n: int,
) -> None:  # fmt: skip
    """The :data:`~asynctier.engines.native.READ` job of each chunk of a group of loads,
    packed at ``table[offset:]`` one after another: ``keys[j]``'s file (in its shard's
    directory, ``dfds[shard]``), its header into block ``blocks[j]`` of ``hb_len`` bytes at
    ``hb_addr``, its ``n`` bytes of payload into chunk ``cids[j]`` of the view at ``view_addr``.
    The reference of ``asynctier._speedups.pack_reads`` (which names keys of up to 96 bytes)."""
    pack, size = nativeio.JOB_LAYOUT.pack_into, nativeio.JOB_LAYOUT.size
    for j, (key, cid, block) in enumerate(zip(keys, cids, blocks, strict=True)):
        shard, name = layout.name_of(key)
        pack(table, offset + j * size, -1, 0, nativeio.READ, prio, dfds[shard], flags, -1, -1, 0, hashed, 0, 0,
             hb_addr + block * hb_len, hb_len, view_addr + cid * n, n, 0, name, b"", b"")  # fmt: skip


def reads_failed(
    res: memoryview, offset: int, keys: Sequence[bytes], blocks: Sequence[int], hbs: memoryview, hb_len: int, n: int,
    layout_digest: bytes,
) -> list[int]:  # fmt: skip
    """The ``j`` whose read (its outcome at ``res[offset:]``, one
    :data:`~asynctier.engines.native.RESULT_LAYOUT` each) failed, did not bring the whole
    file (``hb_len + n`` bytes), or left in header block ``blocks[j]`` of ``hbs`` another
    header than ``keys[j]``'s with the payload's checksum the workers computed. The reference
    of ``asynctier._speedups.reads_failed``."""
    unpack, size = nativeio.RESULT_LAYOUT.unpack_from, nativeio.RESULT_LAYOUT.size
    bad: list[int] = []
    for j, (key, block) in enumerate(zip(keys, blocks, strict=True)):
        result, csum, stage, _ = unpack(res, offset + j * size)
        at = block * hb_len
        if stage or result != hb_len + n or not header_matches(hbs[at : at + hb_len], key, n, csum, layout_digest, 0):
            bad.append(j)
    return bad


def _put_block_header(hbs: memoryview, block: int, hb_len: int, key: bytes, n: int, layout_digest: bytes) -> int:
    """A store's header (a zero checksum: the workers fill it in) at the start of block
    ``block`` of ``hbs``, the rest of the block zeroed; its size."""
    head = pack_header(key, n, 0, layout_digest)
    if len(head) > hb_len:
        raise ValueError(f"a {len(head)}-byte header does not fit a {hb_len}-byte block")
    at = block * hb_len
    hbs[at : at + hb_len] = head + bytes(hb_len - len(head))
    return len(head)


def pack_writes(
    table: bytearray, offset: int, prio: int, keys: Sequence[bytes], cids: Sequence[int], blocks: Sequence[int],
    fds: Sequence[int], dfds: Sequence[int], flags: int, sync: int, mode: int, hbs: memoryview, hb_addr: int,
    hb_len: int, view_addr: int, n: int, layout_digest: bytes,
) -> None:  # fmt: skip
    """The store of each chunk ``cids[j]`` under ``keys[j]`` into a new unnamed file (one
    :data:`~asynctier.engines.native.WRITE` job: ``fds[j]``, a file made ahead, or -1 for the
    worker to make one; published by linking it at the key's name): its header written into
    block ``blocks[j]`` of ``hbs`` and its descriptor packed at ``table[offset:]`` one after
    another. The reference of ``asynctier._speedups.pack_writes``."""
    pack, size = nativeio.JOB_LAYOUT.pack_into, nativeio.JOB_LAYOUT.size
    for j, (key, cid, block, fd) in enumerate(zip(keys, cids, blocks, fds, strict=True)):
        shard, name = layout.name_of(key)
        body = _put_block_header(hbs, block, hb_len, key, n, layout_digest) - 8
        hb, buf = hb_addr + block * hb_len, view_addr + cid * n
        pack(table, offset + j * size, -1, 0, nativeio.WRITE, prio, dfds[shard], flags, fd, -1, sync, 0, body, mode,
             hb, hb_len, buf, n, 0, name, b"", b"")  # fmt: skip


def pack_recycles(
    table: bytearray, offset: int, prio: int, keys: Sequence[bytes], victims: Sequence[bytes], temps: Sequence[str],
    cids: Sequence[int], blocks: Sequence[int], dfds: Sequence[int], flags: int, lock_fd: int, sync: int,
    mode: int, hbs: memoryview, hb_addr: int, hb_len: int, view_addr: int, n: int, layout_digest: bytes,
) -> None:  # fmt: skip
    """The store of each chunk ``cids[j]`` under ``keys[j]`` into the file of ``victims[j]``
    (one :data:`~asynctier.engines.native.RECYCLE` job, the file renamed to ``temps[j]``
    while it is filled, its permission bits made ``mode``): its header, with a zero checksum
    (the workers fill it in), written into block ``blocks[j]`` of ``hbs`` (the rest of the
    block zeroed) and its descriptor packed at ``table[offset:]`` one after another. The
    reference of ``asynctier._speedups.pack_recycles`` (which names keys of up to 96 bytes)."""
    pack, size = nativeio.JOB_LAYOUT.pack_into, nativeio.JOB_LAYOUT.size
    for j, (key, victim, temp, cid, block) in enumerate(zip(keys, victims, temps, cids, blocks, strict=True)):
        ks, kname = layout.name_of(key)
        vs, vname = layout.name_of(victim)
        body = _put_block_header(hbs, block, hb_len, key, n, layout_digest) - 8
        hb, buf = hb_addr + block * hb_len, view_addr + cid * n
        pack(table, offset + j * size, -1, 0, nativeio.RECYCLE, prio, dfds[ks], flags, lock_fd, dfds[vs], sync, 0,
             body, mode, hb, hb_len, buf, n, 0, kname, vname, temp.encode())  # fmt: skip


def jobs_failed(res: memoryview, offset: int, m: int) -> list[int]:
    """The ``j`` whose outcome (at ``res[offset:]``, one :data:`~asynctier.engines.native.RESULT_LAYOUT`
    each) did not simply succeed: it names a failed step, or its ``info`` is set (a write whose
    name another writer took first). The reference of ``asynctier._speedups.jobs_failed``."""
    unpack, size = nativeio.RESULT_LAYOUT.unpack_from, nativeio.RESULT_LAYOUT.size
    return [j for j in range(m) if any(unpack(res, offset + j * size)[2:])]
