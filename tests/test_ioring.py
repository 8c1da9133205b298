"""The loop-driven io_uring ring: entries, links, direct slots, batching, cancellation, teardown."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import pytest

from asynctier import ioring
from asynctier.ioring import IOSQE_FIXED_FILE, IOSQE_IO_HARDLINK, IOSQE_IO_LINK, IovecTable, LoopRing, Ring
from asynctier.posix_io import buffer_address

_WHY = ioring.problem()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"io_uring unavailable: {_WHY}")


def _drain(ring: Ring, n: int) -> dict[int, int]:
    got: dict[int, int] = {}
    while len(got) < n:
        ring.wait(1)
        got.update({ud: res for ud, res, _ in ring.reap()})
    return got


def test_write_then_read_through_a_registered_slot(tmp_path: Path) -> None:
    ring = Ring(entries=8, files=2)
    try:
        dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        data = memoryview(bytearray(os.urandom(8192)))
        iov = ring.iovec([data[:4096], data[4096:]])
        keep = [ring.prep_openat(1, dfd, b"f", os.O_WRONLY | os.O_CREAT | os.O_EXCL, slot=1, sqe_flags=IOSQE_IO_LINK)]
        ring.prep_rw(2, True, 1, iov, 0, sqe_flags=IOSQE_IO_LINK | IOSQE_FIXED_FILE)
        keep.append(ring.prep_renameat(3, dfd, b"f", dfd, b"g", sqe_flags=IOSQE_IO_LINK))
        ring.prep_close(4, slot=1)
        assert ring.submit() == 4
        assert _drain(ring, 4) == {1: 0, 2: 8192, 3: 0, 4: 0}
        assert (tmp_path / "g").read_bytes() == bytes(data) and not (tmp_path / "f").exists()

        out = memoryview(bytearray(8192))
        riov = ring.iovec([out])
        keep.append(ring.prep_openat(5, dfd, b"g", os.O_RDONLY))  # a plain descriptor this time
        ring.submit()
        fd = _drain(ring, 1)[5]
        assert fd >= 0
        ring.prep_rw(6, False, fd, riov, 0)
        ring.prep_fsync(7, fd, sqe_flags=0)
        ring.submit()
        assert _drain(ring, 2) == {6: 8192, 7: 0}
        os.close(fd)
        assert bytes(out) == bytes(data)
        os.close(dfd)
    finally:
        ring.close()
        ring.close()  # idempotent


def test_iovec_table_rows_write_and_read_through_the_ring(tmp_path: Path) -> None:
    ring = Ring(entries=8)
    table = IovecTable(2)
    fds = [os.open(tmp_path / f"f{row}", os.O_RDWR | os.O_CREAT, 0o644) for row in range(2)]
    try:
        bufs = [memoryview(bytearray(os.urandom(8192))) for _ in range(2)]
        for row, buf in enumerate(bufs):  # both rows in flight at once, each over its own buffer
            a = buffer_address(buf)
            ring.prep_rw(10 + row, True, fds[row], table.pair(row, a + 4096, 4096, a, 4096), 0)  # halves swapped
        assert ring.submit() == 2
        assert _drain(ring, 2) == {10: 8192, 11: 8192}
        for row, buf in enumerate(bufs):
            assert (tmp_path / f"f{row}").read_bytes() == bytes(buf[4096:]) + bytes(buf[:4096])
        out = memoryview(bytearray(8192))
        a = buffer_address(out)
        ring.prep_rw(12, False, fds[1], table.pair(0, a, 4096, a + 4096, 4096), 0)  # row 0, rewritten
        ring.submit()
        assert _drain(ring, 1) == {12: 8192}
        assert bytes(out) == (tmp_path / "f1").read_bytes()
    finally:
        for fd in fds:
            os.close(fd)
        table.close()
        ring.close()


def test_the_opcode_probe_and_ftruncate_through_a_slot(tmp_path: Path) -> None:
    ring = Ring(entries=8, files=1)
    try:
        assert ring.supports(ioring.OP_WRITEV) and ring.supports(ioring.OP_OPENAT)
        assert not ring.supports(250)  # no such operation
        if not ring.supports(ioring.OP_FTRUNCATE):
            pytest.skip("this kernel's io_uring has no ftruncate (Linux 6.9+)")
        dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        keep = ring.prep_openat(1, dfd, b"f", os.O_WRONLY | os.O_CREAT | os.O_EXCL, slot=0, sqe_flags=IOSQE_IO_LINK)
        ring.prep_ftruncate(2, 0, 1 << 20, sqe_flags=IOSQE_IO_LINK | IOSQE_FIXED_FILE)
        ring.prep_close(3, slot=0)
        assert ring.submit() == 3
        del keep
        assert _drain(ring, 3) == {1: 0, 2: 0, 3: 0}
        st = (tmp_path / "f").stat()
        assert st.st_size == 1 << 20 and st.st_blocks == 0  # sized, nothing allocated
        os.close(dfd)
    finally:
        ring.close()


def test_a_failed_link_cancels_the_rest_but_a_hard_link_runs(tmp_path: Path) -> None:
    ring = Ring(entries=8, files=1)
    try:
        dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        out = memoryview(bytearray(16))
        iov = ring.iovec([out])
        keep = ring.prep_openat(1, dfd, b"missing", os.O_RDONLY, slot=0, sqe_flags=IOSQE_IO_LINK)
        ring.prep_rw(2, False, 0, iov, 0, sqe_flags=IOSQE_IO_LINK | IOSQE_FIXED_FILE)
        ring.prep_close(3, slot=0)
        ring.submit()
        del keep
        assert _drain(ring, 3) == {1: -errno.ENOENT, 2: -errno.ECANCELED, 3: -errno.ECANCELED}

        (tmp_path / "short").write_bytes(b"abc")
        keep = ring.prep_openat(4, dfd, b"short", os.O_RDONLY, slot=0, sqe_flags=IOSQE_IO_LINK)
        ring.prep_rw(5, False, 0, iov, 0, sqe_flags=IOSQE_IO_HARDLINK | IOSQE_FIXED_FILE)
        ring.prep_close(6, slot=0)
        keep2 = ring.prep_unlinkat(7, dfd, b"short")
        ring.submit()
        del keep, keep2
        # a short read breaks a plain link; the hard link still closes the slot
        got = _drain(ring, 4)
        assert got[4] == 0 and got[5] == 3 and got[6] == 0 and got[7] == 0
        assert bytes(out[:3]) == b"abc" and not (tmp_path / "short").exists()
        os.close(dfd)
    finally:
        ring.close()


def test_a_full_submission_queue_is_an_error_not_an_overwrite() -> None:
    ring = Ring(entries=4)
    try:
        for i in range(ring.sq_entries):
            ring.prep_fsync(i, -1)
        with pytest.raises(OSError) as ei:
            ring.prep_fsync(99, -1)
        assert ei.value.errno == errno.EBUSY
        ring.submit()
        assert set(_drain(ring, ring.sq_entries).values()) == {-errno.EBADF}
        ring.prep_fsync(100, -1)  # room again once the kernel took them
    finally:
        ring.close()


@pytest.mark.parametrize("eager", [False, True], ids=["batched", "eager"])
async def test_loop_ring_batches_chains_into_few_submits_or_submits_each_at_once(tmp_path: Path, eager: bool) -> None:
    lr = LoopRing(entries=64, files=4, eager_submit=eager)
    calls = 0
    submit = lr.ring.submit

    def counting() -> int:
        nonlocal calls
        calls += 1
        return submit()

    lr.ring.submit = counting  # type: ignore[method-assign]
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:

        async def one(i: int) -> list[int]:
            slot = lr.take_slot()
            data = memoryview(bytearray(b"%04d" % i * 1024))
            iov = lr.ring.iovec([data])
            name = b"c%d" % i

            def prep(ring: Ring, ud: int) -> object:
                k = ring.prep_openat(ud, dfd, name, os.O_WRONLY | os.O_CREAT, slot=slot, sqe_flags=IOSQE_IO_LINK)
                ring.prep_rw(ud + 1, True, slot, iov, 0, sqe_flags=IOSQE_IO_HARDLINK | IOSQE_FIXED_FILE)
                ring.prep_close(ud + 2, slot=slot)
                return k

            try:
                return await lr.run(3, prep, keep=(iov, data))
            finally:
                lr.put_slot(slot)

        first = asyncio.ensure_future(one(9))
        await asyncio.sleep(0)  # the task has prepared its chain; a batched flush is still due
        assert lr.ring.unsubmitted == (0 if eager else 3)
        assert await first == [0, 4096, 0]
        calls = 0
        res = await asyncio.gather(*(one(i) for i in range(4)))
        assert res == [[0, 4096, 0]] * 4
        if eager:
            assert calls == 4, "each chain goes to the kernel as it is prepared"
        else:
            assert calls == 1, "four chains prepared in one loop iteration go in one io_uring_enter"
        assert all((tmp_path / f"c{i}").read_bytes() == b"%04d" % i * 1024 for i in range(4))
        with pytest.raises(ValueError):
            await lr.run(17, lambda ring, ud: None)
    finally:
        await lr.aclose()
        os.close(dfd)
    with pytest.raises(OSError):
        await lr.run(1, lambda ring, ud: ring.prep_fsync(ud, -1))


async def test_a_cancelled_waiter_waits_for_its_chain_before_raising() -> None:
    """The kernel may still write into the buffer: cancellation must not hand it back early."""
    lr = LoopRing(entries=8)
    r, w = os.pipe()
    try:
        buf = memoryview(bytearray(5))
        iov = lr.ring.iovec([buf])
        task = asyncio.ensure_future(lr.run(1, lambda ring, ud: ring.prep_rw(ud, False, r, iov, 0), keep=iov))
        await asyncio.sleep(0.05)
        assert lr.in_flight == 1
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done(), "returned while the read was still in flight"
        os.write(w, b"hello")
        with pytest.raises(asyncio.CancelledError):
            await task
        assert bytes(buf) == b"hello" and lr.in_flight == 0

        # aclose() waits for a chain in flight, too
        task2 = asyncio.ensure_future(lr.run(1, lambda ring, ud: ring.prep_rw(ud, False, r, iov, 0), keep=iov))
        await asyncio.sleep(0.05)
        closing = asyncio.ensure_future(lr.aclose())
        await asyncio.sleep(0.05)
        assert not closing.done()
        os.write(w, b"world")
        await closing
        assert await task2 == [5] and bytes(buf) == b"world"
    finally:
        await lr.aclose()
        os.close(r)
        os.close(w)


def test_problem_names_the_reason_on_unsupported_machines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ioring.platform, "machine", lambda: "riscv64")
    ioring.problem.cache_clear()
    try:
        why = ioring.problem()
        assert why is not None and "x86-64" in why and "riscv64" in why
    finally:
        ioring.problem.cache_clear()


async def test_loop_ring_caps_its_kernel_workers() -> None:
    lr = LoopRing(entries=64, files=40)
    try:
        bounded, _ = lr.ring.set_max_workers(0, 0)  # 0: read the limits without changing them
        assert bounded == (os.cpu_count() or 1), "one kernel worker per CPU by default"
    finally:
        await lr.aclose()
    lr = LoopRing(entries=8, kernel_workers=3)
    try:
        assert lr.ring.set_max_workers(0, 0)[0] == 3
    finally:
        await lr.aclose()


async def test_skip_on_success_entries_report_only_failures_and_a_failure_ends_the_chain(tmp_path: Path) -> None:
    lr = LoopRing(entries=16, files=1)
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    (tmp_path / "there").write_bytes(b"x" * 100)
    out = memoryview(bytearray(100))
    iov = lr.ring.iovec([out])
    skip = ioring.IOSQE_CQE_SKIP_SUCCESS
    try:

        def chain(name: bytes) -> object:
            def prep(ring: Ring, ud: int) -> object:
                k = ring.prep_openat(ud, dfd, name, os.O_RDONLY, slot=0, sqe_flags=IOSQE_IO_LINK | skip)
                ring.prep_rw(ud + 1, False, 0, iov, 0, sqe_flags=IOSQE_IO_HARDLINK | IOSQE_FIXED_FILE)
                ring.prep_close(ud + 2, slot=0)
                return k

            return prep

        ok = await asyncio.wait_for(lr.run(3, chain(b"there"), keep=iov, ends_on_report=(0,)), 10)
        assert ok == ([None, 100, 0] if lr.ring.cqe_skip else [0, 100, 0])
        # the failed open cancels the rest of the chain without reports: it must still end
        bad = await asyncio.wait_for(lr.run(3, chain(b"missing"), keep=iov, ends_on_report=(0,)), 10)
        assert bad == [-errno.ENOENT, -errno.ECANCELED, -errno.ECANCELED]
    finally:
        await lr.aclose()
        os.close(dfd)


@pytest.mark.parametrize("eager", [False, True], ids=["batched", "eager"])
async def test_completions_beyond_the_completion_queue_are_not_lost(eager: bool) -> None:
    """More completions than the completion queue holds before the loop reaps: the kernel keeps
    the rest on its overflow list and posts them only when asked; a ring that does not ask hangs."""
    lr = LoopRing(entries=4, eager_submit=eager)  # completion queue: 8 entries
    try:
        assert lr.ring.cq_entries == 8
        # prepared in one loop iteration: submitted in groups of 4 (the submission queue),
        # each completing at once (fsync of a bad descriptor), with no reap in between
        tasks = [asyncio.ensure_future(lr.run(1, lambda ring, ud: ring.prep_fsync(ud, -1))) for _ in range(40)]
        _, pending = await asyncio.wait(tasks, timeout=10)
        for _ in range(40):  # fetch them by hand, so that the test fails instead of hanging in teardown
            if all(t.done() for t in tasks):
                break
            lr.ring.wait(0)
            lr._on_ready()
            await asyncio.sleep(0.01)
        assert not pending, f"{len(pending)} of 40 chains never completed"
        assert [t.result() for t in tasks] == [[-errno.EBADF]] * 40
        assert lr.ring.overflow_flushes >= 1
    finally:
        await lr.aclose()


def test_a_short_write_reports_and_ends_its_chain_even_when_skipped(tmp_path: Path) -> None:
    """What the fs tier's chain relies on: a write that moves fewer bytes than asked counts
    as failed, posts its completion despite skip-on-success, and cancels what follows (so a
    truncated file is never renamed into place). Made short by ext4's largest file size."""
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    ring = Ring(entries=8)
    try:
        try:
            probe = os.pwrite(fd, bytes(8192), (1 << 44) - 8192)
        except OSError:
            probe = -1
        if probe != 4096:
            pytest.skip("no ext4-like file size limit here to cut a write short")
        iov = ring.iovec([memoryview(bytearray(8192))])
        ring.prep_rw(1, True, fd, iov, (1 << 44) - 8192, sqe_flags=IOSQE_IO_LINK | ioring.IOSQE_CQE_SKIP_SUCCESS)
        ring.prep_fsync(2, fd)  # linked to the write
        ring.prep_fsync(3, fd)  # independent
        assert ring.submit() == 3
        got: dict[int, int] = {}
        while not {1, 3} <= got.keys():
            ring.wait(1)
            got.update({ud: res for ud, res, _ in ring.reap()})
        assert got[1] == 4096 and got[3] == 0
        assert got.get(2, -errno.ECANCELED) == -errno.ECANCELED  # the linked fsync never ran
    finally:
        ring.close()
        os.close(fd)


