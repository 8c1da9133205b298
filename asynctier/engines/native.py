"""Native I/O workers: C threads that run whole chunk jobs, driven from the event loop.

Why: the per-chunk Python around each system call (a job queue, a thread wake-up and a GIL
hand-off per call) is what kept loads short of fio from Python threads (docs/benchmarks.md).
:class:`NativePool` is a pool of POSIX threads (``asynctier/engines/_nativeio.c``, built at install
as an optional extension and loaded with ctypes) that take chunk jobs from their own
priority queue and run each from ``open`` to ``close``, with the xxh3 of the payload, never
taking the GIL. A job is one :class:`Job` descriptor passed by pointer, or many packed in
one table (:meth:`NativePool.submit_many`). The event loop queues jobs ahead of the workers
and hears of their ends through an eventfd, in batches (a group's last end, or a queue
running low), so no Python runs between one job and the next on a worker.
:class:`~asynctier.engines.native_engine.NativeEngine` is the runtime's engine around it.

The workers hash with ``XXH3_64bits`` of the system's xxHash library (``libxxhash.so.0``;
Debian and Ubuntu: package ``libxxhash0``), its public C API, checked at load against the
:mod:`xxhash` module the rest of asynctier hashes with.

The bound: the pool hands out ``bound`` I/O tokens; a worker holds one for each job, and a
tier's slow paths that do chunk I/O on Python threads hold one too (:meth:`NativePool.hold`),
so ``max_inflight`` holds across both. :func:`problem` says why the pool cannot be used
here (not built, not Linux, no xxHash library), or None.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import anyio

from ..core.backend import ReadableWatch, in_this_process, run_on_thread_to_end, wait_uninterrupted, watch_readable
from .descriptors import (  # re-exported: the pool's callers name them nativeio.X
    COMMIT,
    COMMIT_FDS_MAX,
    GROUP,
    GROUP_MAX,
    JOB_LAYOUT,
    MODE_CLOSE,
    MODE_FIX,
    READ,
    READV,
    READV_MAX,
    RECYCLE,
    RESULT_LAYOUT,
    SPARE,
    ST_DATASYNC,
    ST_DIRSYNC,
    ST_IO,
    ST_LINK,
    ST_OPEN,
    ST_RENAME,
    ST_UNLINK,
    ST_WITHDRAWN,
    UNLINK,
    WRITE,
    WRITEV,
    Job,
    JobFields,
    Outcome,
    Result,
    fields,
    job,
)
from .native_lib import XXHASH_LIBS, find_library, find_xxh3

__all__ = [
    "COMMIT",
    "COMMIT_FDS_MAX",
    "GROUP",
    "GROUP_MAX",
    "JOB_LAYOUT",
    "MODE_CLOSE",
    "MODE_FIX",
    "READ",
    "READV",
    "READV_MAX",
    "RECYCLE",
    "RESULT_LAYOUT",
    "SPARE",
    "ST_DATASYNC",
    "ST_DIRSYNC",
    "ST_IO",
    "ST_LINK",
    "ST_OPEN",
    "ST_RENAME",
    "ST_UNLINK",
    "ST_WITHDRAWN",
    "UNLINK",
    "WRITE",
    "WRITEV",
    "XXHASH_LIBS",
    "DoneHandler",
    "Job",
    "JobFields",
    "NativePool",
    "Outcome",
    "fields",
    "find_xxh3",
    "job",
    "problem",
    "xxh3_address",
]

T = TypeVar("T")

#: Called on the loop thread for each job of :meth:`NativePool.submit_many` that ended:
#: ``(owner, slot, result, csum, stage, info)`` (the fields of :class:`Outcome`).
DoneHandler = Callable[[Any, int, int, int, int, int], None]


_LIB: Any
_GIL_LIB: Any  # the calls of the loop's side, which keep the GIL
_LIB, _GIL_LIB, _PROBLEM = find_library()
_XXH3: int | None = None
if _LIB is not None:
    _XXH3, _PROBLEM = find_xxh3()


def xxh3_address() -> int | None:
    """The address of the checked ``XXH3_64bits`` the workers hash with (None where the
    library is not loaded): for other C code that must hash as they do."""
    return _XXH3


def problem() -> str | None:
    """Why native workers cannot be used here, or None when they can."""
    return _PROBLEM


class NativePool:
    """``threads`` C workers sharing ``bound`` I/O tokens, with ``slots`` job slots; each
    worker raises its nice value by ``nice`` (>= 0) as it starts, so that where there are
    fewer cores than workers the event-loop thread wins the CPU when it wakes.

    Use it from one event loop (asyncio, uvloop or trio): :meth:`attach` it, take a slot
    (:meth:`take_slot`), await :meth:`run` of a :class:`Job` in it, give it back
    (:meth:`put_slot`) once done with the buffers it names. Buffers (header block and
    payload) must stay valid until the job ends: a cancelled wait takes a queued job back,
    or waits for a running one to end.
    """

    def __init__(self, threads: int, bound: int, slots: int, nice: int = 0) -> None:
        if _LIB is None:
            raise OSError(errno.ENOSYS, _PROBLEM)
        self._lib = _LIB
        self._glib = _GIL_LIB  # the calls of the loop's side, which never wait for the workers
        handle = _LIB.at_new(threads, bound, slots, _XXH3, nice)  # EINVAL without xxh3
        if not handle:
            e = ctypes.get_errno() or errno.ENOMEM
            raise OSError(e, f"cannot start native I/O workers: {os.strerror(e)}")
        self._h: int = handle
        self.slots = slots
        self._res = (Result * slots).from_address(_LIB.at_results(handle))
        self._efd: int = _LIB.at_eventfd(handle)
        self._reaped = (ctypes.c_int32 * slots)()
        self._counts = (ctypes.c_int32 * 4)()
        self._waiters: list[anyio.Event | None] = [None] * slots
        self._outcomes: list[Outcome | None] = [None] * slots
        self._free = list(range(slots - 1, -1, -1))
        #: the free job slots (:meth:`take_slot` pops, :meth:`put_slot` appends)
        self.free_slots = self._free
        # submit_many's side: a table of descriptors packed in place, and who owns each slot
        self._table = bytearray(JOB_LAYOUT.size * slots)
        self._table_c = (ctypes.c_char * len(self._table)).from_buffer(self._table)  # pins it
        self._table_addr = ctypes.addressof(self._table_c)
        self._table_idx = (ctypes.c_int32 * slots)()
        self._idx_addr = ctypes.addressof(self._table_idx)
        self._owners: list[Any] = [None] * slots
        self._res_mem = memoryview(
            (ctypes.c_char * (ctypes.sizeof(Result) * slots)).from_address(_LIB.at_results(handle))
        ).cast("B")
        # group(): each slot's sub-jobs packed here (the workers copy them at submission), and
        # their outcomes where the workers put them
        self._sub_table = bytearray(JOB_LAYOUT.size * GROUP_MAX * slots)
        self._sub_table_c = (ctypes.c_char * len(self._sub_table)).from_buffer(self._sub_table)  # pins it
        self._sub_table_addr = ctypes.addressof(self._sub_table_c)
        # the GROUP descriptors made so far, by (slot, priority, jobs): one per job otherwise
        self._packed: dict[tuple[int, int, int], JobFields] = {}
        self._sub_res = memoryview(
            (ctypes.c_char * (RESULT_LAYOUT.size * GROUP_MAX * slots)).from_address(_LIB.at_group_results(handle))
        ).cast("B")
        #: the engine's handlers: each job of submit_many that ended; then, once per batch reaped
        self.on_done: DoneHandler | None = None
        self.on_reaped: Callable[[], None] | None = None
        self._watch: ReadableWatch | None = None
        self._running = 0  # jobs submitted and not yet reaped
        self._all_reaped: anyio.Event | None = None  # aclose() waits on it while jobs run
        self._closed = False
        self._abandoned = False
        # threads inside hold() (they touch the pool's memory outside any job): the pool is
        # freed only once none is left; a free asked for meanwhile is left to the last one
        self._hold_mu = threading.Lock()
        self._holders = 0
        self._free_pending = False
        # dropped without close(): the workers end once idle; the pool's memory and eventfd
        # stay (a worker may still write to the eventfd: its number must not be reused)
        self._finalizer = weakref.finalize(self, in_this_process(_LIB.at_shutdown), handle)

    # -- the event-loop side ----------------------------------------------------------------
    def attach(self) -> None:
        """Serve completions on the running event loop (call once, from it)."""
        self._watch = watch_readable(self._efd, self._on_ready, lambda: self._running > 0)

    def take_slot(self) -> int:
        """A free job slot (the caller's bound keeps one available)."""
        if not self._free:
            raise OSError(errno.EBUSY, "no free native I/O slot")
        return self._free.pop()

    def put_slot(self, slot: int) -> None:
        """Give a slot back once its job is over and its buffers are no longer needed."""
        self._free.append(slot)

    def hash(self, data: memoryview | bytes) -> int:
        """The workers' xxh3-64 of ``data`` (for checks: it must equal :mod:`xxhash`'s)."""
        buf = (ctypes.c_char * len(data)).from_buffer_copy(data)
        return int(self._lib.at_hash(self._h, buf, len(data)))

    async def run(self, slot: int, job: Job, *, on_cancelled: Callable[[Outcome], object] | None = None) -> Outcome:
        """Run ``job`` in ``slot`` (taken with :meth:`take_slot`); its outcome.

        A cancelled wait takes a queued job back, or waits for a running one to end; in that
        case ``on_cancelled`` receives what the job did (for example a spare's open
        descriptor, the caller's to undo) before the cancellation goes on."""
        if self._closed or self._watch is None:
            raise RuntimeError("native I/O pool is not running")
        done = anyio.Event()
        rc = self._glib.at_submit(self._h, slot, ctypes.byref(job))
        if rc < 0:
            raise OSError(-rc, f"native I/O submit refused: {os.strerror(-rc)}")
        self._waiters[slot] = done
        self._running += 1
        try:
            await done.wait()
        except BaseException:  # cancelled (or a KeyboardInterrupt raised into this task)
            if self._lib.at_cancel(self._h, slot):  # taken back: never ran, never reported
                self._waiters[slot] = None
                self._running -= 1
            else:
                await wait_uninterrupted(done)  # it runs on the caller's buffers: to its end
                outcome = self._outcomes[slot]
                if on_cancelled is not None and outcome is not None:
                    on_cancelled(outcome)
            raise
        outcome = self._outcomes[slot]
        assert outcome is not None
        return outcome

    def submit_many(self, items: list[tuple[int, int, Any, JobFields]]) -> list[tuple[int, Any, int]]:
        """Queue jobs given as ``(slot, group, owner, fields)`` in one call to the workers;
        each that ends goes to :attr:`on_done` with its ``owner``. ``group``: -1, or a
        number below :attr:`slots` shared by jobs whose last end is to wake the loop (and
        only it). Returns ``(slot, owner, errno)`` of those refused (the pool is shutting
        down): they never run."""
        if self._closed or self._watch is None:
            raise RuntimeError("native I/O pool is not running")
        table, idx, owners = self._table, self._table_idx, self._owners
        pack, size = JOB_LAYOUT.pack_into, JOB_LAYOUT.size
        off = 0
        for i, (slot, group, owner, f) in enumerate(items):
            pack(table, off, group, 0, *f)
            off += size
            idx[i] = slot
            owners[slot] = owner
        refused: list[tuple[int, Any, int]] = []
        n, start = len(items), 0
        while start < n:
            k = self._glib.at_submit_many(
                self._h, n - start, self._idx_addr + 4 * start, self._table_addr + size * start
            )
            if k > 0:
                self._running += k
                start += k
                continue
            slot = items[start][0]
            refused.append((slot, owners[slot], -k))
            owners[slot] = None
            start += 1
        return refused

    def take_back(self, which: Callable[[int, Any], bool]) -> tuple[list[tuple[int, Any]], int]:
        """Take back what no worker has begun of the jobs of :meth:`submit_many` whose
        ``which(slot, owner)`` is true: a job whose I/O has not begun, whole (it never runs nor
        ends: :attr:`on_done` is not called; its slot, and a file it was handed, stay the
        caller's; what a worker's preparation made is undone); of a :data:`GROUP` job
        begun, its jobs after the last begun (each then ends with stage
        :data:`ST_WITHDRAWN`, having done no I/O; the group ends as usual). Returns the
        ``(slot, owner)`` of those taken whole, and how many groups were cut. Rare (a
        cancelled call): each slot in use is asked under the workers' lock."""
        taken: list[tuple[int, Any]] = []
        cut = 0
        owners = self._owners
        for slot, owner in enumerate(owners):
            if owner is None or not which(slot, owner):
                continue
            rc = self._lib.at_withdraw(self._h, slot)
            if rc == 1:
                owners[slot] = None
                self._running -= 1
                taken.append((slot, owner))
            elif rc:
                cut += 1
        return taken, cut

    def reap_now(self) -> None:
        """Reap the jobs ended so far, as a wake-up by the workers does (after :meth:`take_back`:
        the jobs taken back may have been the last of a group whose others ended without a
        wake-up, waiting for them)."""
        if self._watch is not None and not self._closed:
            self._on_ready()

    def group(self, slot: int, prio: int, subs: list[JobFields]) -> JobFields:
        """The descriptor of one :data:`GROUP` job in ``slot``: the jobs ``subs`` (1 to
        :data:`GROUP_MAX` reads, or writes, each as if alone; the workers refuse other kinds and
        mixes) spread over the workers, each prepared (a write's checksums) and run by
        whichever is free under a token of its own, reported once when the last ends; their
        outcomes: :meth:`group_outcomes`."""
        n = len(subs)
        if not 0 < n <= GROUP_MAX:
            raise ValueError(f"a group job holds 1 to {GROUP_MAX} jobs; got {n}")
        table, pack, size = self._sub_table, JOB_LAYOUT.pack_into, JOB_LAYOUT.size
        base = size * GROUP_MAX * slot
        for i, f in enumerate(subs):
            pack(table, base + i * size, -1, 0, *f)
        return self.packed_group(slot, prio, n)

    def sub_jobs(self, slot: int) -> tuple[bytearray, int]:
        """Where the jobs of a :data:`GROUP` job in ``slot`` are packed: (table, offset), room
        for :data:`GROUP_MAX` descriptors laid out as :class:`Job` (what :meth:`group` fills)."""
        return self._sub_table, JOB_LAYOUT.size * GROUP_MAX * slot

    def packed_group(self, slot: int, prio: int, n: int) -> JobFields:
        """The descriptor of one :data:`GROUP` job in ``slot`` of the ``n`` jobs (1 to
        :data:`GROUP_MAX`) the caller packed at :meth:`sub_jobs` (as :meth:`group` does)."""
        fields = self._packed.get((slot, prio, n))
        if fields is None:
            if not (type(slot) is int and type(prio) is int and type(n) is int):
                raise TypeError(f"packed_group() takes ints; got {slot!r}, {prio!r}, {n!r}")
            if not 0 < n <= GROUP_MAX:
                raise ValueError(f"a group job holds 1 to {GROUP_MAX} jobs; got {n}")
            if not 0 <= slot < self.slots:
                raise ValueError(f"slot {slot} is not one of the pool's {self.slots}")
            addr = self._sub_table_addr + JOB_LAYOUT.size * GROUP_MAX * slot
            fields = (GROUP, prio, -1, 0, -1, -1, 0, 0, 0, 0, addr, n, 0, n, 0, b"", b"", b"")
            self._packed[slot, prio, n] = fields
        return fields

    def sub_outcomes(self, slot: int) -> tuple[memoryview, int]:
        """Where the outcomes of the jobs of the :data:`GROUP` job that ended in ``slot`` are:
        (memory, offset), :data:`GROUP_MAX` results laid out as ``(result, csum, stage, info)``
        (what :meth:`group_outcomes` reads; valid until the slot runs another job)."""
        return self._sub_res, RESULT_LAYOUT.size * GROUP_MAX * slot

    def one_or_group(self, slot: int, prio: int, subs: list[JobFields]) -> JobFields:
        """The job ``subs[0]`` if it is alone, else the :meth:`group` of ``subs`` in ``slot``
        (read its ends with :meth:`group_outcomes`, passing ``len(subs)``)."""
        return subs[0] if len(subs) == 1 else self.group(slot, prio, subs)

    def group_outcomes(
        self, slot: int, n: int, own: tuple[int, int, int, int] | None = None
    ) -> list[tuple[int, int, int, int]]:
        """``(result, csum, stage, info)`` of each of the ``n`` jobs of the :data:`GROUP` job
        that ended in ``slot`` (valid until the slot runs another). ``own``, the group's own
        outcome: a group that never ran (refused: its stage set) gives it for each job; and
        ``n`` 1 is a job submitted alone (:meth:`one_or_group`), whose outcome is ``own``."""
        if own is not None and (own[2] or n == 1):
            return [own] * n
        unpack, size = RESULT_LAYOUT.unpack_from, RESULT_LAYOUT.size
        base = size * GROUP_MAX * slot
        mem = self._sub_res
        return [unpack(mem, base + i * size) for i in range(n)]

    def forget(self, slot: int) -> None:
        """Drop what a failed :meth:`submit_many` left in ``slot`` (its job never reached the workers)."""
        self._owners[slot] = None

    def set_low_water(self, n: int) -> None:
        """Have the workers also wake the loop when no more than ``n`` jobs wait for an I/O
        token (-1: not for that): the loop holds more jobs back and tops the queue up."""
        self._glib.at_set_low_water(self._h, n)

    def _on_ready(self) -> None:
        lib, h, reaped, res, waiters = self._glib, self._h, self._reaped, self._res, self._waiters
        lib.at_clear(h)  # (os.read would give the GIL up)
        owners, on_done, res_mem, unpack = self._owners, self.on_done, self._res_mem, RESULT_LAYOUT.unpack_from
        while True:
            n = lib.at_reap(h, reaped, self.slots)
            self._running -= n
            for slot in reaped[:n]:
                owner = owners[slot]
                if owner is not None:
                    owners[slot] = None
                    assert on_done is not None
                    on_done(owner, slot, *unpack(res_mem, slot * 24))
                    continue
                r = res[slot]
                done = waiters[slot]
                waiters[slot] = None
                if done is not None:
                    self._outcomes[slot] = Outcome(r.result, r.csum, r.stage, r.info)
                    done.set()
            if n < self.slots:
                break
        if self.on_reaped is not None:
            self.on_reaped()
        if not self._running and self._all_reaped is not None:
            self._all_reaped.set()
        if self._abandoned and not self._running:
            self._free_now()

    # -- threads ------------------------------------------------------------------------------
    def hold(self, fn: Callable[..., T], *args: Any, prio: int = 0) -> T:
        """``fn(*args)`` (a blocking slow path doing chunk I/O) holding one of the pool's
        I/O tokens, so that it counts against the bound (call from a worker thread).

        ``prio``: the job's priority (``asynctier.core.ops.PRIO_*``). The token goes to it
        ahead of queued jobs of the same or a lower priority, after those of a higher one:
        0 (a slow path continuing a job already started) goes ahead of every queued job;
        a store's (:data:`~asynctier.core.ops.PRIO_STORE`) lets queued loads go first.
        Refused (RuntimeError) once the pool is shut down or being torn down: the pool is
        freed only after the last thread inside this call has left it."""
        gil = _GIL_LIB
        assert gil is not None
        with self._hold_mu:
            if self._closed or self._free_pending:
                raise RuntimeError("native I/O pool is shut down")
            self._holders += 1
        try:
            rc = gil.at_try_acquire(self._h, prio)
            if rc == -errno.EAGAIN:
                rc = self._lib.at_acquire(self._h, prio)  # waits, without the GIL
            if rc == -errno.EINVAL:
                raise ValueError(f"prio must be 0..3; got {prio!r}")
            if rc != 0:
                raise RuntimeError("native I/O pool is shut down")
            try:
                return fn(*args)
            finally:
                if gil.at_try_release(self._h) == -errno.EAGAIN:
                    self._lib.at_release(self._h)  # a worker holds the lock: wait without the GIL
        finally:
            with self._hold_mu:
                self._holders -= 1
                free = self._free_pending and not self._holders
            if free:  # the pool's teardown waited for this thread
                watch = self._watch
                if watch is not None:
                    watch.call_soon(self._free_now)  # closing the watch is the loop's business
                else:
                    self._free_now()

    # -- counters and teardown ----------------------------------------------------------------
    def holds_waiting(self) -> int:
        """Threads waiting in :meth:`hold` for a token now."""
        if self._closed:
            return 0
        self._lib.at_counts(self._h, self._counts)
        return self._counts[3]

    def counts(self) -> tuple[int, int, int]:
        """(I/O in flight, peak in flight, jobs queued) as the workers see them."""
        if self._closed:
            return 0, self._counts[1], 0
        self._lib.at_counts(self._h, self._counts)
        return self._counts[0], self._counts[1], self._counts[2]

    def abandon(self) -> None:
        """Tear the pool down without waiting, from any thread: for the finalizer of an owner
        dropped without :meth:`aclose`. No new jobs; once those submitted have ended, the
        workers are joined and the eventfd closed on the loop's thread, or here once that
        loop is gone (else the eventfd and the workers' stacks were left behind)."""
        if self._closed:
            return
        self._lib.at_shutdown(self._h)
        watch = self._watch
        if watch is None:  # never served: nothing reaps
            if not self._running:
                self._free_now()
            return
        if watch.gone():  # nothing reaps there any more: the workers end what they hold, then are joined
            self._watch = None
            watch.forget()
            self._abandoned = True
            self._free_now()
            return
        watch.call_soon(self._abandon_on_loop)

    def _abandon_on_loop(self) -> None:
        self._abandoned = True
        if not self._running:
            self._free_now()

    def _free_now(self) -> None:
        """Free the pool; its workers are idle or ending (nothing queued or running), so
        joining them does not wait for I/O. With a thread still inside :meth:`hold`, the
        last one to leave calls this again."""
        with self._hold_mu:
            if self._closed:
                return
            if self._holders:
                self._free_pending = True
                return
            self._closed = True
        if self._watch is not None:
            self._watch.close()
        self._finalizer.detach()
        self._lib.at_free(self._h)

    async def aclose_orphaned(self) -> None:
        """:meth:`aclose` once the loop the pool served is gone: its ends are reaped no more,
        so none is waited for; the workers finish the jobs they were given and are joined on
        a thread, from the loop that calls this."""
        if self._closed:
            return
        watch, self._watch = self._watch, None  # (a slow path leaving hold() frees the pool at once)
        with self._hold_mu:
            if self._closed:
                return
            if self._holders:  # a slow-path thread still holds a token: the last one out frees the pool
                self._free_pending = True
                self._lib.at_shutdown(self._h)
                return
            self._closed = True
        if watch is not None:
            watch.forget()
        self._finalizer.detach()
        await run_on_thread_to_end(self._lib.at_free, self._h)

    async def aclose(self) -> None:
        """Wait for the jobs submitted, stop the workers and free the pool (idempotent)."""
        if self._closed:
            return
        while self._running:  # run()'s and submit_many()'s, each reaped (on_done called) first
            if self._all_reaped is None or self._all_reaped.is_set():
                self._all_reaped = anyio.Event()
            await wait_uninterrupted(self._all_reaped)
        with self._hold_mu:
            if self._closed:  # abandoned, and freed once the last job ended
                return
            if self._holders:  # a slow path still holds a token (the engine waits for its
                # jobs first: only a caller of hold() outside them gets here); it frees the pool
                self._free_pending = True
                return
            self._closed = True
        if self._watch is not None:
            self._watch.close()
        self._finalizer.detach()
        # joining may wait for a worker's last system call: not on the loop thread
        await run_on_thread_to_end(self._lib.at_free, self._h)
