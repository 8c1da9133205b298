"""How the chain moves chunks for a call: between the caller's slots and its staging slots,
down the tiers for a store, up them for a load, and into the background (write-back,
promotion). :class:`ChainTransfers` is a part of :class:`~.tier.ChainTier`."""

from __future__ import annotations

import concurrent.futures
import functools
import time

import anyio

from asynctier.core.backend import after_fork_in_child, run_on_thread_to_end
from asynctier.errors import ChunkNotFoundError, failure_kind
from asynctier.spec import OffloadingSpec
from asynctier.stats import StatsRecorder, TransferResult

from .admission import NotAdmittedError
from .background import Backlog, RemovalFence
from .config import ChainConfig
from .demotion import Demoter
from .member import Detached, Member
from .staging import StagingPool

__all__ = ["ChainTransfers"]

#: Copies of up to this many bytes run on the event loop; larger ones on a copy thread.
_INLINE_COPY = 256 * 1024
#: Calls that copy more run their copies here (memcpy releases the GIL for large buffers).
_copier: list[concurrent.futures.ThreadPoolExecutor] = []  # made at first use, again in a forked child


def _copier_pool() -> concurrent.futures.ThreadPoolExecutor:
    if not _copier:
        _copier.append(concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="asynctier-chain-copy"))
    return _copier[0]


after_fork_in_child(_copier.clear)


