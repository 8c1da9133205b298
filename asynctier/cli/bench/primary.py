"""The bench's primary buffer: page-aligned, on huge pages unless asked not to (torch when
installed), with a reference copy of its bytes."""

from __future__ import annotations

import os
from typing import Any

from ...spec import OffloadingSpec
from ..sizes import MiB

__all__ = ["PrimaryBuffer"]


class PrimaryBuffer:
    """A page-aligned primary buffer (torch when installed) and a reference copy of its bytes;
    on transparent huge pages where the system has them, unless ``huge_pages`` is False."""

    def __init__(self, nbytes: int, huge_pages: bool = True) -> None:
        self.nbytes = nbytes
        self.kind = "mmap"
        self._keep: Any = None
        self.view = self._allocate(nbytes, huge_pages)
        from ...buffers import huge_page_bytes

        huge = huge_page_bytes(self.view)
        #: the share of the buffer on huge pages (None: the system does not say); it sets the
        #: size of the tiers' O_DIRECT requests (docs/configuration.md, "Huge pages")
        self.huge_share = None if huge is None else huge / max(nbytes, 1)
        if self.huge_share is not None:
            self.kind += f", {self.huge_share:.0%} on huge pages"
        self._np: Any = None
        try:
            import numpy as np

            self._np = np
        except ImportError:  # pragma: no cover - numpy comes with torch
            pass
        self.ref = self._random(nbytes)
        self.view[:] = self.ref
        self.dirty_bytes = 0

    def _allocate(self, nbytes: int, huge_pages: bool) -> memoryview:
        try:
            import torch

            from ...torch_interop import allocate_primary
        except ImportError:
            from ...buffers import allocate_buffer

            return allocate_buffer(max(nbytes, 1), huge_pages=huge_pages)[:nbytes]
        # unpinned: the bench copies nothing to a GPU, and pinned memory comes from CUDA's
        # allocator, on pages this bench cannot choose; page-aligned, as O_DIRECT wants
        spec = OffloadingSpec(max(nbytes, 1), 1, "asynctier/bench")
        tensor, mv = allocate_primary(spec, pin_memory=False, huge_pages=huge_pages)
        self._keep = tensor
        self.kind = f"torch.uint8 tensor{' (pinned)' if tensor.is_pinned() else ''}, torch {torch.__version__}"
        return mv[:nbytes]

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
