"""Primary buffers on huge pages.

A tier moves a chunk with O_DIRECT straight from or into the primary buffer, and the kernel
hands the device one segment per physically contiguous piece of it: on 4 KiB pages a 256 KiB
chunk is 64 segments and a 2 MiB one 512, more than one request may carry (a virtio disk
takes 254, so its requests stop near 1 MiB); on 2 MiB transparent huge pages each is one.
Fewer segments cost the device (and a virtual disk's host) less per byte, and requests can
grow to the device's limit: the buffer's pages set how fast any O_DIRECT writer goes, fio
included (docs/configuration.md, "Huge pages").

:func:`allocate_buffer` makes such a buffer; :func:`huge_page_bytes` says how much of any
buffer is on huge pages. Standard library only (and ``ctypes`` for a buffer's address).
"""

from __future__ import annotations

import errno
import mmap
import os
import sys

__all__ = ["HUGE_PAGE", "allocate_buffer", "fault_in", "huge_page_bytes", "transparent_huge_pages"]

HUGE_PAGE = 2 << 20
"""The transparent huge page size this module aligns to (x86-64 and arm64 with 4 KiB pages)."""

_MADV_POPULATE_WRITE = 23  # Linux 5.14; not in Python 3.11's mmap module
_SMAPS = "/proc/self/smaps"
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"
# a mapping's memory on huge pages, by kind (one kind per mapping): transparent ones of private
# memory, of shared memory and tmpfs (vLLM's region in /dev/shm), of other files; hugetlbfs
_HUGE_FIELDS = (b"AnonHugePages:", b"ShmemPmdMapped:", b"FilePmdMapped:", b"Shared_Hugetlb:", b"Private_Hugetlb:")


def transparent_huge_pages() -> str | None:
    """The system's transparent huge page mode: ``"always"`` (large anonymous memory gets them
    unasked), ``"madvise"`` (only memory that asks, as :func:`allocate_buffer`'s does),
    ``"never"``; ``None`` where the system does not say (not Linux)."""
    try:
        with open(_THP_MODE, encoding="ascii") as f:
            text = f.read()
        return text[text.index("[") + 1 : text.index("]")]
    except (OSError, ValueError):
        return None


def allocate_buffer(nbytes: int, *, huge_pages: bool = True, populate: bool = True) -> memoryview:
    """A zeroed, writable, page-aligned primary buffer of ``nbytes``, its memory faulted in
    (``populate=False``: on first touch, page by page).

    With ``huge_pages`` (the default) the buffer starts on a 2 MiB boundary and asks the
    kernel for transparent huge pages (``MADV_HUGEPAGE``, where the platform has it), which works where
    ``/sys/kernel/mm/transparent_hugepage/enabled`` is ``always`` or ``madvise`` (most
    distributions); elsewhere, or where no huge page is free, it is on ordinary pages and
    works the same, only slower. :func:`huge_page_bytes` tells which. The memory is private
    to the process (a forked child gets a copy-on-write view, as with any heap memory) and
    is returned to the system when the last view of it is released. Faulting it in costs what
    the first touch of that much memory costs anyway (zeroing it; about 2 s a GiB on this
    project's virtual machines, where the host hands the memory over then); with
    ``populate=False`` each page is faulted in by the first transfer into or out of it.
    Raises ``MemoryError`` where the system cannot map ``nbytes``.
    """
    if type(nbytes) is bool or not isinstance(nbytes, int):
        raise TypeError(f"nbytes must be an int, got {type(nbytes).__name__} {nbytes!r}")
    if nbytes <= 0:
        raise ValueError(f"nbytes must be positive, got {nbytes}")
    if type(huge_pages) is not bool:
        raise TypeError(f"huge_pages must be True or False, got {type(huge_pages).__name__} {huge_pages!r}")
    if type(populate) is not bool:
        raise TypeError(f"populate must be True or False, got {type(populate).__name__} {populate!r}")
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    # False asks for ordinary pages even where the system gives huge ones unasked ("always")
    advice = getattr(mmap, "MADV_HUGEPAGE" if huge_pages else "MADV_NOHUGEPAGE", None)
    # room to start on a huge page boundary: the kernel aligns large anonymous mappings on
    # its own since 6.7 (for sizes that are multiples of 2 MiB), earlier ones do not
    slack = HUGE_PAGE if huge_pages and advice is not None else 0
    try:
        m = mmap.mmap(-1, nbytes + slack, flags=flags) if flags else mmap.mmap(-1, nbytes + slack)
    except (OSError, OverflowError) as e:
        raise MemoryError(f"allocate_buffer: cannot map {nbytes} bytes ({e})") from e
    start = 0
    if slack:
        from .posix_io import buffer_address

        with memoryview(m) as whole:
            start = -buffer_address(whole) % HUGE_PAGE
    if advice is not None:
        try:
            m.madvise(advice, start, nbytes)
        except OSError:  # a kernel without transparent huge pages: ordinary pages either way
            pass
    view = memoryview(m)[start : start + nbytes]
    if populate:
        _populate(m, view)
    return view