def test_the_skip_flag_is_refused_on_operations_that_would_fail_unseen(tmp_path: Path) -> None:
    """unlinkat, renameat, linkat and ftruncate: a failure breaks no link on Linux 6.18 and,
    flagged skip-on-success, posts nothing, so a chain would go on as if it succeeded."""
    ring = Ring(entries=8, files=1)
    try:
        skip = IOSQE_IO_LINK | ioring.IOSQE_CQE_SKIP_SUCCESS
        with pytest.raises(ValueError, match="fail unseen"):
            ring.prep_renameat(1, -1, b"a", -1, b"b", sqe_flags=skip)
        with pytest.raises(ValueError, match="fail unseen"):
            ring.prep_unlinkat(1, -1, b"a", sqe_flags=skip)
        with pytest.raises(ValueError, match="fail unseen"):
            ring.prep_ftruncate(1, 0, 4096, sqe_flags=skip | IOSQE_FIXED_FILE)
        assert ring.unsubmitted == 0  # nothing was queued
        ring.prep_fsync(1, -1, sqe_flags=skip)  # not refused (a bad descriptor does end its chain)
        assert ring.unsubmitted == 1
    finally:
        ring.close()


def test_entries_without_the_skip_flag_report_their_failures(tmp_path: Path) -> None:
    """What the fs tier relies on for unlinkat, renameat and fsync: their failures are seen
    whether or not the kernel goes on with the rest of the chain (Linux 6.18 goes on after a
    failed unlinkat, renameat or ftruncate on a plain link, and posts nothing for one flagged
    skip-on-success, so the tier never flags them so)."""
    ring = Ring(entries=8, files=1)
    dfd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ring.prep_unlinkat(1, dfd, b"missing", sqe_flags=IOSQE_IO_HARDLINK)
        ring.prep_fsync(2, -1)
        ring.submit()
        got = _drain(ring, 2)
        assert got == {1: -errno.ENOENT, 2: -errno.EBADF}
        keep = ring.prep_renameat(3, dfd, b"missing", dfd, b"other", sqe_flags=IOSQE_IO_LINK)
        ring.prep_fsync(4, dfd)
        ring.submit()
        del keep
        got = _drain(ring, 2)
        assert got[3] == -errno.ENOENT and got[4] in (0, -errno.ECANCELED)  # went on, or cancelled
    finally:
        ring.close()
        os.close(dfd)


