"""asynctier.buffers: primary buffers on huge pages, and how much of a buffer is on them."""

from __future__ import annotations

import gc
import mmap
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from asynctier import OffloadingSpec, SecondaryTierFactory
from asynctier.buffers import HUGE_PAGE, allocate_buffer, fault_in, huge_page_bytes, transparent_huge_pages
from asynctier.posix_io import buffer_address

needs_thp = pytest.mark.skipif(
    transparent_huge_pages() not in ("always", "madvise"), reason="no transparent huge pages on this system"
)


def test_a_buffer_is_zeroed_writable_page_aligned_and_exactly_its_size() -> None:
    for n in (1, 4096, 3 * HUGE_PAGE + 12345):
        for huge in (True, False):
            view = allocate_buffer(n, huge_pages=huge)
            assert view.nbytes == n and view.format == "B" and not view.readonly
            assert buffer_address(view) % mmap.PAGESIZE == 0
            assert not any(view[:: max(1, n // 97)]) and view[-1] == 0
            view[-1] = 7
            assert view[-1] == 7


@needs_thp
def test_a_huge_page_buffer_starts_on_a_huge_page_and_is_on_huge_pages() -> None:
    view = allocate_buffer(4 * HUGE_PAGE)
    assert buffer_address(view) % HUGE_PAGE == 0
    # faulted in at allocation: the huge pages are there before any I/O touches them (the
    # kernel may fall back to small pages under memory pressure, so not all of them need be)
    huge = huge_page_bytes(view)
    assert huge is not None and huge >= HUGE_PAGE, huge


@needs_thp
def test_populate_false_leaves_the_pages_to_their_first_touch_still_huge() -> None:
    view = allocate_buffer(4 * HUGE_PAGE, populate=False)
    assert huge_page_bytes(view) == 0  # nothing faulted in yet: an idle buffer holds no memory
    view[HUGE_PAGE] = 1  # one byte faults in its whole huge page
    assert huge_page_bytes(view) == HUGE_PAGE


async def test_a_chains_call_slots_are_faulted_in_at_open_on_huge_pages(disk_tmp_path: Path) -> None:
    spec = OffloadingSpec(HUGE_PAGE, 4, namespace="buffers-chain")
    view = allocate_buffer(spec.total_bytes)
    view[:] = b"\x5a" * spec.total_bytes
    cfg = {
        "type": "chain",
        "tiers": [
            {"type": "memory", "capacity_bytes": 2 * HUGE_PAGE},
            {"type": "fs", "root": str(disk_tmp_path / "fs")},
        ],
    }
    tier: Any = SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
    assert huge_page_bytes(tier._staging) == 0  # built: no memory held yet
    async with tier:
        at_open = huge_page_bytes(tier._staging)
        keys = [b"c%d" % i for i in range(4)]
        assert (await tier.offload(keys, [0, 1, 2, 3])).ok
        view[:] = bytes(spec.total_bytes)
        assert (await tier.load(keys, [0, 1, 2, 3])).ok
        staged = huge_page_bytes(tier._staging)
    assert bytes(view) == b"\x5a" * spec.total_bytes
    if transparent_huge_pages() in ("always", "madvise"):
        # the calls' slots faulted in by open (on a worker thread), not by the first chunks on
        # the event loop; the background's 1024 slots left untouched until used
        calls = tier.max_inflight * spec.chunk_bytes
        assert at_open is not None and calls - HUGE_PAGE <= at_open <= calls + HUGE_PAGE, (at_open, calls)
        assert tier._staging.nbytes > 8 * calls
        assert staged is not None and staged > 0


def test_fault_in_keeps_the_contents_and_refuses_what_it_cannot_fault_in() -> None:
    view = allocate_buffer(3 * HUGE_PAGE, populate=False)
    view[12345:12350] = b"kept!"
    fault_in(view[7:])  # a view that starts inside a page
    assert bytes(view[12345:12350]) == b"kept!" and not any(view[:12345])
    if transparent_huge_pages() in ("always", "madvise"):
        assert (huge_page_bytes(view) or 0) >= 2 * HUGE_PAGE  # faulted in as the huge pages asked for
    with pytest.raises(TypeError, match="view must be writable"):
        fault_in(memoryview(b"read-only"))
    with pytest.raises(TypeError, match="view must be a memoryview, got bytearray"):
        fault_in(bytearray(8))  # type: ignore[arg-type]


def test_fault_in_touches_each_page_where_the_kernel_does_not_know_the_advice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asynctier.buffers as buffers

    monkeypatch.setattr(buffers, "_MADV_POPULATE_WRITE", 0x7FFF)  # EINVAL, as before Linux 5.14
    view = allocate_buffer(2 * HUGE_PAGE, populate=False)
    view[-3:] = b"end"
    buffers.fault_in(view[1:])
    assert bytes(view[-3:]) == b"end" and not any(view[:-3])
    if transparent_huge_pages() in ("always", "madvise"):
        assert huge_page_bytes(view) == 2 * HUGE_PAGE  # every page touched


@needs_thp
def test_huge_pages_false_asks_for_ordinary_pages_even_where_the_system_gives_huge_ones() -> None:
    view = allocate_buffer(4 * HUGE_PAGE, huge_pages=False)
    assert huge_page_bytes(view) == 0


@pytest.mark.skipif(
    transparent_huge_pages() != "madvise", reason="what is on huge pages unasked depends on the THP mode"
)
def test_a_bytearray_or_a_shared_mapping_is_not_on_transparent_huge_pages() -> None:
    # shared anonymous memory (mmap.mmap(-1, n), Python's default) is shmem: its huge pages
    # follow shmem_enabled, "never" on most systems; private memory is what the kernel backs
    assert huge_page_bytes(memoryview(bytearray(64))) == 0
    shared = mmap.mmap(-1, 4 * HUGE_PAGE)
    with memoryview(shared) as view:
        view[:: mmap.PAGESIZE] = b"\1" * (4 * HUGE_PAGE // mmap.PAGESIZE)
        assert huge_page_bytes(view) == 0 or _shmem_huge()


def _shmem_huge() -> bool:
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read_text()
    except OSError:
        return False
    return "[never]" not in text and "[deny]" not in text


def test_the_buffer_outlives_the_name_it_was_returned_under() -> None:
    view = allocate_buffer(HUGE_PAGE + 1)
    part = view[HUGE_PAGE:]
    del view
    gc.collect()
    part[0] = 9  # the mapping is kept by any view of it
    assert part[0] == 9


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"nbytes": True}, TypeError, "nbytes must be an int, got bool"),
        ({"nbytes": 4096.0}, TypeError, "nbytes must be an int, got float"),
        ({"nbytes": "4096"}, TypeError, "nbytes must be an int, got str"),
        ({"nbytes": 0}, ValueError, "nbytes must be positive, got 0"),
        ({"nbytes": -1}, ValueError, "nbytes must be positive, got -1"),
        ({"nbytes": 4096, "huge_pages": 1}, TypeError, "huge_pages must be True or False, got int 1"),
        ({"nbytes": 4096, "huge_pages": None}, TypeError, "huge_pages must be True or False, got NoneType"),
        ({"nbytes": 4096, "populate": 0}, TypeError, "populate must be True or False, got int 0"),
    ],
)
def test_bad_arguments_are_refused_with_what_is_accepted(kwargs: dict[str, Any], exc: type, match: str) -> None:
    with pytest.raises(exc, match=match):
        allocate_buffer(**kwargs)


