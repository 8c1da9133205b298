"""The conformance suite as one class to subclass (see :mod:`asynctier.testing`)."""

from __future__ import annotations

from .checks_cancellation import CancellationChecks
from .checks_concurrency import ConcurrencyChecks
from .checks_contract import ContractChecks
from .checks_hardening import HardeningChecks
from .checks_integrity import IntegrityChecks
from .checks_medium import MediumChecks

__all__ = ["TierConformance"]


class TierConformance(
    HardeningChecks, IntegrityChecks, MediumChecks, CancellationChecks, ConcurrencyChecks, ContractChecks
):
    """Subclass and implement :meth:`tier_config`; pytest collects the ``test_*`` checks (the
    contract first: pytest takes the bases last to first), each
    once per backend in :attr:`backends`."""
