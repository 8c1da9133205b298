"""The obj tier's configuration: the standard environment, secrets kept out of every text, and
bad values refused at construction.
"""

from __future__ import annotations

import socket
import sys
import traceback
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from s3_helpers import BUCKET, FAST_FAULTS, Rig, env, keys, kinds, moto, on_asyncio_only, s3_config

from asynctier.errors import failure_kind


def kinds_of(errors: list[BaseException]) -> set[str]:
    return {failure_kind(e) for e in errors}


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


def _refused_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _all_text(exc: BaseException) -> str:
    """What a caller or a log can show of an exception: str, repr and the whole traceback."""
    return " ".join([str(exc), repr(exc), "".join(traceback.format_exception(exc))])


@on_asyncio_only
async def test_no_text_shows_user_info_or_query_strings(caplog: pytest.LogCaptureFixture) -> None:
    """An endpoint with user info (``http://user:PASS@host:port``) and a URL with a query
    string: neither the user info nor the query shows in any text the tier produces (per-chunk
    errors, the client's wrapped errors, tracebacks, config errors, repr, stats, logs). The
    endpoint's user info used to appear verbatim in every per-chunk error, and a URL without
    ``//`` was echoed whole, query string and all, in its TierConfigError."""
    from asynctier import TierConfigError

    tag = uuid.uuid4().hex
    user, password, query = f"user{tag[:8]}", f"PASS{tag}", f"sig{tag}"
    shown: list[str] = []
    rig = Rig()
    for url in (
        f"s3:/{BUCKET}?sig={query}",
        f"s3:{user}:{password}@{BUCKET}/x",
        f"ftp://{user}:{password}@h/x?q={query}",
    ):
        with pytest.raises(TierConfigError) as info:
            rig.tier({"type": "obj", "url": url})
        shown.append(_all_text(info.value))
    endpoint = f"http://{user}:{password}@127.0.0.1:{_refused_port()}"
    caplog.set_level("DEBUG")
    bad_client = s3_config(endpoint=endpoint, client_options={"allow_http": True, "timeout": "soon"})
    with pytest.raises(TierConfigError) as info:
        async with rig.tier(bad_client):
            pass
    shown.append(_all_text(info.value))
    cfg = s3_config(endpoint=endpoint, capacity_bytes=1 << 30, **FAST_FAULTS)  # capacity: a listing at open
    cfg["url"] += f"?sig={query}"
    tier = rig.tier(cfg)
    async with tier:
        ks = keys(2)
        failed = [*(await tier.offload(ks, [0, 1])).failed.values(), *(await tier.load(ks, [2, 3])).failed.values()]
        assert len(failed) == 4 and kinds_of(failed) <= {"unavailable", "io"}, failed
        assert await tier.lookup(ks) == [False, False]
        shown += [_all_text(e) for e in failed]
        shown += [repr(tier), str(tier), str(tier.stats()), tier.url]
    shown += [r.getMessage() for r in caplog.records] + [caplog.text]
    assert any("127.0.0.1" in t for t in shown)  # the texts are there, only the secrets are not
    for text in shown:
        for secret in (password, query, f"{user}:", f"{user}@"):
            assert secret not in text, text


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


async def test_file_urls_need_an_absolute_directory_other_than_the_root(tmp_path: Path) -> None:
    """``file://`` resolved to the file system root (chunks were written under /), and a
    relative ``file://dir`` was refused only at open() by a parse error from inside the
    client. Both are refused at construction, with the root in any spelling; a directory
    that does not exist yet is created (with its parents) by open()."""
    from asynctier import TierConfigError

    rig = Rig()
    for url, why in (
        ("file://", "absolute directory"),
        ("file://relative/dir", "absolute directory"),
        ("file://host/tmp/x", "absolute directory"),
        ("file:///", "root"),
        ("file:////", "root"),
        ("file:///tmp/..", "root"),
        (f"file://{tmp_path}/x?y=1", "query"),
    ):
        with pytest.raises(TierConfigError, match=why):
            rig.tier({"type": "obj", "url": url})
    where = tmp_path / "not" / "there" / "yet"
    tier = rig.tier({"type": "obj", "url": f"file://{where}"})
    assert not where.exists()  # the constructor does no I/O
    async with tier:
        assert where.is_dir()
        assert (await tier.offload(keys(1), [0])).ok
