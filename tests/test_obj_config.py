"""The obj tier's configuration: the standard environment, secrets kept out of every text, and
bad values refused at construction.
"""

from __future__ import annotations

import datetime
import socket
import sys
import traceback
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from obstore.store import MemoryStore
from s3_helpers import BUCKET, FAST_FAULTS, Rig, env, keys, kinds, moto, on_asyncio_only, s3_config

from asynctier.errors import TierConfigError, failure_kind


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
        f"s3://{BUCKET}/x?sig={query}",  # a query is refused: not shown in the refusal either
        f"s3://{user}:{password}@{BUCKET}/x",
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


@pytest.mark.parametrize(
    ("url", "where", "options"),
    [
        ("s3://b/p", "config", {"allow_http": True}),  # a client option among the store keys: a panic
        ("s3://b/p", "credentials", {"timeout": "5s"}),
        ("s3://b/p", "config", {"AWS_ALLOW_HTTP": True}),
        ("gs://b/p", "config", {"allow_http": True}),
        ("az://account/c/p", "config", {"timeout": "5s"}),
        ("s3://b/p", "config", {"nonsense": "x"}),  # unknown: refused only at open() before
        ("gs://b/p", "credentials", {"access_key_id": "x"}),  # an S3 key on GCS
        ("s3://b/p", "client_options", {"access_key_id": "x"}),
        ("s3://b/p", "client_options", {"nonsense": "x"}),
    ],
)
def test_option_keys_are_checked_at_construction(url: str, where: str, options: dict[str, object]) -> None:
    """Keys are checked against the keys obstore documents for the store and its client. A
    client option (``allow_http``, ``timeout``) among the store keys made obstore panic when
    the store was built: pyo3's PanicException (a BaseException) out of open(), and a Rust
    panic printed; an unknown key failed only at open()."""
    from asynctier import TierConfigError

    with pytest.raises(TierConfigError, match=rf"{where}\[") as info:
        Rig().tier({"type": "obj", "url": url, where: options})
    if where != "client_options" and "nonsense" not in options and "access_key_id" not in options:
        assert "client_options" in str(info.value)  # it says where the key belongs


async def test_documented_spellings_of_store_keys_are_accepted() -> None:
    """A store key as its field name or its environment variable, in any case."""
    rig = Rig()
    cfg = s3_config(config={"AWS_DEFAULT_REGION": "us-east-1", "virtual_hosted_style_request": False})
    cfg["credentials"] = {"AWS_ACCESS_KEY_ID": "akid", "Secret_Access_Key": "secret"}
    async with rig.tier(cfg) as tier:
        ks = keys(1)
        assert (await tier.offload(ks, [0])).ok
        assert (await tier.load(ks, [1])).ok and rig.chunk(1) == rig.orig_chunk(0)


def test_the_key_tables_match_the_obstore_stubs() -> None:
    """The tier's key tables are the keys obstore's stubs document, with the environment
    variables named in their docs, and its bool store keys those typed ``bool`` (checked
    against the obstore installed; its typed dicts cannot be imported at run time)."""
    import ast
    import re

    import obstore

    from asynctier.tiers.obj.store_keys import BOOL_STORE_KEYS, CLIENT_KEYS, STORE_KEYS

    stubs = Path(obstore.__file__).parent / "_store"
    if not stubs.is_dir():
        pytest.skip("this obstore ships no stubs")
    bools: set[str] = set()

    def documented(file: str, cls: str) -> dict[str, tuple[str, ...]]:
        tree = ast.parse((stubs / file).read_text())
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
        out = {}
        for i, st in enumerate(body):
            if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                doc = body[i + 1] if i + 1 < len(body) else None
                text = doc.value.value if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) else ""
                out[st.target.id] = tuple(dict.fromkeys(re.findall(r"`([A-Z][A-Z0-9_]+)`", str(text))))
                if cls != "ClientConfig" and ast.unparse(st.annotation) == "bool":
                    bools.add(st.target.id)
        return out

    assert STORE_KEYS["S3"][1] == documented("_aws.pyi", "S3Config")
    assert STORE_KEYS["GCS"][1] == documented("_gcs.pyi", "GCSConfig")
    assert STORE_KEYS["Azure"][1] == documented("_azure.pyi", "AzureConfig")
    assert set(CLIENT_KEYS) == set(documented("_client.pyi", "ClientConfig"))
    assert bools == BOOL_STORE_KEYS


