"""Coalesced jobs: a call of many small chunks runs as jobs of up to ``coalesce_bytes`` of
slots; each job writes (or reads) every run of adjacent slots with one I/O and takes the index
lock twice (allocate all, publish all), not per chunk.

The per-chunk Python work is what bounds small chunks' rate; measurements in
docs/benchmarks.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from asynctier import BlockingChunkTier, IntegrityError
from asynctier.core.jobs import SKIPPED, Outcomes, evened
from asynctier.engines.descriptors import GROUP_MAX, READV_MAX
from asynctier.integrity import checksum, pack_header

from .catalog import Catalog, Slots
from .slab import SlabSet, slot_error

__all__ = ["RUNS_A_TURN", "CoalescedJobs"]

#: Runs of one job handed to the native workers in one pool ``GROUP`` job (a turn of the loop),
#: which with the run limit also bounds a job's slots: 16, the pool's limit when the nvme
#: tier's group jobs were measured (docs/tiers/nvme.md). The pool takes up to ``GROUP_MAX``
#: (32, so that an fs call of 32 files is one job); more runs a turn here would make jobs, and
#: each engine slot's header blocks, larger at depths above 16, unmeasured.
RUNS_A_TURN = min(16, GROUP_MAX)


class CoalescedJobs(BlockingChunkTier):
    """The group job bodies of the nvme tier (a base of :class:`~.tier.NvmeTier`, which
    sets the attributes below at open)."""

    coalesce_bytes: int
    _slabs: SlabSet
    _catalog: Catalog | None
    #: every primary chunk can go straight to the medium (:meth:`SlabSet.all_zero_copy`)
    _zc_all: bool
    #: slots of one run at most on the native workers (:meth:`_native_run_slots`, at open)
    _run_limit: int

    def _spreads_jobs(self) -> bool:
        """Whether a job's runs are spread over the native workers, each its own I/O holding
        its own token (:class:`~.tier.NvmeTier`: on the native engine, every chunk straight to
        the medium); else a job's runs are written one after another by one thread."""
        return False

    def _native_run_slots(self) -> int:
        """Slots of one run at most on the native workers: the slab's limit
        (:attr:`.slab.SlabSet.run_slots`), the workers' (``READV_MAX``), and about
        ``coalesce_bytes``: the pool keeps up to ``max_inflight`` of a job's runs in flight, each
        then about as large as a job of a call alone was before jobs were spread, so a large
        call queues no more bytes ahead of a load than it did."""
        geo = self._slabs.geo
        assert geo is not None
        return max(1, min(READV_MAX, self._slabs.run_slots, self.coalesce_bytes // geo.slot_size))

    def group_size(self, op: str, n: int) -> int:
        """Chunks per job for a call of ``n`` chunks (1: one job per chunk, the base path)."""
        geo = self._slabs.geo
        if op not in ("offload", "load") or n < 2 or geo is None:
            return 1
        workers = self.max_inflight or 1
        if self._spreads_jobs():
            # the workers run a job's runs at once, each its own I/O of up to about
            # coalesce_bytes holding its own token (_native_run_slots), so the depth takes no
            # more jobs than one: a call is one job, of up to max_inflight times that, and of
            # runs that fit one GROUP job (its header blocks, per engine slot, stay bounded).
            # Each job costs the loop thread its planning and booking, some 1,700 bytecodes
            # (docs/benchmarks-issue-28.md, nineteenth pass); the jobs running at once hold at most half
            # the slab, as below
            most = min(self.coalesce_bytes * workers // geo.slot_size, RUNS_A_TURN * self._run_limit)
            size = min(n, geo.nslots // (2 * workers), most)
            return 1 if size < 2 else evened(n, size)
        # up to max_inflight jobs at once, from all the calls in progress: this call's share
        # is as many jobs as that over the calls, each up to that many times coalesce_bytes,
        # since every job costs the loop thread its planning and booking (bench_loop_cpu.py;
        # some 35-55 us a job). A call alone keeps jobs of coalesce_bytes at most: a large
        # one then has many, and the last of them do not leave the device idle for long
        # (with other calls in progress, theirs keep it busy)
        calls = self._active + 1
        share = max(1, workers // calls)
        # the slots all running jobs hold stay within half the slab: the rest are free or
        # published, so eviction always finds room and a call larger than the slab ends as
        # one chunk per job would (not with CapacityError for the keys beyond the free slots)
        cmax = min(self.coalesce_bytes * calls // geo.slot_size, geo.nslots // (2 * workers))
        if cmax < 2:
            return 1
        # and never jobs smaller than coalesce_bytes where the call has that much: a run of
        # adjacent slots is one I/O however long, and a lone call of 32 chunks of 64 KiB
        # moved as fast as 3 jobs as it did as 16, at half the loop's CPU a chunk
        # (docs/benchmarks-issue-28.md, thirteenth pass); the jobs evened out
        size = max(1, min(cmax, max(n // share, min(n, self.coalesce_bytes // geo.slot_size))))
        return evened(n, size)

    def group_body(self, op: str) -> Callable[[list[bytes], list[int], float], Outcomes]:
        return self._store_group if op == "offload" else self._load_group

    def _check_loaded(
        self, key: bytes, slot: int, seq: int, csum: int, hb: memoryview, payload: memoryview
    ) -> IntegrityError | None:
        """Whether one loaded slot holds exactly the indexed write of ``key`` (None) or not."""
        return slot_error(hb, payload, key, slot, seq, csum, self.offloading_spec.layout_digest, self.verify)

    # -- stores --------------------------------------------------------------------------------
    def _store_group(self, keys: list[bytes], cids: list[int], t0: float) -> Outcomes:
        """Store several chunks: allocate, write each run of adjacent slots with one ``pwritev``,
        publish, one journal wait; stats booked once. Returns each key's failure (None: stored)."""
        cat = self._catalog
        assert cat is not None
        out: Outcomes = [None] * len(keys)
        slots, failed, wait, skipped, skip_ticket = cat.allocate_many(keys)
        for p, e in failed.items():
            out[p] = e
            self._end_store(keys[p], t0, e)
        self._write_group(keys, cids, t0, out, slots, wait)
        self._settle_skipped(keys, t0, out, skipped, skip_ticket)
        return out

    def _settle_skipped(self, keys: list[bytes], t0: float, out: Outcomes, skipped: list[int], ticket: int) -> None:
        """The keys found stored (positions ``skipped``): a success once the record that
        published them (``ticket``) is in the journal."""
        if not skipped:
            return
        cat = self._catalog
        assert cat is not None
        try:
            cat.journal.wait(ticket)
        except Exception as e:
            for p in skipped:
                out[p] = e
                self._end_store(keys[p], t0, e)
        else:
            for p in skipped:
                out[p] = SKIPPED
            self._stats.record_successes("offload", 0, 0, time.perf_counter() - t0, skipped=len(skipped))

    def _write_group(
        self, keys: list[bytes], cids: list[int], t0: float, out: Outcomes, slots: Slots, wait: int
    ) -> None:
        """The writes of :meth:`_store_group`, with its slots allocated; outcomes land in ``out``."""
        slabs, cat = self._slabs, self._catalog
        assert cat is not None
        if not slots:
            return
        try:
            cat.journal.wait(wait)  # EVICT records of reused slots first
        except BaseException as e:
            self._abort_group(keys, list(slots), slots, out, e, t0, wait)
            return
        S = slabs.slot_size
        gbuf = slabs.buffer(len(keys))
        digest = self.offloading_spec.layout_digest
        view, cb, zc_all = self._view, self.offloading_spec.chunk_bytes, self._zc_all
        csums: dict[int, int] = {}
        written: list[int] = []
        for run in slabs.runs(slots):
            iov: list[memoryview] = []
            try:
                for p, _slot, _, _ in run:
                    start = cids[p] * cb
                    data = view[start : start + cb]
                    csum = csums[p] = checksum(data)
                    head = pack_header(keys[p], cb, csum, digest, slots[p][1])
                    direct = zc_all or slabs.zero_copy_ok(data)
                    iov += slabs.write_iov(gbuf[p * S : (p + 1) * S], head, data, direct)
                slabs.pwritev(slabs.fds[run[0][2]], iov, run[0][3])
            except BaseException as e:
                self._abort_group(keys, [p for p, _, _, _ in run], slots, out, e, t0, wait)
                continue
            written += [p for p, _, _, _ in run]
        self._publish_group(keys, t0, out, slots, written, csums)

    def _publish_group(
        self, keys: list[bytes], t0: float, out: Outcomes, slots: Slots, written: list[int], csums: dict[int, int]
    ) -> None:
        """Publish the positions ``written`` (their slots filled), wait for their records, book them."""
        cat = self._catalog
        assert cat is not None
        last = cat.publish_many(keys, written, slots, csums) if written else 0
        try:
            cat.journal.wait(last)
        except BaseException as e:
            for p in written:
                out[p] = e
                self._end_store(keys[p], t0, e)
            written = []
        cb = self.offloading_spec.chunk_bytes
        self._stats.record_successes("offload", len(written), cb, time.perf_counter() - t0)

    def _abort_group(
        self, keys: list[bytes], ps: list[int], slots: Slots, out: Outcomes, e: BaseException, t0: float,
        ticket: int = 0,
    ) -> None:  # fmt: skip
        """Positions ``ps`` were not written: free their slots (nothing published, still behind
        ``ticket``, the group's EVICT records), fail them."""
        cat = self._catalog
        assert cat is not None
        for p in ps:
            cat.abort(keys[p], slots[p][0], ticket)
            out[p] = e
            self._end_store(keys[p], t0, e)

    # -- loads -----------------------------------------------------------------------------------
    def _load_group(self, keys: list[bytes], cids: list[int], t0: float) -> Outcomes:
        """Load several chunks: one ``preadv`` per run of adjacent slots, then verify each."""
        slabs, cat = self._slabs, self._catalog
        assert cat is not None
        out: Outcomes = [None] * len(keys)
        found, missing = cat.pin_many(keys)
        for p, e in missing.items():
            out[p] = e
            self._end_load(keys[p], t0, e)
        S, H = slabs.slot_size, slabs.hdr_area
        gbuf = slabs.buffer(len(keys))
        view, cb, zc_all = self._view, self.offloading_spec.chunk_bytes, self._zc_all
        try:
            for run in slabs.runs(found):
                iov: list[memoryview] = []
                direct: list[bool] = []
                for p, _, _, _ in run:
                    dst = view[cids[p] * cb : cids[p] * cb + cb]
                    d = zc_all or slabs.zero_copy_ok(dst)
                    direct.append(d)
                    iov += slabs.read_iov(gbuf[p * S : (p + 1) * S], dst, d)
                try:
                    got = slabs.preadv(slabs.fds[run[0][2]], iov, run[0][3])
                except BaseException as e:
                    for p, _, _, _ in run:
                        out[p] = e
                    continue
                for i, (p, slot, _, _) in enumerate(run):
                    if got < (i + 1) * S:
                        out[p] = IntegrityError(f"short read of slot {slot}", keys[p])
                        continue
                    dst = view[cids[p] * cb : cids[p] * cb + cb]
                    region = gbuf[p * S : (p + 1) * S]
                    payload = slabs.payload(region, dst, direct[i])
                    out[p] = self._check_loaded(keys[p], slot, found[p][1], found[p][2], region[:H], payload)
                    if out[p] is None and not direct[i]:
                        dst[:] = payload  # bounce copy (unaligned view)
                        self._stats.incr("bounce_copies")
        finally:
            cat.unpin([s for s, _, _ in found.values()])
        return self._end_load_group(keys, out, found, t0)

    def _end_load_group(
        self, keys: list[bytes], out: Outcomes, found: dict[int, tuple[int, int, int]], t0: float
    ) -> Outcomes:
        """Book a group's loads (pins released already); drop the slots that failed verification."""
        cat = self._catalog
        assert cat is not None
        ok = 0
        for p in found:
            outcome = out[p]
            if not isinstance(outcome, BaseException):
                ok += 1
                continue
            if isinstance(outcome, IntegrityError):
                cat.forget(keys[p], found[p][0], found[p][1])  # that copy only
            self._end_load(keys[p], t0, outcome)
        self._stats.record_successes("load", ok, self.offloading_spec.chunk_bytes, time.perf_counter() - t0)
        return out
