"""The native engine: the chunk protocol's jobs run by the C workers (:mod:`asynctier.engines.native`).

The plain store and load never come here: :mod:`.fast` plans and books them on the loop
thread; what they hand on (victims to unlink, a refused recycle, a retry) continues here,
one coroutine per chunk.

Each job of a plan (:mod:`.protocol`) goes to the workers as one :class:`~asynctier.engines.native.Job`
descriptor; they run it open to close, with the payload's xxh3, holding no GIL, and report
its :class:`~.protocol.Outcome` in batches through an eventfd. What follows an outcome is
the protocol's; a job that does not simply succeed is done again by the threads engine,
which owns recovery and errors (:meth:`NativeIO._fall_back`, the one way across).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from asynctier.core.backend import run_on_thread_to_end, run_to_completion
from asynctier.core.jobs import Skipped
from asynctier.core.ops import PRIO_LOAD, PRIO_STORE
from asynctier.engines import native as nativeio
from asynctier.engines.native_engine import NativeEngine
from asynctier.engines.speedups import speedups
from asynctier.integrity import MAX_B32_KEY, pack_header
from asynctier.posix_io import O_DIRECT, aligned_buffer, buffer_address

from . import bulk, layout
from .layout import HEADER_BLOCK
from .protocol import SAFE_OPEN, Outcome, Spare, SpareJob, Step, StoreJob, TierHandle, not_found

if TYPE_CHECKING:
    from .tier import FsTier

__all__ = ["NativeIO"]

log = logging.getLogger(__name__)

#: A store evicting more files than this evicts them (and writes) on a slow-path thread.
_MAX_NATIVE_VICTIMS = 4
#: Chunks of one group job at most (:mod:`.fast`): each needs a header block of its own, and
#: is one job of the pool's GROUP (which holds ``GROUP_MAX``).
GROUP_CHUNKS = nativeio.GROUP_MAX
_JOB_SIZE = nativeio.JOB_LAYOUT.size


def _outcome(res: nativeio.Outcome) -> Outcome:
    if res.stage:
        return Outcome(Step(res.stage), -res.result)
    return Outcome(result=res.result, name_taken=bool(res.info), csum=res.csum)


class NativeIO(TierHandle):
    """The chunk protocol of ``tier`` on the workers of ``engine`` (from the event loop)."""

    def __init__(self, tier: FsTier, engine: NativeEngine) -> None:
        super().__init__(tier)
        self.engine = engine
        self._pool: nativeio.NativePool  # the engine's pool, once started (start)
        self._hb: memoryview | None = None  # GROUP_CHUNKS header blocks per job slot
        #: the header blocks: block ``slot`` is the slot's own (a one-chunk job's), the others
        #: its group job's (:meth:`block`)
        self.slot_hb: list[memoryview] = []
        self._hb_used: list[int] = []  # bytes of each block that may not be zero
        self._subs = bytearray()  # the pool's table of group jobs' descriptors (start), and their outcomes
        self._res: memoryview = memoryview(b"")
        self._sub_at: list[int] = []  # each slot's place in them
        self._res_at: list[int] = []
        self._n, self._digest, self._sync = 0, b"", 0  # chunk bytes, layout digest, protocol.sync (start)
        self._slot_blocks: list[list[int]] = []  # each slot's group job's blocks (blocks(slot, GROUP_CHUNKS))
        self._hb_addr = 0
        self._slots = 0
        self._view_addr = 0
        self._lock_fd = -1  # the tier's lock on its namespace (start)
        #: every chunk of the view is aligned for O_DIRECT; then its write flags are these
        self.aligned = False
        self.direct_flags = os.O_WRONLY | O_DIRECT
        # per-chunk naming and header packing: the C twins where built, else the Python ones
        self._name_of: Callable[[bytes], tuple[int, bytes]] = layout.name_of
        self._pack_header_into: Callable[[memoryview, int, bytes, int, bytes], int] | None = None
        self._pack_reads = bulk.pack_reads
        self._reads_failed = bulk.reads_failed
        self._pack_recycles = bulk.pack_recycles
        self._pack_writes = bulk.pack_writes
        self._jobs_failed = bulk.jobs_failed
        self.split_plain = bulk.split_plain
        fast = speedups()
        if fast is not None:
            self._name_of = fast.name_of
            self._pack_header_into = fast.pack_header_into
            self._pack_reads = fast.pack_reads
            self._reads_failed = fast.reads_failed
            self._pack_recycles = fast.pack_recycles
            self._pack_writes = fast.pack_writes
            self._jobs_failed = fast.jobs_failed
            self.split_plain = fast.split_plain

    def start(self) -> None:
        """Once the engine runs: the header blocks, and addresses by arithmetic on the hot
        path (not a buffer export per chunk)."""
        pool = self.engine.pool
        assert pool is not None
        self._pool = pool  # (the engine's, for the life of both: read on the hot path)
        blocks = self._lay_out(pool.slots)
        self._hb = aligned_buffer(HEADER_BLOCK * blocks)
        self.slot_hb = [self._hb[i * HEADER_BLOCK : (i + 1) * HEADER_BLOCK] for i in range(blocks)]
        self._hb_addr = buffer_address(self._hb)
        tier = self.live_tier()
        self._view_addr = buffer_address(tier._view)
        self._lock_fd = tier._lock_fd  # (taken at open, before this; read per recycled chunk)
        # read per group job: each slot's place in the pool's tables, the tier's constants
        self._subs, self._res = pool.sub_jobs(0)[0], pool.sub_outcomes(0)[0]
        self._sub_at = [pool.sub_jobs(s)[1] for s in range(pool.slots)]
        self._res_at = [pool.sub_outcomes(s)[1] for s in range(pool.slots)]
        spec = tier.offloading_spec
        self._n, self._digest, self._sync = spec.chunk_bytes, spec.layout_digest, int(self.protocol.sync)
        block = self.protocol.block
        self.aligned = self._view_addr % block == 0 and spec.chunk_bytes % block == 0

    def _lay_out(self, slots: int) -> int:
        """The header blocks of ``slots`` job slots, as :meth:`block` numbers them; their count."""
        self._slots = slots
        blocks = slots * GROUP_CHUNKS
        # the blocks after the slots' own serve group jobs only, whose packers write (or read)
        # each whole: marked in use from the start, so that a group job marks only its slot's
        self._hb_used = [0] * slots + [HEADER_BLOCK] * (blocks - slots)
        self._slot_blocks = [self.blocks(slot, GROUP_CHUNKS) for slot in range(slots)]
        return blocks

    def block(self, slot: int, i: int) -> int:
        """The header block of chunk ``i`` of the (group) job in ``slot``; chunk 0's is the
        slot's own, so a one-chunk job's block is its slot's number."""
        return slot if i == 0 else self._slots + slot * (GROUP_CHUNKS - 1) + i - 1

    def blocks(self, slot: int, n: int, first: int = 0) -> list[int]:
        """:meth:`block` of chunks ``first`` to ``n - 1`` of the group job in ``slot``."""
        if first >= n:
            return []
        base = self._slots + slot * (GROUP_CHUNKS - 1) - 1
        return [slot, *range(base + 1, base + n)] if first == 0 else list(range(base + first, base + n))

    def _take_blocks(self, slot: int, first: int, m: int) -> list[int]:
        """:meth:`blocks` of chunks ``first`` to ``first + m - 1`` of the group job in
        ``slot``, each marked as holding up to ``HEADER_BLOCK`` bytes that may not be zero (a
        header packed or read there): only the slot's own needs it (see :meth:`start`)."""
        if not first and m:
            self._hb_used[slot] = HEADER_BLOCK
        return self._slot_blocks[slot][first : first + m]

    def pack_reads(self, slot: int, keys: list[bytes], cids: list[int], flags: int, hashed: int) -> nativeio.JobFields:
        """The :data:`~asynctier.engines.native.GROUP` job of slot ``slot`` that reads the
        file of each of ``keys`` (1 to :data:`GROUP_CHUNKS`) into chunk ``cids[j]`` and header
        block :meth:`block` ``(slot, j)``; :meth:`reads_failed` checks them once it ended."""
        blocks = self._take_blocks(slot, 0, len(keys))  # (hb_read_into)
        pack = self._pack_reads if max(map(len, keys)) <= MAX_B32_KEY else bulk.pack_reads
        pack(self._subs, self._sub_at[slot], PRIO_LOAD, keys, cids, blocks, self.protocol.shard_fds, flags,
             hashed, self._hb_addr, HEADER_BLOCK, self._view_addr, self._n)  # fmt: skip
        return self._pool.packed_group(slot, PRIO_LOAD, len(keys))

    def pack_writes(self, slot: int, first: int, keys: list[bytes], cids: list[int], flags: int) -> list[int]:
        """Into the :data:`~asynctier.engines.native.GROUP` job of slot ``slot``, from its job
        ``first`` on: the store of each chunk ``cids[j]`` under ``keys[j]`` into a new unnamed
        file (one ``WRITE`` job each, as ``protocol.store`` and :meth:`store_fields` plan one),
        a file made ahead by the tier's pool where one is ready; those files (-1: none). Each
        job hands its file over (``MODE_CLOSE``): the worker closes it once done, not the loop
        thread; the caller closes them only if the group never ran (refused as a whole)."""
        proto = self.protocol
        m = len(keys)
        blocks = self._take_blocks(slot, first, m)
        pack = bulk.pack_writes if max(map(len, keys)) > MAX_B32_KEY else self._pack_writes
        mode = proto.file_mode | (nativeio.MODE_FIX if proto.fix_mode else 0) | nativeio.MODE_CLOSE
        assert self._hb is not None
        pool = proto.pool
        fds = pool.take_many(m) if pool is not None and flags == pool.flags else [-1] * m
        try:
            if pool is not None and fds[-1] < 0:
                self._stats.incr("tmpfile_pool_empty", fds.count(-1))
            pack(self._subs, self._sub_at[slot] + first * _JOB_SIZE, PRIO_STORE, keys, cids, blocks, fds,
                 proto.shard_fds, flags, self._sync, mode, self._hb, self._hb_addr, HEADER_BLOCK, self._view_addr,
                 self._n, self._digest)  # fmt: skip
        except BaseException:
            for fd in fds:
                if fd >= 0:
                    os.close(fd)
            raise
        return fds

    def pack_recycles(
        self, slot: int, first: int, keys: list[bytes], victims: list[bytes], cids: list[int], flags: int
    ) -> list[str]:
        """Into the :data:`~asynctier.engines.native.GROUP` job of slot ``slot``, from its job
        ``first`` on: the store of each chunk ``cids[j]`` under ``keys[j]`` into the file of
        ``victims[j]`` (one ``RECYCLE`` job each, as :meth:`recycle_plan` plans one); the
        temporary names they give the victims' files. The group's descriptor:
        :meth:`~asynctier.engines.native.NativePool.packed_group`."""
        proto = self.protocol
        m = len(keys)
        blocks = self._take_blocks(slot, first, m)
        temps = proto.names.next_many(m)
        long = max(map(len, keys)) > MAX_B32_KEY or max(map(len, victims)) > MAX_B32_KEY
        pack = bulk.pack_recycles if long else self._pack_recycles
        assert self._hb is not None
        pack(self._subs, self._sub_at[slot] + first * _JOB_SIZE, PRIO_STORE, keys, victims, temps, cids, blocks,
             proto.shard_fds, flags | SAFE_OPEN, self._lock_fd, self._sync, proto.file_mode, self._hb, self._hb_addr,
             HEADER_BLOCK,
             self._view_addr, self._n, self._digest)  # fmt: skip
        return temps

    def jobs_failed(self, slot: int, m: int) -> list[int]:
        """The ``j`` of the ``m`` jobs of the group job that ended in ``slot`` that did not simply
        succeed (a failed step, or a name another writer took first)."""
        return self._jobs_failed(self._res, self._res_at[slot], m)

    def reads_failed(self, slot: int, keys: list[bytes]) -> list[int]:
        """The ``j`` of the reads of :meth:`pack_reads` (its ``keys``) that did not simply
        succeed: each other read its whole file, whose header is the one its key was stored
        with, with the checksum of the payload read (for ``verify=True``)."""
        assert self._hb is not None
        return self._reads_failed(self._res, self._res_at[slot], keys, self._slot_blocks[slot][: len(keys)], self._hb,
                                  HEADER_BLOCK, self._n, self._digest)  # fmt: skip

    def hb_address(self, slot: int) -> int:
        return self._hb_addr + slot * HEADER_BLOCK

    def hb_read_into(self, slot: int) -> None:
        """A read fills the slot's whole header block with a file's: zeroed before a store's."""
        self._hb_used[slot] = HEADER_BLOCK

    async def _run(self, slot: int, job: nativeio.Job) -> Outcome:
        return _outcome(await self._pool.run(slot, job))

    async def _fall_back(self, fn: Callable[..., Any], *args: Any) -> None:
        """The one way from this engine to the threads engine: a job that did not simply
        succeed (the workers report the step that failed) is counted and its chunk done
        again by ``fn`` on a slow-path thread holding an I/O token. Runs to its end if
        cancelled: it reads or fills the caller's buffer."""
        self._stats.incr("native_retries")
        await self.engine.blocking(fn, *args)

    # -- the job bodies the runtime runs -----------------------------------------------------
    async def store_job(self, key: bytes, cid: int, t0: float) -> Skipped | None:
        return await self.live_tier()._async_store(key, t0, lambda victims: self.store(key, cid, victims))

    async def load_job(self, key: bytes, cid: int, t0: float) -> None:
        tier = self.live_tier()
        if tier.index_incomplete:
            entry = await run_on_thread_to_end(tier._pin_for_load, key)  # may look on disk
        else:
            entry = tier._pin_for_load(key)
        blocking = self.engine.blocking
        await tier._async_load(key, t0, lambda: self.load(key, cid), lambda _e: blocking(tier.delete_chunk, key), entry)

    # -- stores ----------------------------------------------------------------------------
    async def store(
        self, key: bytes, cid: int, victims: list[bytes], taken: tuple[SpareJob, Outcome] | None = None
    ) -> None:
        """Evict ``victims``, then store chunk ``cid`` under ``key``, as native jobs: into the
        first victim's file where it may be recycled. The workers fill in the checksums.
        ``taken``: the spare job of the first victim already ran (the fast path's), with this
        outcome."""
        tier = self.live_tier()
        proto = tier.protocol
        data = tier._chunk(cid)
        if len(victims) > _MAX_NATIVE_VICTIMS:
            await self.engine.blocking(tier.threads.evict_then_store, key, data, victims)
            return
        addr = self._view_addr + cid * tier.offloading_spec.chunk_bytes
        flags = proto.write_flags(data, addr)
        dfd = proto.name(key)[0]
        slot = self._pool.take_slot()
        spare: Spare | None = None
        job: StoreJob | None = None
        try:
            rest = victims
            if taken is not None or (victims and tier.recycle_on):
                if taken is not None:
                    spare, unlink_first = await self._spare_taken(slot, victims[0], *taken, dfd)
                else:
                    spare, unlink_first = await self._take_spare(slot, victims[0], flags, dfd)
                if not unlink_first:  # the first victim is evicted (its file taken, or gone)
                    rest = victims[1:]
            for v in rest:
                await self._evict(slot, v)
            job = proto.store(key, data, None, spare, flags)
            out = await self._run(slot, self._store_job(slot, job, addr, data.nbytes))
        except BaseException:
            # cancelled: the jobs have ended (a cancelled wait waits for a running job)
            await run_on_thread_to_end(proto.abandon, job, spare)
            raise
        finally:
            self._pool.put_slot(slot)
        proto.release(job)
        if out.ok and not out.name_taken:
            proto.stored(job, out)
            return
        # a name found taken is checked on the threads engine (is it this key's chunk?)
        await self._fall_back(self._store_again, job, out, data)

    def _store_job(self, slot: int, job: StoreJob, addr: int, n: int) -> nativeio.Job:
        return nativeio.Job(-1, 0, *self.store_fields(slot, job, addr, n))

    def _put_header(self, block: int, header: bytes) -> int:
        """Write a store's header into header block ``block``; its length."""
        hb = self.slot_hb[block]
        size = len(header)
        hb[:size] = header  # ~100 bytes of header, not chunk data
        used = self._hb_used[block]
        if used > size:  # the rest of the block is written to the file too: zeros, not an old header
            hb[size:used] = bytes(used - size)
        self._mark(block, size)
        return size

    def _mark(self, block: int, size: int) -> None:
        """Block ``block`` may be non-zero in its first ``size`` bytes only. A block after the
        slots' own stays marked whole: a group job's packers write it whole and do not mark it
        (:meth:`_lay_out`), so a smaller mark would leave their header's tail unzeroed."""
        self._hb_used[block] = size if block < self._slots else HEADER_BLOCK

    def name_of(self, key: bytes) -> tuple[int, bytes]:
        """(shard, file name as bytes) of ``key``'s chunk (:func:`.layout.name_of`, in C where built)."""
        return self._name_of(key) if len(key) <= MAX_B32_KEY else layout.name_of(key)

    def new_header(self, block: int, key: bytes, n: int) -> int:
        """Write the header of a store of ``n`` bytes under ``key`` (with a zero checksum: the
        workers fill it in) into header block ``block``; its length."""
        pack, digest = self._pack_header_into, self._digest
        if pack is None:
            return self._put_header(block, pack_header(key, n, 0, digest))
        size = pack(self.slot_hb[block], self._hb_used[block], key, n, digest)
        self._mark(block, size)
        return size

    def recycle_plan(
        self, block: int, key: bytes, victim: bytes, flags: int, addr: int, n: int
    ) -> tuple[nativeio.JobFields, str]:
        """:meth:`recycle_fields` of ``protocol.recycle(key, victim, ...)`` without making the
        plan's objects (per chunk, a full tier's steady state): the descriptor, and the
        temporary name it gives the victim's file (``protocol.recycle(..., temp=)`` makes
        the objects for a job that did not simply succeed)."""
        proto = self.protocol
        fds = proto.shard_fds
        ks, kname = self.name_of(key)
        vs, vname = self.name_of(victim)
        temp = proto.names.next()
        size = self.new_header(block, key, n)
        return (nativeio.RECYCLE, PRIO_STORE, fds[ks], flags | SAFE_OPEN, self._lock_fd, fds[vs],
                int(proto.sync), 0, size - 8, proto.file_mode, self._hb_addr + block * HEADER_BLOCK, HEADER_BLOCK,
                addr, n, 0, kname, vname, temp.encode()), temp  # fmt: skip

    def recycle_fields(self, block: int, job: StoreJob, sj: SpareJob, addr: int, n: int) -> nativeio.JobFields:
        """The descriptor of the one-job store :meth:`.protocol.ChunkProtocol.recycle` plans,
        its header in header block ``block`` (a slot's own: the slot's number, :meth:`block`)."""
        size = self._put_header(block, job.header)
        return (nativeio.RECYCLE, PRIO_STORE, job.dfd, sj.flags, self._lock_fd, sj.dfd, int(job.sync), 0,
                size - 8, sj.mode, self._hb_addr + block * HEADER_BLOCK, HEADER_BLOCK, addr, n, 0, job.name.encode(),
                sj.name.encode(), sj.temp.encode())  # fmt: skip

    def store_fields(self, block: int, job: StoreJob, addr: int, n: int) -> nativeio.JobFields:
        """The descriptor of ``job``, its header written into header block ``block``."""
        proto = self.protocol
        size = self._put_header(block, job.header)
        # nativeio.fields written out (per chunk); the names are a key's token and a short temporary name
        mode = proto.file_mode | (nativeio.MODE_FIX if proto.fix_mode else 0)
        return (nativeio.WRITE, PRIO_STORE, job.dfd, job.flags, job.fd, job.dfd if job.temp else -1, int(job.sync),
                0, size - 8 if job.fill else 0, mode, self._hb_addr + block * HEADER_BLOCK, HEADER_BLOCK, addr, n, 0,
                job.name.encode(), job.temp.encode(), b"")  # fmt: skip

    def _store_again(self, job: StoreJob, out: Outcome, data: memoryview) -> None:
        self.protocol.remove_leftovers(job, out)
        self.live_tier().threads.store(job.key, data)

    async def _take_spare(self, slot: int, victim: bytes, flags: int, dfd: int) -> tuple[Spare | None, bool]:
        """:meth:`.threads.ThreadsIO.take_spare` as native jobs."""
        tier = self.live_tier()
        proto = tier.protocol
        tier._note_gone(victim)
        job = proto.spare(victim, flags, dfd)
        desc = nativeio.job(nativeio.SPARE, PRIO_STORE, job.dfd, job.name.encode(), flags=job.flags,
                            dfd2=job.new_dfd, name2=job.temp.encode(), mode=job.mode)  # fmt: skip
        ran: list[nativeio.Outcome] = []
        try:
            out = _outcome(await self._pool.run(slot, desc, on_cancelled=ran.append))
        except BaseException:  # cancelled (or a KeyboardInterrupt raised into this task)
            if ran and ran[0].stage == 0:
                # it ran: the victim's file left its name and is open; neither may outlive this
                tier._evicted(victim, None)
                spare_left = Spare(ran[0].result, dfd, job.temp)
                await run_to_completion(lambda: run_on_thread_to_end(proto.abandon, None, spare_left))
            raise
        return await self._spare_taken(slot, victim, job, out, dfd)

    async def _spare_taken(
        self, slot: int, victim: bytes, job: SpareJob, out: Outcome, dfd: int
    ) -> tuple[Spare | None, bool]:
        """What follows the spare job of :meth:`_take_spare`: (the file to overwrite, or None;
        whether the victim is still to be unlinked)."""
        tier = self.live_tier()
        proto = tier.protocol
        spare, exc, unlink_it = proto.spare_taken(job, out)
        if unlink_it:
            return None, True
        tier._evicted(victim, exc)
        if spare is None:
            return None, False
        try:
            # the check queries a lock: on a network file system that is a round trip to the
            # server, which must not stall the event loop
            if tier.network_fs:
                keep = await run_on_thread_to_end(tier._may_recycle, victim)
            else:
                keep = tier._may_recycle(victim)
        except BaseException:
            await run_on_thread_to_end(proto.abandon, None, spare)
            raise
        if keep:
            return spare, False
        os.close(spare.fd)
        res = await self._run(slot, nativeio.job(nativeio.UNLINK, PRIO_STORE, dfd, spare.temp.encode()))
        if not res.ok and res.err != errno.ENOENT:
            log.debug("fs tier: cannot remove %s: %s", spare.temp, os.strerror(res.err))
        return None, False

    async def _evict(self, slot: int, victim: bytes) -> None:
        """Evict ``victim`` by unlinking its file, as a native job."""
        tier = self.live_tier()
        tier._note_gone(victim)
        job = tier.protocol.unlink(victim)
        out = await self._run(slot, nativeio.job(nativeio.UNLINK, PRIO_STORE, job.dfd, job.name.encode()))
        tier._evicted(victim, None if out.ok or out.err == errno.ENOENT else out.error())

    # -- loads -----------------------------------------------------------------------------
    async def load(self, key: bytes, cid: int) -> None:
        """One native job: open, read header block and payload into the caller's slice,
        close, the payload's xxh3; then the header is checked here."""
        tier = self.live_tier()
        out = tier._chunk(cid)
        addr = self._view_addr + cid * tier.offloading_spec.chunk_bytes
        # a refused O_NOATIME (EPERM) or O_DIRECT (EINVAL) fails the job; the retry mends it
        job = tier.protocol.load(key, out, addr)
        slot = self._pool.take_slot()
        self.hb_read_into(slot)
        try:
            desc = nativeio.job(nativeio.READ, PRIO_LOAD, job.dfd, job.name.encode(), flags=job.flags,
                                hb=self._hb_addr + slot * HEADER_BLOCK, hb_len=HEADER_BLOCK, buf=addr,
                                n=out.nbytes, hashed=tier.verify)  # fmt: skip
            res = await self._run(slot, desc)
            if res.step == Step.OPEN and res.err == errno.ENOENT:
                raise not_found(key)
            if res.ok:
                # the header is still in this slot's block: the slot is held until checked
                tier.check_read(key, self.slot_hb[slot], out, res.result, res.csum if tier.verify else None)
                return
        finally:
            self._pool.put_slot(slot)
        await self._fall_back(tier.threads.load, key, out)