def _populate(m: mmap.mmap, view: memoryview) -> None:
    """Fault the fresh buffer in now; memory the system cannot give is a ``MemoryError``."""
    try:
        fault_in(view)
    except MemoryError:
        view.release()
        m.close()
        raise


def fault_in(view: memoryview) -> None:
    """Fault ``view``'s memory in now, for writing, keeping its contents: huge pages where
    they were asked for, and with Python's lock released (a call into the C library, on
    Linux 5.14 and later), so that on a worker thread (``anyio.to_thread``) the faults, and
    the kernel's compaction for huge pages, leave the event loop alone. Without that, each
    page is written back with its own byte, holding the lock. ``MemoryError`` where the
    system cannot give the memory."""
    if not isinstance(view, memoryview):
        raise TypeError(f"view must be a memoryview, got {type(view).__name__}")
    if view.readonly:
        raise TypeError("view must be writable: its pages are faulted in for writing")
    if view.nbytes == 0:
        return
    if sys.platform.startswith("linux"):
        import ctypes

        from .posix_io import buffer_address, libc

        addr = buffer_address(view)
        lo = addr - addr % mmap.PAGESIZE
        length = addr + view.nbytes - lo
        madvise = libc().madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madvise.restype = ctypes.c_int
        if madvise(lo, length, _MADV_POPULATE_WRITE) == 0:
            return
        err = ctypes.get_errno()
        if err != errno.EINVAL:  # out of memory (not "unknown advice"): no touching on
            raise MemoryError(f"cannot fault in {view.nbytes} bytes ({os.strerror(err)})")
        # before Linux 5.14: below
    flat = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    for off in range(0, flat.nbytes, mmap.PAGESIZE):
        flat[off] = flat[off]
    flat[-1] = flat[-1]  # (the last page, where the view starts inside its first one)


def huge_page_bytes(view: memoryview) -> int | None:
    """How many bytes of ``view``'s memory are on huge pages at least, from the kernel's
    per-mapping counts (``/proc/self/smaps``): transparent huge pages of private memory, of
    shared memory and tmpfs files (a region in ``/dev/shm``, as vLLM's), or hugetlb pages;
    ``None`` where the system does not say (not Linux). Exact for :func:`allocate_buffer`'s
    buffers (the advice gives them a kernel mapping of their own). A view that shares its
    mapping with other memory (a torch tensor inside the allocator's heap, where THP is
    ``always``) is counted the mapping's huge pages less the part of it outside the view: a
    lower bound, never another buffer's pages.
    """
    if not isinstance(view, memoryview):
        raise TypeError(f"view must be a memoryview, got {type(view).__name__}")
    try:
        with open(_SMAPS, "rb") as f:  # bytes: a mapped file's name may be in any encoding
            smaps = f.read().splitlines()
    except OSError:
        return None
    from .posix_io import buffer_address

    lo = buffer_address(view)
    hi = lo + view.nbytes
    total = 0
    overlap = outside = 0
    for line in smaps:
        head = line.split(None, 1)[0] if line.strip() else b""
        if head.endswith(b":"):  # a field of the current mapping
            if overlap and head in _HUGE_FIELDS:
                # at least what cannot all lie outside the view, and no more than its share
                total += max(0, min(overlap, int(line.split()[1]) * 1024 - outside))
            continue
        try:  # a mapping's first line: start-end perms offset dev inode [path]
            a, b = (int(x, 16) for x in head.split(b"-"))
        except ValueError:
            overlap = 0
            continue
        overlap = max(0, min(b, hi) - max(a, lo))
        outside = (b - a) - overlap
    return total
