"""Primary buffers as torch tensors, seen as memoryviews with no copy (extra ``torch``).

Needs torch only (no numpy): the view is made over the tensor's memory with ctypes.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING

from .spec import OffloadingSpec

if TYPE_CHECKING:
    import torch

__all__ = ["allocate_primary", "tensor_view"]

_PAGE = 4096


def tensor_view(tensor: torch.Tensor) -> memoryview:
    """A writable byte memoryview over a contiguous CPU tensor's storage, without copying.

    The view keeps the tensor alive. Raises ``TypeError`` for a tensor on another device or
    one that is not contiguous. torch keeps no read-only flag: a tensor over read-only memory
    (``torch.from_numpy`` of a read-only ``np.memmap``) gives a writable view all the same,
    and a load into it kills the process; give such memory as ``memoryview(array)``, which a
    load refuses.
    """
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor; got {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise TypeError(f"tensor must live in CPU memory; it is on {tensor.device}")
    if not tensor.is_contiguous():
        raise TypeError("tensor must be contiguous; call .contiguous() first (that copies)")
    flat = tensor.reshape(-1).view(torch.uint8)  # reinterpret, no copy (any dtype, bf16 too)
    raw = (ctypes.c_ubyte * flat.numel()).from_address(flat.data_ptr())
    raw.tensor = flat  # type: ignore[attr-defined]  # the view keeps raw alive, raw the tensor
    return memoryview(raw).cast("B")


def allocate_primary(
    spec: OffloadingSpec, *, pin_memory: bool | None = None, huge_pages: bool = True
) -> tuple[torch.Tensor, memoryview]:
    """Allocate a primary buffer for ``spec`` as a uint8 tensor and its memoryview.

    ``pin_memory=None`` pins (page-locks) the buffer when CUDA is available, so GPU copies
    to and from it run asynchronously; pinned memory comes from CUDA's allocator. Unpinned,
    the buffer is :func:`asynctier.buffers.allocate_buffer`'s: on transparent huge pages
    where the system has them (``huge_pages=False``: ordinary pages), which lets the device
    take a chunk in fewer, larger requests (docs/configuration.md, "Huge pages"). Either way
    the buffer starts on a page boundary (torch's CPU allocator only promises 64 bytes), so
    tiers can move chunks with O_DIRECT straight from and into it, without bounce copies.
    """
    import torch

    if type(huge_pages) is not bool:
        raise TypeError(f"huge_pages must be True or False, got {type(huge_pages).__name__} {huge_pages!r}")
    if pin_memory is not None and type(pin_memory) is not bool:
        raise TypeError(f"pin_memory must be True, False or None, got {type(pin_memory).__name__} {pin_memory!r}")
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    if not pin:
        from .buffers import allocate_buffer

        # frombuffer shares the memory and keeps this view (and so the mapping) alive; the
        # caller gets a view of the tensor instead, whose release() cannot unmap it
        t = torch.frombuffer(allocate_buffer(spec.total_bytes, huge_pages=huge_pages), dtype=torch.uint8)
        return t, tensor_view(t)
    raw = torch.zeros(spec.total_bytes + _PAGE, dtype=torch.uint8, pin_memory=True)
    skip = -raw.data_ptr() % _PAGE
    t = raw[skip : skip + spec.total_bytes]  # a view: keeps the whole allocation alive
    return t, tensor_view(t)
