"""``chain``: several tiers as one tier, fastest first (docs/tiers/chain.md).

Modules: :mod:`.config` (the configuration, checked), :mod:`.admission` (which chunks each
tier takes), :mod:`.staging` (the chain's own buffer every tier reads and writes),
:mod:`.member` (one tier with its breaker, deadline and counters), :mod:`.background`
(write-back and promotion lanes, the removal fence), :mod:`.transfers` (a call's batches down
and up the tiers), :mod:`.demotion` (the victim cache) and
:mod:`.tier` (:class:`ChainTier`).
"""

from __future__ import annotations

from .admission import AdmissionPolicy, AdmitAll, FilterPolicy, NotAdmittedError, SecondHit
from .tier import ChainTier

__all__ = ["AdmissionPolicy", "AdmitAll", "ChainTier", "FilterPolicy", "NotAdmittedError", "SecondHit"]