async def test_a_chain_is_never_half_queued_when_the_kernel_pushes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel takes no entries for a while (EAGAIN/EBUSY, simulated) and the queue is too
    full for a chain: run() waits for room rather than queueing part of it, and a chain whose
    preparation fails part-way is taken back. Before, a half-queued chain reached the kernel
    after run() had raised: a read into the caller's buffer after the call was over."""
    path = tmp_path / "data.bin"
    path.write_bytes(b"FROMDISK")
    fd = os.open(path, os.O_RDONLY)
    lring = LoopRing(entries=4, kernel_workers=0)
    ring = lring.ring
    real_submit = ring.submit
    refusals = [20]

    def pushes_back() -> int:
        if refusals[0]:
            refusals[0] -= 1
            return 0
        return real_submit()

    monkeypatch.setattr(ring, "submit", pushes_back)
    buf = bytearray(b"........")
    iov = ring.iovec([memoryview(buf)])

    def nop(r: Ring, ud: int) -> None:
        r._push(ioring.OP_NOP, 0, 0, 0, 0, 0, 0, ud)

    def read_then_nops(r: Ring, ud: int) -> None:
        r.prep_rw(ud, False, fd, iov, 0, sqe_flags=IOSQE_IO_LINK)
        for i in range(1, 4):
            r._push(ioring.OP_NOP, IOSQE_IO_LINK if i < 3 else 0, 0, 0, 0, 0, 0, ud + i)

    try:
        first = asyncio.ensure_future(lring.run(1, nop))
        await asyncio.sleep(0)
        assert await lring.run(4, read_then_nops, keep=iov) == [8, 0, 0, 0]  # waited for room
        assert bytes(buf) == b"FROMDISK"
        await first

        buf[:] = b"........"

        def fails_half_way(r: Ring, ud: int) -> None:
            r.prep_rw(ud, False, fd, iov, 0, sqe_flags=IOSQE_IO_LINK)
            raise RuntimeError("preparation failed")

        with pytest.raises(RuntimeError, match="preparation failed"):
            await lring.run(2, fails_half_way)
        await lring.run(1, nop)  # a flush after it: the read taken back never runs
        await asyncio.sleep(0.05)
        assert bytes(buf) == b"........" and lring.in_flight == 0
    finally:
        await lring.aclose()
        os.close(fd)


