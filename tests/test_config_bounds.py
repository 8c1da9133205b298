"""Values of the right type but out of any sensible range are refused at construction, naming
the parameter and its bounds; before, they failed later with errors that named nothing (an
``OverflowError`` at the first store, ``ENOMEM``) or were taken as they were."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest

from asynctier import OffloadingSpec, SecondaryTierFactory, TierConfigError

SPEC = OffloadingSpec(4096, 4, namespace="test/config-bounds")
MEMORY = {"type": "memory", "capacity_bytes": 1 << 20}
FS = {"type": "fs", "root": "/nonexistent/kv"}


def chain(**kw: Any) -> dict[str, Any]:
    return {"type": "chain", "tiers": [MEMORY, FS], **kw}


def build(config: dict[str, Any]) -> Any:
    return SecondaryTierFactory.create_secondary_tier(config, memoryview(bytearray(SPEC.total_bytes)), SPEC)


@pytest.mark.parametrize(
    ("config", "said"),
    [
        # every other duration is bounded by a day (inf, or milliseconds taken for seconds)
        ({**MEMORY, "backpressure_timeout_s": 1e300}, "backpressure_timeout_s must be a number of seconds"),
        ({**FS, "backpressure_timeout_s": 86401}, "backpressure_timeout_s must be a number of seconds"),
        (chain(backpressure_timeout_s=1e300), "backpressure_timeout_s must be a number of seconds"),
        (
            {"type": "chain", "tiers": [{**MEMORY, "deadline_s": 1e300}, FS]},
            "deadline_s must be a number of seconds",
        ),
        (
            {"type": "chain", "tiers": [{**MEMORY, "breaker": {"cooldown_s": 1e300}}, FS]},
            "cooldown_s must be a number of seconds",
        ),
        # max_inflight is at most 1024 on every tier: the chain allocated a staging slot for each
        (chain(max_inflight=5000), "max_inflight must be an int from 1 to 1024"),
        (chain(max_inflight=10**30), "max_inflight must be an int from 1 to 1024"),
        (chain(backlog_chunks=2**63), "backlog_chunks must be an int from 0 to"),
        # a bare OverflowError at every multipart store
        ({"type": "obj", "url": "memory://", "part_concurrency": 2**64}, "part_concurrency must be an int from 1"),
    ],
)
def test_out_of_range_values_are_refused_naming_the_parameter(config: dict[str, Any], said: str) -> None:
    with pytest.raises(TierConfigError, match=said):
        build(config)


def test_a_chain_staging_buffer_that_cannot_be_allocated_is_a_config_error() -> None:
    """Under an address-space limit the staging buffer's mmap fails: the error names the two
    parameters that size it, not a bare ``OSError: [Errno 12]``."""
    script = textwrap.dedent(
        """
        import resource
        from asynctier import OffloadingSpec, SecondaryTierFactory, TierConfigError
        spec = OffloadingSpec(2 << 20, 4, namespace="t")
        view = memoryview(bytearray(spec.total_bytes))
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        cfg = {"type": "chain", "backlog_chunks": 8192,
               "tiers": [{"type": "memory", "capacity_bytes": 1 << 30}, {"type": "fs", "root": "/nonexistent/kv"}]}
        try:
            SecondaryTierFactory.create_secondary_tier(cfg, view, spec)
        except TierConfigError as e:
            print("refused:", e)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "refused:" in out.stdout, out.stdout + out.stderr
    assert "backlog_chunks" in out.stdout and "max_inflight" in out.stdout
