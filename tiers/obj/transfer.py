"""Moving one chunk's object: a whole-object PUT (one request or multipart) and a GET into the
primary buffer (one request, or the first part then parallel ranges), verified on arrival.

Uploads hand obstore ``[header, slice of the primary buffer]``: it wraps each buffer as a
zero-copy ``Bytes`` and sends them as one body, so no Python copy of the chunk is made.
Downloads land in one Rust-owned buffer per request, copied once into the primary slice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import obstore

from asynctier.errors import IntegrityError
from asynctier.integrity import ChunkHeader, checksum

from .format import check_size, read_header

if TYPE_CHECKING:
    from obstore.store import ObjectStore

__all__ = ["get_into", "put_object", "verify_payload"]


def put_object(
    st: ObjectStore, path: str, header: bytes, data: memoryview, part_size: int, part_concurrency: int
) -> None:
    """PUT ``header + data`` as one object; larger than ``part_size``: a multipart upload of
    ``part_size`` parts, ``part_concurrency`` at a time (obstore slices the same buffers).
    Either way the object appears whole or not at all."""
    if len(header) + data.nbytes <= part_size:
        obstore.put(st, path, [header, data], use_multipart=False)
    else:
        obstore.put(
            st, path, [header, data], use_multipart=True, chunk_size=part_size, max_concurrency=part_concurrency
        )


def get_into(
    st: ObjectStore,
    path: str,
    key: bytes,
    out: memoryview,
    part_size: int,
    layout_digest: bytes,
    etag: list[str | None],
) -> ChunkHeader:
    """GET the object of ``key`` into ``out`` and check its size and header; return the header
    (the caller checks the payload checksum). ``etag[0]`` is set as soon as it is known."""
    total = ChunkHeader.packed_size(len(key)) + out.nbytes
    if total <= part_size:
        return _get_whole(st, path, key, out, total, layout_digest, etag)
    return _get_ranged(st, path, key, out, part_size, total, layout_digest, etag)


def _get_whole(
    st: ObjectStore, path: str, key: bytes, out: memoryview, total: int, digest: bytes, etag: list[str | None]
) -> ChunkHeader:
    res = obstore.get(st, path)
    etag[0] = res.meta.get("e_tag")
    check_size("object", res.meta["size"], total, key, " (truncated or foreign)")
    body = memoryview(res.bytes())
    check_size("object body", body.nbytes, total, key)
    hsize = total - out.nbytes
    header = read_header(body[:hsize], key, digest, out.nbytes)
    out[:] = body[hsize:]  # the one copy: Rust-owned response buffer -> primary slot
    return header


def _get_ranged(
    st: ObjectStore,
    path: str,
    key: bytes,
    out: memoryview,
    part_size: int,
    total: int,
    digest: bytes,
    etag: list[str | None],
) -> ChunkHeader:
    # The first part alone first: its answer tells the object's size, and a range past the
    # end of a short object can make obstore panic rather than fail.
    res = obstore.get(st, path, options={"range": (0, part_size)})
    etag[0] = res.meta.get("e_tag")
    check_size("object", res.meta["size"], total, key, " (truncated or foreign)")
    first = memoryview(res.bytes())
    check_size("first part", first.nbytes, part_size, key)
    hsize = total - out.nbytes
    header = read_header(first[:hsize], key, digest, out.nbytes)
    out[: part_size - hsize] = first[hsize:]
    del first, res
    starts = list(range(part_size, total, part_size))
    lengths = [min(part_size, total - s) for s in starts]
    parts = obstore.get_ranges(st, path, starts=starts, lengths=lengths, coalesce=0)
    check_size("the sum of the object's parts", part_size + sum(len(p) for p in parts), total, key)
    pos = part_size - hsize
    for p in parts:
        mv = memoryview(p)
        out[pos : pos + mv.nbytes] = mv
        pos += mv.nbytes
    return header


def verify_payload(out: memoryview, header: ChunkHeader, key: bytes) -> None:
    """Raise :class:`IntegrityError` if the payload that arrived is not the one stored."""
    if checksum(out) != header.checksum:
        raise IntegrityError("chunk payload checksum mismatch", key)