class ChainTransfers:
    """The chain's batches: one batch is some keys of a call, each in a staging slot it holds."""

    offloading_spec: OffloadingSpec
    config: ChainConfig
    members: list[Member]
    _view: memoryview
    _staging: memoryview
    _pool: StagingPool
    _fence: RemovalFence
    _backlog: Backlog
    _demoter: Demoter | None
    _stats: StatsRecorder

    # -- copies between the caller's slots and the staging slots -----------------------------
    async def _copy(self, pairs: list[tuple[int, int]], *, to_staging: bool) -> None:
        """Copy chunk ``cid`` -> staging ``slot`` (or back) for each ``(cid, slot)``; once
        started it ends before a cancellation goes on (it touches the caller's slots)."""
        c = self.offloading_spec.chunk_bytes
        caller, staging = self._view, self._staging

        def run() -> None:
            for cid, slot in pairs:
                if to_staging:
                    staging[slot * c : (slot + 1) * c] = caller[cid * c : (cid + 1) * c]
                else:
                    caller[cid * c : (cid + 1) * c] = staging[slot * c : (slot + 1) * c]

        if len(pairs) * c <= _INLINE_COPY:
            run()
        else:
            await run_on_thread_to_end(run, executor=_copier_pool())

    @staticmethod
    def _note(res: TransferResult, m: Member, failed: dict[bytes, BaseException]) -> None:
        for k, e in failed.items():
            if failure_kind(e) != "not_found":
                res.tier_failures.setdefault(m.name, {})[k] = e

    async def _load_batch(
        self, batch: list[tuple[bytes, int]], held: list[int], res: TransferResult,
        outcome: dict[bytes, BaseException | None], t0: float, epoch: int,
    ) -> None:  # fmt: skip
        c = self.offloading_spec.chunk_bytes
        keys = [k for k, _ in batch]
        slot_of = dict(zip(keys, held))
        pos = {k: i for i, k in enumerate(keys)}
        cid_of = dict(batch)
        for m in self.members:
            m.observe(keys)
        first_error: dict[bytes, BaseException] = {}
        pending = keys
        for m in self.members:
            if not pending:
                break
            if m.deadline_s is None:
                got = await m.call("load", pending, [slot_of[k] for k in pending])
            else:
                got = await self._load_within_deadline(m, pending, slot_of, held, pos)
                pending = [k for k in pending if k in slot_of]  # those with no slot left fail here
            failed = got.failed
            if failed:
                self._note(res, m, failed)
                misses = 0
                for k, e in failed.items():
                    if failure_kind(e) == "not_found":
                        misses += 1
                    else:
                        first_error.setdefault(k, e)
                m.count("misses", misses)
            hits = got.succeeded
            if hits:
                await self._copy([(cid_of[k], slot_of[k]) for k in hits], to_staging=False)
                self._stats.record_successes("load", len(hits), c, time.perf_counter() - t0)
                for k in hits:
                    outcome[k] = None
                m.count("hits", len(hits))
                m.count("bytes_out", len(hits) * c)
                if m.index > 0 and self.config.promote:
                    self._promote(hits, slot_of, pos, held, epoch, m)
                if self.config.refresh_below and m.index + 1 < len(self.members):
                    # the tiers below hold it too (stores reach them all): their LRU sees the use
                    self._backlog.refresh(hits, self.members[m.index + 1 :])
                pending = [k for k in pending if k not in outcome]
            if m.index == 0 and pending:  # newer than anything a tier below may hold
                pending = await self._from_backlog(pending, cid_of, outcome, t0)
        for k in keys:
            if k not in outcome:  # no tier served it (or a late tier kept its slot)
                outcome[k] = first_error.get(k) or ChunkNotFoundError(
                    f"no tier of the chain holds key {k.hex()[:32]}", k
                )

    async def _from_backlog(
        self, pending: list[bytes], cid_of: dict[bytes, int], outcome: dict[bytes, BaseException | None], t0: float
    ) -> list[bytes]:
        """Serve the keys the first tier missed from slots still queued for background writes
        (a write-back the first tier evicted ahead of); return the keys left."""
        backlog = self._backlog
        held = [(k, it) for k in pending if (it := backlog.hold(k)) is not None]
        if not held:
            return pending
        try:
            await self._copy([(cid_of[k], it.slot) for k, it in held], to_staging=False)
        finally:
            backlog.release([it for _, it in held])
        backlog.hits += len(held)
        self._stats.record_successes("load", len(held), self.offloading_spec.chunk_bytes, time.perf_counter() - t0)
        for k, _ in held:
            outcome[k] = None
        return [k for k in pending if k not in outcome]

    async def _load_within_deadline(
        self, m: Member, pending: list[bytes], slot_of: dict[bytes, int], held: list[int], pos: dict[bytes, int]
    ) -> TransferResult:
        """Load from a tier with a deadline: when it is late (or the caller is cancelled) its
        staging slots stay with it until it ends, and the keys get fresh slots for the tiers
        below where some are free (the others fail with its timeout)."""
        ticket = Detached()
        slots = [slot_of[k] for k in pending]
        try:
            got = await m.load_detached(pending, slots, ticket)
        finally:
            if ticket.late:
                self._pool.quarantine(slots)
                for k in pending:
                    held[pos[k]] = -1
                    del slot_of[k]
                if ticket.ended:
                    self._pool.end_quarantine(slots)
                else:
                    ticket.on_end = functools.partial(self._pool.end_quarantine, slots)
        if ticket.late:
            for k, slot in zip(pending, self._pool.replacement(len(pending))):
                slot_of[k] = slot
                pos[k] = len(held)
                held.append(slot)
        return got

    def _promote(self, hits: list[bytes], slot_of: dict[bytes, int], pos: dict[bytes, int], held: list[int],
                 epoch: int, found_in: Member) -> None:  # fmt: skip
        """Queue ``hits`` (each in its staging slot) for the tiers above ``found_in``; the
        slots that go to the background leave ``held`` (-1)."""
        above = self.members[: found_in.index]
        admitted = [u.admitted(hits, "promote") for u in above]
        entries = []
        for k in hits:
            targets = [u for u, a in zip(above, admitted) if a is None or k in a]
            if targets:
                entries.append((k, slot_of[k], targets))
        self._to_background(entries, pos, held, epoch, "promote")

    def _to_background(self, entries: list[tuple[bytes, int, list[Member]]], pos: dict[bytes, int],
                       held: list[int], epoch: int, reason: str) -> None:  # fmt: skip
        """Hand the slots of ``entries`` to the background lanes, as many as the backlog has
        room for (the others' background writes are dropped, counted)."""
        if not entries:
            return
        n = self._pool.to_background(len(entries))
        for _, _, targets in entries[n:]:
            for u in targets:
                u.count("drops")
        if n:
            for k, _, _ in entries[:n]:
                held[pos[k]] = -1
            self._backlog.submit(entries[:n], epoch, reason)

    async def _store_batch(
        self, batch: list[tuple[bytes, int]], held: list[int], res: TransferResult,
        outcome: dict[bytes, BaseException | None], t0: float, epoch: int,
    ) -> None:  # fmt: skip
        c = self.offloading_spec.chunk_bytes
        members = self.members
        keys = [k for k, _ in batch]
        slot_of = dict(zip(keys, held))
        for m in members:
            m.observe(keys)
        admitted = [m.admitted(keys, "store") for m in members]  # None: every key
        await self._copy([(cid, held[i]) for i, (_, cid) in enumerate(batch)], to_staging=True)
        first: dict[bytes, int] = {}  # key -> the first tier (index) that stored it
        wrote: set[bytes] = set()  # the keys a tier wrote now (not found stored already)
        last_error: dict[bytes, BaseException] = {}

        async def store_on(m: Member, cand: list[bytes]) -> None:
            got = await m.call("offload", cand, [slot_of[k] for k in cand])
            if got.failed:
                self._note(res, m, got.failed)
                last_error.update(got.failed)
            for k in got.succeeded:
                if first.get(k, m.index) >= m.index:
                    first[k] = m.index
            wrote.update(got.succeeded if not got.skipped else set(got.succeeded).difference(got.skipped))
            m.count("stored", len(got.succeeded))
            m.count("bytes_in", got.bytes_transferred)

        if self.config.write == "through":
            async with anyio.create_task_group() as tg:
                for m, a in zip(members, admitted):
                    cand = keys if a is None else [k for k in keys if k in a]
                    if cand:
                        tg.start_soon(store_on, m, cand)
        else:  # the first admitting tier that takes it, now; the tiers below, in the background
            pending = keys
            for m, a in zip(members, admitted):
                cand = pending if a is None else [k for k in pending if k in a]
                if cand:
                    await store_on(m, cand)
                    pending = [k for k in pending if k not in first]
                if not pending:
                    break
            entries: list[tuple[bytes, int, list[Member]]] = []
            below_all: dict[int, list[Member]] = {}  # every tier admits every key: one list per first tier
            uniform = all(a is None for a in admitted)
            queued = self._backlog.writing_back  # (a promotion queued goes up: it carries nothing below)
            for k in keys:
                i = first.get(k)
                if i is None or i + 1 == len(members):
                    continue
                if k not in wrote and queued(k):
                    # held already, its write-back still queued: that one carries the copy the
                    # tier kept (this call's bytes, written below in its place, were not kept)
                    continue
                if uniform:
                    below = below_all.get(i) or below_all.setdefault(i, members[i + 1 :])
                else:
                    below = [u for u, a in zip(members[i + 1 :], admitted[i + 1 :]) if a is None or k in a]
                if below:
                    entries.append((k, slot_of[k], below))
            self._to_background(entries, {k: i for i, k in enumerate(keys)}, held, epoch, "store")
        now = time.perf_counter()
        stored = skipped = 0
        for k in keys:
            if k in first:
                outcome[k] = None
                stored += 1
                if k not in wrote:  # every tier that took it held it already
                    res.skipped.append(k)
                    skipped += 1
            elif k in last_error:
                outcome[k] = last_error[k]
            else:
                outcome[k] = NotAdmittedError(f"no tier of the chain admitted key {k.hex()[:32]}", k)
        self._stats.record_successes("offload", stored - skipped, c, now - t0, skipped=skipped)
        if self._demoter is not None and 0 in first.values():
            self._demoter.poke()
