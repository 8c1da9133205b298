"""Integrity framing for tiers built on the helper base classes.

A tier that stores opaque records (``frames_own_bytes = False``, the default) receives in
``write_chunk`` the chunk *framed*: the project's header (format version, key, payload length,
xxh3 of the payload, layout digest; see :mod:`asynctier.integrity`) followed by the payload.
``read_chunk`` fills a buffer of :func:`frame_size` bytes with what was stored (and may return
how many bytes it filled), and the base class checks it before one byte reaches the caller's
slot. A bad record fails its key with
:class:`~asynctier.errors.IntegrityError` and is removed.

Framing costs one copy each way (header and payload are made contiguous for the tier). The
built-in tiers place the header themselves, zero-copy, and set ``frames_own_bytes = True``.
"""

from __future__ import annotations

import threading

from ..errors import IntegrityError
from ..integrity import ChunkHeader, checksum, pack_header
from ..spec import OffloadingSpec

__all__ = ["Framing", "frame_size"]


def frame_size(key: bytes, chunk_bytes: int) -> int:
    """Bytes a framed chunk of ``key`` occupies: header plus payload."""
    return ChunkHeader.packed_size(len(key)) + chunk_bytes


class Framing:
    """Frames and checks records for one tier (its spec and ``verify`` setting)."""

    def __init__(self, spec: OffloadingSpec, verify: bool) -> None:
        self.chunk_bytes = spec.chunk_bytes
        self.digest = spec.layout_digest
        self.verify = verify
        self._scratch = threading.local()  # one record buffer per worker thread, for framing

    def buffer(self, key: bytes, *, per_thread: bool) -> memoryview:
        """A writable buffer of exactly :func:`frame_size` bytes (per worker thread, or fresh)."""
        n = frame_size(key, self.chunk_bytes)
        if not per_thread:
            return memoryview(bytearray(n))
        buf: bytearray | None = getattr(self._scratch, "buf", None)
        if buf is None or len(buf) < n:
            buf = self._scratch.buf = bytearray(n)
        return memoryview(buf)[:n]

    def read_buffer(self, key: bytes) -> memoryview:
        """A fresh buffer for a read, its last byte 0xFF. A reused one would hold an earlier
        record (of this key, whole: it passes the checksum) where a short copy ends, and no
        bookkeeping of what it holds survives a ``read_chunk`` that copies and then raises
        (reviews found three ways through it). A short copy now ends on zeros and that byte:
        a record's payload checksum fails unless the bytes missing were exactly those, and a
        count, where ``read_chunk`` returns one, tells it anyway."""
        out = self.buffer(key, per_thread=False)
        out[-1] = 0xFF
        return out

    def check_filled(self, key: bytes, record: memoryview, filled: object) -> bool:
        """``read_chunk`` may return the number of bytes it filled; another count is a copy of
        the wrong length. Returns whether a count was given."""
        if not isinstance(filled, int) or isinstance(filled, bool):
            return False
        if filled != record.nbytes:
            what = "truncated" if filled < record.nbytes else "longer than a record"
            raise IntegrityError(f"stored record is {filled} bytes, expected {record.nbytes} ({what})", key)
        return True

    def read_checked(self, key: bytes, record: memoryview, filled: object, out: memoryview) -> None:
        """Check what ``read_chunk`` filled into ``record`` (and the count it returned) and copy
        its payload into ``out``. Without a count a short copy cannot be told from a whole
        one (a reused buffer keeps an earlier record's tail, a fresh one zeros): the payload's
        checksum is then checked even where ``verify`` is off."""
        counted = self.check_filled(key, record, filled)
        self.unframe(key, record, out, check_data=self.verify or not counted)

    def frame(self, key: bytes, payload: memoryview, *, per_thread: bool) -> memoryview:
        """Header and payload of ``key`` as one read-only record."""
        header = pack_header(key, payload.nbytes, checksum(payload), self.digest)
        out = self.buffer(key, per_thread=per_thread)
        h = len(header)
        out[:h] = header
        out[h:] = payload
        return out.toreadonly()

    def unframe(self, key: bytes, record: memoryview, out: memoryview, *, check_data: bool | None = None) -> None:
        """Check ``record`` (as read back for ``key``) and copy its payload into ``out``.

        Raises :class:`IntegrityError` for a record of another key, layout or length, a torn
        header, or (with ``check_data``, default ``verify``) a payload that does not match its
        checksum.
        """
        header = ChunkHeader.unpack(record, key=key)
        payload = record[header.size :]
        if payload.nbytes != out.nbytes:
            raise IntegrityError(f"stored record holds {payload.nbytes} payload bytes, expected {out.nbytes}", key)
        check = self.verify if check_data is None else check_data
        header.verify(payload, layout_digest=self.digest, payload_len=out.nbytes, check_data=check)
        out[:] = payload