def test_a_panic_of_the_client_building_the_store_is_a_config_error() -> None:
    """Any panic inside obstore while the store is built (here a client option among the
    store keys, past the checks) comes out of open() as a TierConfigError, not as pyo3's
    PanicException."""
    from asynctier import TierConfigError
    from asynctier.tiers.obj.params import Deadlines
    from asynctier.tiers.obj.store import StoreOptions
    from asynctier.tiers.obj.url import parse_url

    deadlines = Deadlines.parse(30.0, None, 3, None, 0.05, 2.0)
    unchecked = StoreOptions(parse_url("s3://b/p", store_given=False), deadlines, config={"allow_http": True})
    with pytest.raises(TierConfigError, match="cannot build the store"):
        unchecked.build(str)


async def test_a_panic_of_the_client_in_a_request_fails_the_key() -> None:
    """A panic inside obstore during a request (here: ranges past the end of an object, which
    obstore 0.12 answers with a panic) fails that key with an I/O error and leaves the
    breaker closed; it used to escape as pyo3's PanicException, a BaseException."""
    import obstore

    from asynctier.errors import ChunkError

    rig = Rig()
    tier = rig.tier({"type": "obj", "url": "memory://", "breaker_threshold": 1})
    async with tier:
        ks = keys(1)
        assert (await tier.offload(ks, [0])).ok
        st, path = tier._st(), tier._path(ks[0])
        size = len(obstore.get(st, path).bytes())
        with pytest.raises(ChunkError) as info, tier._guarded(ks[0]):
            obstore.get_ranges(st, path, starts=[0, size + 2], lengths=[5, 100])
        assert failure_kind(info.value) == "io" and "client failed" in str(info.value)
        assert tier.breaker_state == "closed"
        assert (await tier.load(ks, [1])).ok


_S3 = {"url": "s3://b/p"}
_MEM = {"url": "memory://"}


