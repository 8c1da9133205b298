"""A custom tier in a few dozen lines: one file per chunk in a directory.

Only the four per-chunk primitives are written here; the in-flight bound, loads ahead of
stores, back-pressure, stats and cancellation safety come from BlockingChunkTier.
Use it with: {"type": "DirTier", "module_path": "dir_tier", "root": "/tmp/kv"}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from asynctier import BlockingChunkTier, ChunkNotFoundError
from asynctier.integrity import key_token


class DirTier(BlockingChunkTier):
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
            f.write(data)  # from the primary buffer's slice, no copy
        os.replace(tmp, self._path(key))  # readers never see a partial chunk

    def read_chunk(self, key: bytes, out: memoryview) -> None:
        try:
            with open(self._path(key), "rb", buffering=0) as f:
                n = f.readinto(out)  # straight into the primary slot
        except FileNotFoundError:
            raise ChunkNotFoundError("not stored", key) from None
        if n != len(out):
            raise ChunkNotFoundError(f"truncated chunk ({n} bytes)", key)

    def chunk_exists(self, key: bytes) -> bool:
        return self._path(key).exists()

    def delete_chunk(self, key: bytes) -> bool:
        try:
            self._path(key).unlink()
            return True
        except FileNotFoundError:
            return False