async def test_a_chain_that_is_not_one_closed_link_is_refused_and_taken_back(tmp_path: Path) -> None:
    """A chain whose last entry is still linked would join the next caller's chain in the
    same submit, and a failure of its own would cancel that one with no completion: its
    waiter hung for good (an fs store through a file made ahead did this). Such a chain, or
    one of a different length than declared, is refused and nothing of it is queued."""
    path = tmp_path / "data.bin"
    path.write_bytes(b"FROMDISK")
    fd = os.open(path, os.O_RDONLY)
    lring = LoopRing(entries=8, kernel_workers=0)
    buf = bytearray(b"........")
    iov = lring.ring.iovec([memoryview(buf)])

    def dangling(r: Ring, ud: int) -> None:
        r.prep_rw(ud, False, fd, iov, 0, sqe_flags=IOSQE_IO_LINK)
        r._push(ioring.OP_NOP, IOSQE_IO_HARDLINK, 0, 0, 0, 0, 0, ud + 1)  # links to nothing of its own

    def one_short(r: Ring, ud: int) -> None:
        r.prep_rw(ud, False, fd, iov, 0)

    def nop(r: Ring, ud: int) -> None:
        r._push(ioring.OP_NOP, 0, 0, 0, 0, 0, 0, ud)

    try:
        with pytest.raises(ValueError, match="last"):
            await lring.run(2, dangling, keep=iov)
        with pytest.raises(ValueError, match="2 entries"):
            await lring.run(2, one_short, keep=iov)
        assert await lring.run(1, nop) == [0]  # the next chain runs alone: nothing was queued
        await asyncio.sleep(0.05)
        assert bytes(buf) == b"........" and lring.in_flight == 0
    finally:
        await lring.aclose()
        os.close(fd)


def test_a_ring_that_cannot_be_mapped_is_unavailable_and_leaks_nothing() -> None:
    """The ring's memory refused (RLIMIT_AS, in a child process): RingUnavailable, so tiers
    fall back to threads, and no descriptor is left. close() used to run before the fields
    it reads existed: an AttributeError hid the reason and leaked the ring's descriptor."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import os, resource
        from asynctier import ioring

        def ring_fds():
            n = 0
            for f in os.listdir("/proc/self/fd"):
                try:
                    n += os.readlink(f"/proc/self/fd/{f}") == "anon_inode:[io_uring]"
                except OSError:
                    pass
            return n

        before = ring_fds()
        vm = int([l for l in open("/proc/self/status") if l.startswith("VmSize")][0].split()[1]) * 1024
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (vm + 4096, hard))
        try:
            ioring.Ring(entries=4096)
            what = "no error"
        except Exception as e:
            what = type(e).__name__
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        print(what, ring_fds() - before)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["RingUnavailable", "0"]
