"""The conformance suite every tier passes — built-in or out-of-tree.

Use it from a pytest module of your own::

    from asynctier.testing import TierConformance

    class TestMyTier(TierConformance):
        def tier_config(self, tmp_path):
            return {"type": "MyTier", "module_path": "mypackage.mytier", "root": str(tmp_path)}

Every check builds the tier through :class:`~asynctier.SecondaryTierFactory` from that
config (plus ``max_inflight`` and the knobs a check needs) and runs once per event loop in
the class attribute ``backends``: by default ``("asyncio", "uvloop", "trio")`` — the stock
asyncio loop, asyncio on uvloop, and trio; the test ids name it (``test_round_trip[trio]``).
A backend whose package is not installed is skipped. The checks need only pytest: each starts
its own loop with :func:`anyio.run`, with or without pytest-asyncio, pytest-trio or anyio's
plugin. To run on the loops you care about, narrow the attribute::

    class TestMyTier(TierConformance):
        backends = ("asyncio", "uvloop")  # an asyncio-only client library

or pick some at the command line: ``pytest -k "trio"``, ``pytest -k "not uvloop"``. One check
(``task.cancel()``, asyncio's own way to cancel) runs on asyncio and uvloop only.

Override the class attributes to fit the medium (``chunk_bytes``, ``num_chunks``,
``max_inflight``, ``page_aligned_buffer``). :class:`TierConformance` is six groups of checks,
each a class of its own to subclass alone where that is all a test needs:
:class:`ContractChecks`, :class:`MediumChecks` (what stays on the medium: removal, capacity,
the listing, a reopen, two layouts, the caller's buffer after close), :class:`ConcurrencyChecks`,
:class:`CancellationChecks` (cancel scopes, ``move_on_after`` / ``fail_after`` deadlines and
``task.cancel()``: on a fast medium the I/O an interruption finds running ends before the caller
could see it, so run these on a slow one too), :class:`IntegrityChecks` and
:class:`HardeningChecks`.

Hardening checks run once per class (on asyncio where the class has it): they are about the
tier, not the loop. Every parameter the factory accepts (what ``asynctier info`` lists) must
refuse a value of the wrong type (an ``object()``, and by its annotation an int for a bool,
a bool or a float for an int, ...) with TierConfigError, TypeError or ValueError at
construction or ``open()``; name a parameter that takes any object by design in the class
attribute ``skip_parameters = {"name": "why"}``. A tier that keeps chunks under file names
gives ``def chunk_path(self, h, key)`` (the file of a stored chunk): a FIFO put there must fail
that key's load, never block it. A tier that takes a credential gives ``def credential(self,
tmp_path)``, returning config overrides that carry a secret and the secret's text: it must
not show in ``repr``, ``str``, ``stats()``, any error or any log record. Without these hooks
those two checks are skipped, saying why.

Integrity checks damage a stored chunk and require the load to fail that key with
:class:`~asynctier.errors.IntegrityError` (counted as a checksum failure), never delivering
wrong bytes, while the other keys load; the bad copy must then be gone (``lookup`` says so, a
second load fails) and the key storable again. They damage chunks through
two hooks, ``async def corrupt_stored(self, h, key, how)`` (``how``: ``"flip"`` one payload
byte, or ``"truncate"`` the stored chunk) and ``async def swap_stored(self, h, key_a, key_b)``
(each key then holds the other's bytes), where ``h`` is the check's :class:`Harness`
(``h.tier`` is the open tier). A tier that lets the base class frame its chunks
(``frames_own_bytes = False`` on :class:`~asynctier.BlockingChunkTier` or
:class:`~asynctier.AsyncChunkTier`) needs nothing: the default hooks rewrite its records
through its own ``read_chunk`` / ``write_chunk`` (its ``read_chunk`` must report a stored
record shorter than the buffer it fills with an IntegrityError, as examples/dir_tier.py
does: only the tier knows how much it read). A tier that frames its own bytes must
override both hooks, damaging the chunk on its medium; until it does, those checks fail
saying so.
"""

from __future__ import annotations

from .backends import BACKENDS, loop_factories, run_on_backend
from .checks_cancellation import CancellationChecks
from .checks_concurrency import ConcurrencyChecks
from .checks_contract import ContractChecks
from .checks_hardening import HardeningChecks
from .checks_integrity import IntegrityChecks
from .checks_medium import MediumChecks
from .conformance import TierConformance
from .harness import Harness, new_keys

__all__ = [
    "BACKENDS",
    "CancellationChecks",
    "ConcurrencyChecks",
    "ContractChecks",
    "HardeningChecks",
    "Harness",
    "IntegrityChecks",
    "MediumChecks",
    "TierConformance",
    "loop_factories",
    "new_keys",
    "run_on_backend",
]
