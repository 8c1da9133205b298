"""The obj tier's configuration: the standard environment, secrets kept out of every text, and
bad values refused at construction.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from s3_helpers import BUCKET, FAST_FAULTS, Rig, env, keys, kinds, moto, on_asyncio_only, s3_config


async def test_standard_env_configuration_keeps_allow_http_with_client_options() -> None:
    ep = moto().endpoint
    secret = "env-secret-" + uuid.uuid4().hex
    rig = Rig()
    # obstore alone drops AWS_ALLOW_HTTP once client_options are given (the trap); the tier
    # always passes client options (its deadline) and adds explicit ones here too
    with env(
        AWS_ENDPOINT=ep,
        AWS_ACCESS_KEY_ID="env-akid",
        AWS_SECRET_ACCESS_KEY=secret,
        AWS_REGION="us-east-1",
        AWS_ALLOW_HTTP="true",
    ):
        tier = rig.tier(
            {"type": "obj", "url": f"s3://{BUCKET}/env-{uuid.uuid4().hex[:8]}", "client_options": {"user_agent": "t"}}
        )
        async with tier:
            ks = keys(2)
            assert (await tier.offload(ks, [0, 1])).ok
            rig.zero()
            assert (await tier.load(ks, [2, 3])).ok
            assert rig.chunk(2) == rig.orig_chunk(0)
            assert secret not in repr(tier) and secret not in str(tier.stats())


@on_asyncio_only
async def test_credentials_never_in_reprs_errors_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    secret = "explicit-secret-" + uuid.uuid4().hex
    rig = Rig()
    cfg = s3_config(endpoint="http://127.0.0.1:9", **FAST_FAULTS)  # nothing listens on port 9
    cfg["credentials"] = {"access_key_id": "akid-" + secret, "secret_access_key": secret}
    cfg["url"] += "?sas=" + secret
    caplog.set_level("DEBUG")
    tier = rig.tier(cfg)
    async with tier:
        res = await tier.offload(keys(2), [0, 1])
        assert not res.ok
        text = " ".join(
            [repr(tier), str(tier.stats()), *map(str, res.failed.values()), *map(repr, res.failed.values())]
        )
        text += caplog.text
        assert secret not in text
        assert kinds(res) == {"unavailable"}


async def test_config_errors_raise_at_construction(tmp_path: Path) -> None:
    from asynctier import TierConfigError

    rig = Rig()
    for bad in (
        {"url": "ftp://host/x"},
        {"url": "memory://", "part_size": 0},
        {"url": "s3://bucket/prefix", "part_size": 1 << 20},
        {"url": "memory://", "timeout_s": -1},
        {"url": "memory://", "client_options": "allow_http"},
        {"url": "memory://", "durability": "fsync"},
        {"url": "memory://", "nonsense": 1},
        # refused only at open(), or never (a breaker that never closes), before
        {"url": "memory://", "retry_timeout_s": float("inf")},
        {"url": "memory://", "retry_backoff_s": float("inf")},
        {"url": "memory://", "connect_timeout_s": float("inf")},
        {"url": "memory://", "retry_max_backoff_s": 1e300},
        {"url": "memory://", "breaker_cooldown_s": float("inf")},
        {"url": "memory://", "lookup_ttl_s": float("nan")},
        {"url": "memory://", "max_retries": 10**30},
    ):
        with pytest.raises((TierConfigError, TypeError)):
            rig.tier({"type": "obj", **bad})