def test_the_tiers_deadlines_win_over_the_environment_and_client_options_over_both() -> None:
    """``timeout_s`` and ``connect_timeout_s`` are what the tier's errors and exit guard assume:
    an ``AWS_TIMEOUT`` in the environment had replaced them (a 1 s deadline became 600 s);
    ``client_options`` still override both, and the environment's other options still apply."""
    with env(AWS_TIMEOUT="600s", AWS_CONNECT_TIMEOUT="300s", AWS_USER_AGENT="from-env"):
        tier = Rig().tier({"type": "obj", **_S3, "timeout_s": 1.0, "connect_timeout_s": 0.5})
        opts = tier._options.client_config()  # type: ignore[attr-defined]
        assert opts["timeout"] == datetime.timedelta(seconds=1) and opts["user_agent"] == "from-env"
        assert opts["connect_timeout"] == datetime.timedelta(seconds=0.5)
        tier = Rig().tier({"type": "obj", **_S3, "timeout_s": 1.0, "client_options": {"timeout": "7s"}})
        assert tier._options.client_config()["timeout"] == "7s"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("config", "says"),
    [
        # nonsense refused at construction (it used to fail each chunk, or open(), later)
        ({**_MEM, "store": "junk"}, r"store must be an obstore store .*MemoryStore"),
        ({**_MEM, "store": {}}, r"store must be an obstore store"),
        ({"url": "file:///tmp/a\0b"}, r"url .*NUL"),
        ({"url": "s3://b/p\0"}, r"url .*NUL"),
        ({**_S3, "endpoint": "http://h\0:9"}, r"endpoint .*NUL"),
        ({**_S3, "config": {"sts_endpoint": "http://h/\0"}}, r"config\['sts_endpoint'\] .*NUL"),
        ({**_S3, "endpoint": 5}, r"endpoint must be a str"),
        ({**_S3, "region": True}, r"region must be a str"),
        ({**_MEM, "endpoint": "http://h:9"}, r"endpoint does not apply to a memory:// store"),
        ({"url": "file:///tmp/x", "credentials": {"access_key_id": "a"}}, r"credentials does not apply to a file://"),
        ({**_MEM, "store": MemoryStore(), "client_options": {"allow_http": True}}, r"client_options does not apply"),
        # option values of the wrong type, named with what is accepted
        ({**_S3, "client_options": {"allow_http": "yes"}}, r"client_options\['allow_http'\] must be True or False"),
        ({**_S3, "client_options": {"allow_http": 1}}, r"client_options\['allow_http'\] must be True or False"),
        ({**_S3, "config": {"skip_signature": "true"}}, r"config\['skip_signature'\] must be True or False"),
        ({**_S3, "client_options": {"timeout": 5}}, r"client_options\['timeout'\] must be a datetime.timedelta"),
        # once refused only at open() (or by a panic inside obstore at each request)
        ({**_S3, "endpoint": ""}, r"endpoint must be an absolute http:// or https:// URL"),
        ({**_S3, "endpoint": "127.0.0.1:9000"}, r"endpoint must be an absolute http:// or https:// URL"),
        ({**_S3, "region": ""}, r"region must be a non-empty str"),
        ({**_S3, "client_options": {"timeout": datetime.timedelta(seconds=-1)}}, r"timeout'\] must be a .*>= 0"),
        ({**_S3, "client_options": {"timeout": "abc"}}, r"client_options\['timeout'\] must be .*duration string"),
        ({**_S3, "client_options": {"connect_timeout": "-5s"}}, r"connect_timeout'\] must be .*duration string"),
        ({**_S3, "client_options": {"default_headers": {"a": "b\0"}}}, r"default_headers'\] must be a dict .*NUL"),
        ({**_S3, "client_options": {"default_headers": {"a b": "c"}}}, r"default_headers'\] must be a dict"),
        # every request has a deadline: None or 0 had meant obstore's own (and an over-large one
        # was blamed on retry_timeout_s, which defaults to it)
        ({**_MEM, "timeout_s": None}, r"timeout_s must be a number of seconds > 0 .*; got None"),
        ({**_MEM, "timeout_s": 0}, r"timeout_s must be a number of seconds > 0"),
        ({**_MEM, "timeout_s": 1e9}, r"^timeout_s must be a number of seconds > 0 and <= 86400; got 1000000000.0"),
        ({**_S3, "client_options": {"pool_max_idle_per_host": True}}, r"pool_max_idle_per_host'\] must be an int"),
        ({**_S3, "client_options": {"default_headers": {"a": 1}}}, r"default_headers'\] must be a dict"),
        ({**_S3, "config": {"region": 5}}, r"config\['region'\] must be a str"),
        ({**_S3, "credentials": {"access_key_id": b"akid"}}, r"credentials\['access_key_id'\] must be a str"),
        ({**_S3, "config": {"request_payer": 1}}, r"request_payer'\] must be True, False or"),
        # the tier's own numbers: an int is an int (not a bool), a duration a number (not a bool)
        ({**_MEM, "part_concurrency": True}, r"part_concurrency must be an int"),
        ({**_MEM, "part_size": float(8 << 20)}, r"part_size must be an int"),
        ({**_MEM, "max_retries": False}, r"max_retries must be an int"),
        ({**_MEM, "breaker_threshold": 2.0}, r"breaker_threshold must be an int"),
        ({**_MEM, "lookup_cache_entries": True}, r"lookup_cache_entries must be an int"),
        ({**_MEM, "breaker_cooldown_s": True}, r"breaker_cooldown_s must be a number"),
        ({**_MEM, "lookup_ttl_s": "10"}, r"lookup_ttl_s must be a number"),
        ({**_MEM, "timeout_s": True}, r"timeout_s must be"),
        ({**_MEM, "verify": 1}, r"verify must be True or False"),
        ({**_MEM, "max_inflight": True}, r"max_inflight must be"),
        # accepted, then every request went astray (or the path was dropped, or open() failed)
        ({**_S3, "endpoint": "http://127.0.0.1:9000/?x=1"}, r"endpoint takes no query string or fragment"),
        ({**_S3, "endpoint": "http://127.0.0.1:9000/#f"}, r"endpoint takes no query string or fragment"),
        ({"url": "file:///tmp/dir?"}, r"a file:// url takes no query or fragment"),
        ({"url": "file:///tmp/dir#"}, r"a file:// url takes no query or fragment"),
        ({"url": "memory://bucket/prefix"}, r"a memory:// url takes nothing after the scheme"),
        ({**_S3, "client_options": {"pool_max_idle_per_host": "\u0663"}}, r"pool_max_idle_per_host"),
    ],
)
def test_wrong_types_and_nonsense_are_refused_at_construction(config: dict[str, object], says: str) -> None:
    """Every bool option takes a real bool, every int a real int (not a bool), strings are
    strings without NUL, ``store`` is an obstore store, and options a store cannot use are
    refused: each at construction, with a TierConfigError naming what is accepted."""
    from asynctier import TierConfigError

    with pytest.raises(TierConfigError, match=says):
        Rig().tier({"type": "obj", **config})


