"""The bench's primary buffer: page-aligned (torch when installed), with a reference copy of its bytes."""

from __future__ import annotations

import os
from typing import Any

from ...spec import OffloadingSpec
from ..sizes import MiB

__all__ = ["PrimaryBuffer"]

_PAGE = 4096


class PrimaryBuffer:
    """A page-aligned primary buffer (torch when installed) and a reference copy of its bytes."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.kind = "bytearray"
        self._keep: Any = None
        self.view = self._allocate(nbytes)
        self._np: Any = None
        try:
            import numpy as np

            self._np = np
        except ImportError:  # pragma: no cover - numpy comes with torch
            pass
        self.ref = self._random(nbytes)
        self.view[:] = self.ref
        self.dirty_bytes = 0

    def _allocate(self, nbytes: int) -> memoryview:
        try:
            import torch

            from ...torch_interop import allocate_primary
        except ImportError:
            self._keep = bytearray(nbytes + _PAGE)
            mv = memoryview(self._keep)
        else:
            # allocate_primary pins when CUDA is available; torch's CPU allocator aligns to 64
            # bytes only, and O_DIRECT wants page-aligned buffers (as pinned memory is).
            tensor, mv = allocate_primary(OffloadingSpec(nbytes + _PAGE, 1, "asynctier/bench"))
            self._keep = tensor
            self.kind = f"torch.uint8 tensor{' (pinned)' if tensor.is_pinned() else ''}, torch {torch.__version__}"
        from ...posix_io import buffer_address

        off = (-buffer_address(mv)) % _PAGE
        return mv[off : off + nbytes]

    def _random(self, nbytes: int) -> memoryview:
        try:
            import numpy as np
        except ImportError:  # pragma: no cover
            return memoryview(bytearray(os.urandom(nbytes)))
        # 64-bit integers from numpy's generator: full-entropy bytes, quicker than os.urandom
        rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
        top = np.iinfo(np.uint64).max
        words = rng.integers(0, top, size=(nbytes + 7) // 8, dtype=np.uint64, endpoint=True)
        data: Any = words.view(np.uint8)[:nbytes]
        return memoryview(data).cast("B")

    def restore(self) -> None:
        """Put the reference bytes back where a load or a reference run changed them."""
        if self.dirty_bytes:
            self.view[: self.dirty_bytes] = self.ref[: self.dirty_bytes]
            self.dirty_bytes = 0

    def zero(self, nbytes: int) -> None:
        """Zero the first ``nbytes`` (so a load that writes nothing cannot pass verification)."""
        self.dirty_bytes = max(self.dirty_bytes, nbytes)
        if self._np is not None:
            self._np.frombuffer(self.view[:nbytes], dtype=self._np.uint8).fill(0)  # memset in place
        else:
            self.view[:nbytes] = bytes(nbytes)

    def same(self, slot_off: int, ref_off: int, n: int) -> bool:
        """Whether ``n`` bytes at ``slot_off`` of the buffer equal the reference at ``ref_off``."""
        if self._np is not None:
            np = self._np
            a = np.frombuffer(self.view[slot_off : slot_off + n], dtype=np.uint8)
            b = np.frombuffer(self.ref[ref_off : ref_off + n], dtype=np.uint8)
            # compare 4 MiB at a time: one big temporary would cost more in page faults than the compare
            step = 4 * MiB
            return all(np.array_equal(a[i : i + step], b[i : i + step]) for i in range(0, n, step))
        return self.view[slot_off : slot_off + n] == self.ref[ref_off : ref_off + n]
