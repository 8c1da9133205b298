"""A custom tier in a few dozen lines: one file per chunk in a directory.

Only the four per-chunk primitives are written here; the in-flight bound, loads ahead of
stores, back-pressure, stats, cancellation safety and integrity come from BlockingChunkTier.
With ``frames_own_bytes = False`` the base class hands ``write_chunk`` each chunk as one record
(a header with the key, length, layout and checksum, then the payload) and checks the record
``read_chunk`` returns: a damaged, truncated or misplaced file fails its key and is removed,
with no checksum code here.
Use it with: {"type": "DirTier", "module_path": "dir_tier", "root": "/tmp/kv"}
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from asynctier import BlockingChunkTier, ChunkNotFoundError, IntegrityError
from asynctier.integrity import key_token


class DirTier(BlockingChunkTier):
    frames_own_bytes = False  # the base class frames and checks every record

    def __init__(self, *, root: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)  # the common knobs: max_inflight, store_backpressure, ...
        self.dir = Path(root) / self.offloading_spec.layout_id  # never mix layouts

    def open_medium(self) -> None:  # runs in a worker thread at `async with tier`
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, key: bytes) -> Path:
        return self.dir / key_token(key)  # keys are bytes: encode them, never use them raw

    def write_chunk(self, key: bytes, data: memoryview) -> None:
        tmp = self._path(key).with_suffix(f".tmp{os.getpid()}-{id(data)}")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, self._path(key))  # readers never see a partial chunk

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        try:  # O_NONBLOCK: a FIFO planted at the name must not block this thread forever
            fd = os.open(self._path(key), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise ChunkNotFoundError("not stored", key) from None
        with open(fd, "rb", buffering=0) as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise IntegrityError("not a regular file", key)
            n = f.readinto(out)
        if n != len(out):  # a bad copy: the base class removes it
            raise IntegrityError(f"stored record is {n} bytes, expected {len(out)}", key)

    def chunk_exists(self, key: bytes) -> bool:
        return self._path(key).exists()

    def delete_chunk(self, key: bytes) -> bool:
        try:
            self._path(key).unlink()
            return True
        except FileNotFoundError:
            return False
