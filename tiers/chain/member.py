"""One tier of a chain: the tier itself, its admission policy, deadline and circuit breaker, and
the chain's counters for it.

Every call the chain makes into a tier goes through :meth:`Member.call`: refused at once while
the tier's breaker is open, bounded by its ``deadline_s``, and its outcome reported to the
breaker. A failure never escapes as an exception: it comes back per key, so the chain can say
which tier failed which key and try the next tier.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import anyio

from asynctier.contract import SecondaryTierManager
from asynctier.core.backend import spawn_service
from asynctier.core.breaker import Breaker
from asynctier.errors import FAILURE_KINDS, ChunkTimeoutError, TierUnavailableError, failure_kind
from asynctier.stats import STATS_FAILED, TierStats, TransferResult

from .admission import AdmissionPolicy, AdmitAll, CallablePolicy, FilterPolicy
from .config import EntryConfig

__all__ = ["COUNTERS", "Detached", "Member"]

log = logging.getLogger("asynctier.chain")

#: Failure kinds that say the tier is not reachable (they count against its breaker).
_UNREACHABLE = ("io", "timeout", "unavailable")

#: The chain's counters for each of its tiers (in ``stats().children[name].extra``, prefixed ``chain_``).
COUNTERS = (
    "hits",  # loads served from this tier
    "misses",  # loads asked of this tier that it did not hold
    "stored",  # chunks the chain's calls stored here (foreground)
    "written_back",  # chunks written here in the background after a store (write="back")
    "promotions",  # chunks written here because a lower tier served them
    "demotions",  # chunks written here because the tier above made room
    "touched",  # keys touched here because a tier above served them (refresh_below)
    "touch_drops",  # such touches dropped (too many waiting, tier down or failing)
    "drops",  # background writes for this tier dropped (backlog full, breaker open, removed meanwhile)
    "not_admitted",  # writes its admission policy refused
    "failed",  # keys this tier failed (any call, any kind but not-found)
    "bytes_in",  # bytes the chain wrote into this tier, foreground and background
    "bytes_out",  # bytes the chain read from this tier
)

Op = Literal["offload", "load", "remove"]


class Detached:
    """What became of a :meth:`Member.load_detached` call: ``late`` if the chain stopped
    waiting for it; ``ended`` once the tier call is over; ``on_end`` runs then, if late."""

    def __init__(self) -> None:
        self.late = False
        self.ended = False
        self.on_end: Callable[[], None] | None = None


class Member:
    """A tier of the chain and everything the chain keeps about it."""

    def __init__(self, index: int, entry: EntryConfig, tier: SecondaryTierManager, admission: AdmissionPolicy) -> None:
        self.index = index
        self.name = entry.name
        self.tier = tier
        self.admission = admission
        self.deadline_s = entry.deadline_s
        self.breaker = Breaker(entry.breaker_threshold, entry.breaker_cooldown_s, what=f"chain tier {entry.name!r}")
        self.counts = dict.fromkeys(COUNTERS, 0)
        self._last_stats: TierStats | None = None  # the tier's last good stats() (see snapshot)
        self.failures = dict.fromkeys(FAILURE_KINDS, 0)
        self.backlog = 0  # background writes queued for this tier now
        self.background_in_flight = 0
        self.touching = False  # its lane has touches waiting or running
        # the built-in policies that admit everything, or ignore what they see, cost no call per key
        self.admits_all = type(admission) is AdmitAll
        self._observes = type(admission) not in (AdmitAll, CallablePolicy, FilterPolicy)

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] += n

    def admits(self, key: bytes, reason: str) -> bool:
        try:
            ok = self.admission.admit(key, reason)
        except Exception:  # a custom policy's bug must not fail the call: it refuses, loudly
            log.exception("admission policy %r of chain tier %r failed; not admitting", self.admission, self.name)
            ok = False
        if not ok:
            self.counts["not_admitted"] += 1
        return bool(ok)

    def admitted(self, keys: list[bytes], reason: str) -> set[bytes] | None:
        """Which of ``keys`` the policy admits for ``reason``; None: every key."""
        if self.admits_all:
            return None
        return {k for k in keys if self.admits(k, reason)}

    def observe(self, keys: Sequence[bytes]) -> None:
        if not self._observes:
            return
        try:
            for k in keys:
                self.admission.observe(k)
        except Exception:
            log.exception("admission policy %r of chain tier %r failed in observe()", self.admission, self.name)

    async def lookup(self, keys: list[bytes], *, prefix: bool = False) -> list[bool] | int:
        """``lookup`` (or ``lookup_prefix``) on this tier: a tier that is down or late holds nothing."""
        if self.available:
            with anyio.move_on_after(self.deadline_s if self.deadline_s is not None else math.inf):
                try:
                    return await (self.tier.lookup_prefix(keys) if prefix else self.tier.lookup(keys))
                except Exception:
                    pass
        return 0 if prefix else [False] * len(keys)

    @property
    def available(self) -> bool:
        """Whether a call would be let through now (the breaker is not open)."""
        return self.breaker.state != "open"

    async def call(self, op: Op, keys: list[bytes], slots: list[int]) -> TransferResult:
        """``op`` on this tier through its breaker and deadline; every key comes back in the
        result (never an exception for a per-key failure or an unreachable tier)."""
        res = TransferResult(op)
        if not keys:
            return res
        try:
            probe = self.breaker.before()
        except TierUnavailableError as e:
            self._fail_all(res, keys, e)
            return res
        got: TransferResult | None = None
        error: Exception | None = None
        try:
            if self.deadline_s is None:
                got = await self._op(op, keys, slots)
            else:
                with anyio.move_on_after(self.deadline_s):
                    got = await self._op(op, keys, slots)
        except anyio.get_cancelled_exc_class():
            self.breaker.neutral(probe)
            raise
        except Exception as raised:  # a tier that raises (closed, its workers stopped): its keys fail
            error = raised
        if got is None:
            if error is None:  # the deadline passed
                error = ChunkTimeoutError(f"chain tier {self.name!r}: no answer within deadline_s={self.deadline_s}")
            self.breaker.failure(probe)
            self._fail_all(res, keys, error)
            return res
        self._judge(got, probe)
        self._count_failures(got)
        return got

    def _count_failures(self, got: TransferResult) -> None:
        for exc in got.failed.values():
            kind = failure_kind(exc)
            if kind != "not_found":
                self.counts["failed"] += 1
                self.failures[kind] += 1

    async def load_detached(self, keys: list[bytes], slots: list[int], ticket: Detached) -> TransferResult:
        """A load that the chain stops waiting for at ``deadline_s``: the tier call runs as a
        task of its own into the chain's staging slots (never the caller's), so when it is late
        (or the caller is cancelled) the chain returns at once and ``ticket`` says so; the
        slots come back when the call ends (``ticket.on_end``)."""
        res = TransferResult("load")
        try:
            probe = self.breaker.before()
        except TierUnavailableError as e:
            self._fail_all(res, keys, e)
            return res
        box: dict[str, Any] = {}
        done = anyio.Event()

        async def run() -> None:
            try:
                box["got"] = await self._op("load", keys, slots)
            except Exception as raised:  # a tier that raises: its keys fail
                box["error"] = raised
            finally:
                ticket.ended = True
                done.set()
                if ticket.late:
                    if "got" in box:
                        self._judge(box["got"], False)
                    if ticket.on_end is not None:
                        ticket.on_end()

        spawn_service(run, name=f"asynctier-chain-{self.name}-load")
        try:
            with anyio.move_on_after(self.deadline_s if self.deadline_s is not None else float("inf")):
                await done.wait()
        except anyio.get_cancelled_exc_class():
            ticket.late = not done.is_set()
            self.breaker.neutral(probe)
            raise
        if not done.is_set():
            ticket.late = True
            self.breaker.failure(probe)
            self._fail_all(
                res, keys, ChunkTimeoutError(f"chain tier {self.name!r}: no answer within deadline_s={self.deadline_s}")
            )
            return res
        got: TransferResult | None = box.get("got")
        if got is None:
            self.breaker.failure(probe)
            self._fail_all(res, keys, box["error"])
            return res
        self._judge(got, probe)
        self._count_failures(got)
        return got

    async def _op(self, op: Op, keys: list[bytes], slots: list[int]) -> TransferResult:
        if op == "offload":
            return await self.tier.offload(keys, slots)
        if op == "load":
            return await self.tier.load(keys, slots)
        return await self.tier.remove(keys)

    def _fail_all(self, res: TransferResult, keys: list[bytes], exc: BaseException) -> None:
        for k in keys:
            res.failed[k] = exc
        self.counts["failed"] += len(keys)
        self.failures[failure_kind(exc)] += len(keys)

    def _judge(self, got: TransferResult, probe: bool) -> None:
        """Tell the breaker: any answer (a success, a miss, a bad copy) means reachable."""
        unreachable = sum(1 for e in got.failed.values() if failure_kind(e) in _UNREACHABLE)
        if unreachable and unreachable == got.total:
            self.breaker.failure(probe)
        elif got.total:
            self.breaker.success(probe)
        else:
            self.breaker.neutral(probe)

    def snapshot(self) -> TierStats:
        """The tier's own stats, with the chain's figures for it added to ``extra``. A tier whose
        ``stats()`` raises stands in with its last good figures (zeros before any), marked
        :data:`~asynctier.stats.STATS_FAILED`: the chain's sums stay whole (zeros read as a
        counter reset to an exporter), and the exporter leaves the tier itself out."""
        try:
            s = self.tier.stats()
        except Exception:  # a tier whose stats fail must not take the chain's down
            log.exception("stats() of chain tier %r failed", self.name)
            s = self._last_stats or _empty(self.tier)
            return dataclasses.replace(s, extra={**self._with_chain_figures(s), STATS_FAILED: 1})
        self._last_stats = s
        return dataclasses.replace(s, extra=self._with_chain_figures(s))

    def _with_chain_figures(self, s: TierStats) -> dict[str, Any]:
        """``s.extra`` and the chain's own figures for this tier (current: the chain keeps them)."""
        extra = dict(s.extra)
        for k, v in self.counts.items():
            extra[f"chain_{k}"] = v
        extra["chain_backlog"] = self.backlog
        extra["chain_background_in_flight"] = self.background_in_flight
        extra["chain_breaker_opened"] = self.breaker.opened
        extra["chain_breaker_fast_failed"] = self.breaker.fast_failed
        extra["chain_breaker_open"] = int(self.breaker.state != "closed")
        for kind, n in self.failures.items():
            extra[f"chain_failures_{kind}"] = n
        return extra


def _empty(tier: SecondaryTierManager) -> TierStats:
    from asynctier.stats import LatencySummary

    return TierStats(
        getattr(tier, "tier_type", "?"), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, dict.fromkeys(FAILURE_KINDS, 0), 0,
        None, None, None, LatencySummary(), LatencySummary(), {},
    )  # fmt: skip