def test_a_size_the_system_cannot_map_is_a_memory_error_that_says_so() -> None:
    with pytest.raises(MemoryError, match=r"allocate_buffer: cannot map 4611686018427387904 bytes"):
        allocate_buffer(1 << 62)


@pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/smaps is Linux's")
def test_huge_page_bytes_reads_past_a_mapped_file_whose_name_is_not_ascii(tmp_path: Path) -> None:
    f = tmp_path / "caf\u00e9-\udcff.bin"  # not even valid UTF-8: file names are bytes
    f.write_bytes(b"\0" * 4096)
    with open(f, "r+b") as fh, mmap.mmap(fh.fileno(), 4096) as mapped:
        view = allocate_buffer(HUGE_PAGE)
        assert huge_page_bytes(view) is not None
        assert mapped[0] == 0


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() != 0, reason="mounts a tmpfs (Linux, root)")
def test_huge_page_bytes_counts_a_shared_file_mapping_on_huge_pages(tmp_path: Path) -> None:
    """vLLM's region is a file in /dev/shm mapped shared: where that tmpfs gives huge pages,
    smaps counts them as ShmemPmdMapped, not AnonHugePages (they read as 0 before)."""
    mnt = tmp_path / "huge-tmpfs"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "huge=always,size=16M", "tmpfs", str(mnt)],
                             capture_output=True)  # fmt: skip
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        fd = os.open(mnt / "region", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, 2 * HUGE_PAGE)
            m = mmap.mmap(fd, 2 * HUGE_PAGE, flags=mmap.MAP_SHARED)
            view = memoryview(m)
            view[:: mmap.PAGESIZE] = b"\1" * (2 * HUGE_PAGE // mmap.PAGESIZE)
            whole, half = huge_page_bytes(view), huge_page_bytes(view[:HUGE_PAGE])
            view.release()
            m.close()
        finally:
            os.close(fd)
    finally:
        subprocess.run(["umount", "--lazy", str(mnt)], check=True)  # (lazy: whatever still maps it)
    assert whole == 2 * HUGE_PAGE
    assert half == HUGE_PAGE  # the mapping's huge pages less what lies outside the view


def test_huge_page_bytes_takes_a_memoryview_only() -> None:
    with pytest.raises(TypeError, match="view must be a memoryview, got bytearray"):
        huge_page_bytes(bytearray(8))  # type: ignore[arg-type]


@pytest.mark.skipif(sys.platform != "linux", reason="/proc/self/smaps is Linux's")
def test_huge_page_bytes_counts_only_the_part_of_a_mapping_inside_the_view() -> None:
    view = allocate_buffer(4 * HUGE_PAGE)
    whole = huge_page_bytes(view)
    assert whole is not None
    half = huge_page_bytes(view[: 2 * HUGE_PAGE])
    assert half is not None and half <= min(whole, 2 * HUGE_PAGE)
    assert huge_page_bytes(view[:4096]) in (0, 4096)


async def test_a_huge_page_buffer_round_trips_through_the_nvme_tier_with_o_direct(disk_tmp_path: Path) -> None:
    spec = OffloadingSpec(HUGE_PAGE, 4, namespace="buffers")
    view = allocate_buffer(spec.total_bytes)
    data = bytes(range(256)) * (spec.total_bytes // 256)
    view[:] = data
    cfg = {"type": "nvme", "path": str(disk_tmp_path / "slab"), "capacity_bytes": 16 * (HUGE_PAGE + 4096)}
    async with SecondaryTierFactory.create_secondary_tier(cfg, view, spec) as tier:
        keys = [b"b%d" % i for i in range(4)]
        assert (await tier.offload(keys, [0, 1, 2, 3])).ok
        view[:] = bytes(spec.total_bytes)
        assert (await tier.load(keys, [3, 2, 1, 0])).ok
        st = tier.stats().extra
    assert st.get("bounce_copies", 0) == 0  # straight from and into the buffer
    c = HUGE_PAGE
    assert bytes(view[: 4 * c]) == data[3 * c :] + data[2 * c : 3 * c] + data[c : 2 * c] + data[:c]


def test_torch_allocate_primary_is_on_the_buffers_huge_pages_unless_pinned_or_asked_not_to() -> None:
    torch = pytest.importorskip("torch")
    from asynctier.torch_interop import allocate_primary

    spec = OffloadingSpec(HUGE_PAGE, 2)
    t, view = allocate_primary(spec, pin_memory=False)
    assert t.dtype == torch.uint8 and t.numel() == spec.total_bytes and t.data_ptr() == buffer_address(view)
    if transparent_huge_pages() in ("always", "madvise"):
        assert buffer_address(view) % HUGE_PAGE == 0
        assert (huge_page_bytes(view) or 0) >= HUGE_PAGE
        _, base = allocate_primary(spec, pin_memory=False, huge_pages=False)
        assert huge_page_bytes(base) == 0
    view.release()  # the caller's view released: the tensor's memory stays mapped
    del view
    gc.collect()
    t[-1] = 5  # the tensor keeps the memory alive on its own
    assert int(t[-1]) == 5
    with pytest.raises(TypeError, match="huge_pages must be True or False, got int"):
        allocate_primary(spec, huge_pages=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pin_memory must be True, False or None, got int"):
        allocate_primary(spec, pin_memory=0)  # type: ignore[arg-type]


def test_import_asynctier_buffers_stays_light() -> None:
    code = (
        "import sys; import asynctier.buffers\n"
        "heavy = {'ctypes', 'torch', 'numpy'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_transparent_huge_pages_reads_the_systems_mode() -> None:
    mode = transparent_huge_pages()
    path = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not path.exists():
        assert mode is None
    else:
        assert mode in ("always", "madvise", "never") and f"[{mode}]" in path.read_text()