async def test_accepted_option_values_reach_the_store() -> None:
    """The types the checks accept open and work against a real server (moto)."""
    import datetime

    rig = Rig()
    client = {
        "allow_http": True,
        "timeout": datetime.timedelta(seconds=20),
        "connect_timeout": "5s",
        "pool_max_idle_per_host": 4,
        "default_headers": {"x-test": "1"},
        "user_agent": "asynctier-test",
    }
    cfg = s3_config(client_options=client, config={"virtual_hosted_style_request": False, "request_payer": False})
    async with rig.tier(cfg) as tier:
        ks = keys(1)
        assert (await tier.offload(ks, [0])).ok
        assert (await tier.load(ks, [1])).ok and rig.chunk(1) == rig.orig_chunk(0)


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("s3://bucket/kv?versionId=1", "with a query"),
        ("s3://bucket/kv#frag", "with a fragment"),
        ("gs://bucket/kv?x", "with a query"),
        ("s3://user:pw@bucket/kv", "with user info"),
        ("s3://bucket:9000/kv", "with a port"),
        ("s3://bucket/kv ", "whitespace"),
        ("s3://bucket/k\tv", "whitespace"),
        ("s3://", "needs a bucket"),
        ("s3:///kv", "needs a bucket"),
        ("az://container//kv", "empty segment"),
    ],
)
def test_cloud_url_parts_the_client_would_drop_are_refused(url: str, said: str) -> None:
    """The client reads the bucket and the prefix and dropped the rest without a word: the
    objects went under another prefix than the one given."""
    from asynctier import TierConfigError

    with pytest.raises(TierConfigError, match=said):
        Rig().tier({"type": "obj", "url": url})


def test_cloud_urls_the_client_reads_whole_are_accepted() -> None:
    for url in (
        "s3://bucket",
        "s3://bucket/",
        "s3a://bucket/a/b/",
        "gs://b/p",
        "abfss://c@acct.dfs.core.windows.net/p",
    ):
        assert Rig().tier({"type": "obj", "url": url}).url


@on_asyncio_only
async def test_a_bucket_that_does_not_exist_is_said_so() -> None:
    """A PUT answered NoSuchBucket failed as not_found, "no chunk stored under key ...", the
    bucket named only in a capacity-listing warning at open."""
    rig = Rig()
    config = {**s3_config(), "url": "s3://no-such-bucket-at-all/kv"}
    tier = rig.tier(config)
    async with tier:
        res = await tier.offload(keys(2), [0, 1])
        assert kinds(res) == {"io"}, res.failed
        assert all("the bucket does not exist" in str(e) for e in res.failed.values())
    with pytest.raises(TierConfigError, match="the bucket does not exist"):
        async with rig.tier({**config, "capacity_bytes": 1 << 30}):  # its listing at open said so
            pass


def test_the_scrubber_masks_header_secrets_and_leaves_short_values_and_containers_readable() -> None:
    """An API key sent as a default header came back unmasked in a gateway's error body; a
    one-letter secret turned every such letter of a message into ***; an Azure container's
    name (the user info of abfs://container@account) was masked as if it were a password."""
    from asynctier.tiers.obj.redact import Scrubber

    scrub = Scrubber.for_store(
        ["abfs://sending@account.dfs.core.windows.net/cache"],
        {"secret_access_key": "s"},
        {},
        {"default_headers": {"x-api-key": "gw-apikey-5f1c0ffee", "accept": "application/xml",
                             "Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.tok"}},
        None,
    ).scrub  # fmt: skip
    assert scrub("401: token eyJhbGciOiJIUzI1NiJ9.tok expired") == "401: token *** expired"
    as_bytes = Scrubber.for_store([], {}, {}, {"default_headers": {"Authorization": b"Bearer\tbytes-tok-123"}}, None)
    assert as_bytes.scrub("401 for bytes-tok-123") == "401 for ***"  # bytes values, any whitespace
    assert (
        scrub("403: x-api-key=gw-apikey-5f1c0ffee accept=application/xml")
        == "403: x-api-key=*** accept=application/xml"
    )
    assert (
        scrub("error sending request to /sending/cache, secret s")
        == "error sending request to /sending/cache, secret ***"
    )
