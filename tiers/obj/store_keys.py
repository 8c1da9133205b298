"""The option keys obstore documents for each store and for its HTTP client, and their checks.

obstore's ``S3Config``, ``GCSConfig``, ``AzureConfig`` and ``ClientConfig`` (typed dicts in its
stubs, not importable at run time) list the keys; each store key may also be spelled as its
environment variable (``AWS_REGION`` for ``region``), in any case. A client key placed among
the store keys makes obstore 0.12 panic when the store is built (a ``BaseException`` out of
``open()`` and a Rust panic on stderr), and an unknown key fails only then: both are refused
here, at construction. ``tests/test_obj_config.py`` checks these tables against the stubs of
the obstore installed.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable, Mapping
from typing import NoReturn

from asynctier.errors import TierConfigError

__all__ = [
    "BOOL_STORE_KEYS",
    "CLIENT_KEYS",
    "CLIENT_KINDS",
    "STORE_KEYS",
    "check_client_options",
    "check_store_options",
    "check_str",
    "store_kind",
]

# key -> the environment variables that also name it (any case)
_S3: dict[str, tuple[str, ...]] = {
    "access_key_id": ("AWS_ACCESS_KEY_ID",),
    "aws_endpoint_url_s3": ("AWS_ENDPOINT_URL_S3",),
    "bucket": ("AWS_BUCKET", "AWS_BUCKET_NAME"),
    "checksum_algorithm": ("AWS_CHECKSUM_ALGORITHM",),
    "conditional_put": ("AWS_CONDITIONAL_PUT",),
    "container_credentials_relative_uri": ("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",),
    "container_credentials_full_uri": ("AWS_CONTAINER_CREDENTIALS_FULL_URI",),
    "container_authorization_token_file": ("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",),
    "copy_if_not_exists": ("AWS_COPY_IF_NOT_EXISTS",),
    "default_region": ("AWS_DEFAULT_REGION",),
    "disable_tagging": ("AWS_DISABLE_TAGGING",),
    "disable_bulk_delete": ("AWS_DISABLE_BULK_DELETE",),
    "endpoint": ("AWS_ENDPOINT", "AWS_ENDPOINT_URL"),
    "imdsv1_fallback": ("AWS_IMDSV1_FALLBACK",),
    "metadata_endpoint": ("AWS_METADATA_ENDPOINT",),
    "region": ("AWS_REGION",),
    "request_payer": ("AWS_REQUEST_PAYER",),
    "role_arn": ("AWS_ROLE_ARN",),
    "role_session_name": ("AWS_ROLE_SESSION_NAME",),
    "s3_express": ("AWS_S3_EXPRESS",),
    "secret_access_key": ("AWS_SECRET_ACCESS_KEY",),
    "server_side_encryption": ("AWS_SERVER_SIDE_ENCRYPTION",),
    "session_token": ("AWS_SESSION_TOKEN", "AWS_TOKEN"),
    "skip_signature": ("AWS_SKIP_SIGNATURE",),
    "sse_bucket_key_enabled": ("AWS_SSE_BUCKET_KEY_ENABLED",),
    "sse_customer_key_base64": ("AWS_SSE_CUSTOMER_KEY_BASE64",),
    "sse_kms_key_id": ("AWS_SSE_KMS_KEY_ID",),
    "sts_endpoint": ("AWS_STS_ENDPOINT",),
    "unsigned_payload": ("AWS_UNSIGNED_PAYLOAD",),
    "virtual_hosted_style_request": ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST",),
    "web_identity_token_file": ("AWS_WEB_IDENTITY_TOKEN_FILE",),
}
_GCS: dict[str, tuple[str, ...]] = {
    "service_account": ("GOOGLE_SERVICE_ACCOUNT", "GOOGLE_SERVICE_ACCOUNT_PATH"),
    "service_account_key": ("GOOGLE_SERVICE_ACCOUNT_KEY",),
    "base_url": ("GOOGLE_BASE_URL",),
    "bearer_token": ("GOOGLE_BEARER_TOKEN",),
    "bucket": ("GOOGLE_BUCKET", "GOOGLE_BUCKET_NAME"),
    "application_credentials": ("GOOGLE_APPLICATION_CREDENTIALS",),
    "skip_signature": ("GOOGLE_SKIP_SIGNATURE",),
}
_AZURE: dict[str, tuple[str, ...]] = {
    "account_name": ("AZURE_STORAGE_ACCOUNT_NAME",),
    "account_key": ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY", "AZURE_STORAGE_MASTER_KEY"),
    "client_id": ("AZURE_STORAGE_CLIENT_ID", "AZURE_CLIENT_ID"),
    "client_secret": ("AZURE_STORAGE_CLIENT_SECRET", "AZURE_CLIENT_SECRET"),
    "credential_type": ("AZURE_CREDENTIAL_TYPE",),
    "tenant_id": ("AZURE_STORAGE_TENANT_ID", "AZURE_STORAGE_AUTHORITY_ID", "AZURE_TENANT_ID", "AZURE_AUTHORITY_ID"),
    "authority_host": ("AZURE_STORAGE_AUTHORITY_HOST", "AZURE_AUTHORITY_HOST"),
    "sas_key": ("AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_SAS_TOKEN"),
    "token": ("AZURE_STORAGE_TOKEN",),
    "use_emulator": ("AZURE_STORAGE_USE_EMULATOR",),
    "use_fabric_endpoint": (),
    "encryption_key": ("AZURE_ENCRYPTION_KEY",),
    "endpoint": ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT"),
    "msi_endpoint": ("AZURE_MSI_ENDPOINT", "AZURE_IDENTITY_ENDPOINT"),
    "object_id": ("AZURE_OBJECT_ID",),
    "msi_resource_id": ("AZURE_MSI_RESOURCE_ID",),
    "federated_token_file": ("AZURE_FEDERATED_TOKEN_FILE",),
    "use_azure_cli": ("AZURE_USE_AZURE_CLI",),
    "skip_signature": ("AZURE_SKIP_SIGNATURE",),
    "container_name": ("AZURE_CONTAINER_NAME",),
    "disable_tagging": ("AZURE_DISABLE_TAGGING",),
    "fabric_token_service_url": ("AZURE_FABRIC_TOKEN_SERVICE_URL",),
    "fabric_workload_host": ("AZURE_FABRIC_WORKLOAD_HOST",),
    "fabric_session_token": ("AZURE_FABRIC_SESSION_TOKEN",),
    "fabric_cluster_identifier": ("AZURE_FABRIC_CLUSTER_IDENTIFIER",),
}
#: store kind -> (environment prefix, documented keys)
STORE_KEYS: dict[str, tuple[str, dict[str, tuple[str, ...]]]] = {
    "S3": ("AWS_", _S3),
    "GCS": ("GOOGLE_", _GCS),
    "Azure": ("AZURE_", _AZURE),
}
#: obstore ``ClientConfig`` keys.
CLIENT_KEYS = (
    "allow_http",
    "allow_invalid_certificates",
    "connect_timeout",
    "default_content_type",
    "default_headers",
    "http1_only",
    "http2_keep_alive_interval",
    "http2_keep_alive_timeout",
    "http2_keep_alive_while_idle",
    "http2_only",
    "pool_idle_timeout",
    "pool_max_idle_per_host",
    "proxy_url",
    "proxy_ca_certificate",
    "proxy_excludes",
    "root_certificate",
    "randomize_addresses",
    "read_timeout",
    "timeout",
    "user_agent",
)
#: Store keys whose value is a bool (every other store key takes a str).
BOOL_STORE_KEYS = frozenset(
    {
        "disable_bulk_delete",
        "disable_tagging",
        "imdsv1_fallback",
        "s3_express",
        "skip_signature",
        "sse_bucket_key_enabled",
        "unsigned_payload",
        "use_azure_cli",
        "use_emulator",
        "use_fabric_endpoint",
        "virtual_hosted_style_request",
    }
)
#: What each client option takes (obstore types ``http2_keep_alive_while_idle`` as a str; it
#: is a switch, and obstore takes a bool for it).
CLIENT_KINDS = {
    "allow_http": "bool",
    "allow_invalid_certificates": "bool",
    "connect_timeout": "duration",
    "default_content_type": "str",
    "default_headers": "headers",
    "http1_only": "bool",
    "http2_keep_alive_interval": "duration",
    "http2_keep_alive_timeout": "duration",
    "http2_keep_alive_while_idle": "bool",
    "http2_only": "bool",
    "pool_idle_timeout": "duration",
    "pool_max_idle_per_host": "count",
    "proxy_url": "str",
    "proxy_ca_certificate": "str",
    "proxy_excludes": "str",
    "root_certificate": "pem",
    "randomize_addresses": "bool",
    "read_timeout": "duration",
    "timeout": "duration",
    "user_agent": "str",
}
_ACCEPTED = {
    "bool": "True or False",
    "str": "a str",
    "payer": "True, False or 'requester'",
    "duration": "a datetime.timedelta >= 0 or a duration string such as '30s' or '1m 30s'",
    "count": "an int >= 0 (or a str of digits)",
    "headers": "a dict of header names (str) to str or bytes values without CR, LF or NUL",
    "pem": "a str or bytes (PEM)",
}
_SCHEME_KIND = {"s3": "S3", "s3a": "S3", "gs": "GCS"}


def store_kind(scheme: str) -> str:
    """``S3``, ``GCS`` or ``Azure`` for a cloud URL scheme (every other cloud scheme is Azure's)."""
    return _SCHEME_KIND.get(scheme, "Azure")


def _spellings(kind: str) -> dict[str, str]:
    """Every accepted spelling of a store key, lower case -> the key."""
    keys = STORE_KEYS[kind][1]
    out: dict[str, str] = {}
    for key, envs in keys.items():
        for spelling in (key, *envs):
            out[spelling.lower()] = key
    return out


def _as_client_key(name: str, prefix: str) -> str | None:
    low = name.lower()
    low = low.removeprefix(prefix.lower())
    return low if low in CLIENT_KEYS else None


def _documented_key(kind: str, name: object, what: str) -> str:
    """The documented key a given key of ``what`` (``config``, ``credentials``) spells."""
    if not isinstance(name, str):
        raise TierConfigError(f"{what} keys must be str; got {type(name).__name__}")
    key = _spellings(kind).get(name.lower())
    if key is not None:
        return key
    client = _as_client_key(name, STORE_KEYS[kind][0])
    if client is not None:
        raise TierConfigError(
            f"{what}[{name!r}] is an HTTP client option, not a {kind} store key: "
            f"pass it in client_options as {client!r}"
        )
    accepted = ", ".join(sorted(STORE_KEYS[kind][1]))
    raise TierConfigError(f"{what}[{name!r}] is not a {kind} store key; accepted: {accepted}")


def check_str(what: str, value: object) -> str:
    """A str without NUL (which no URL, path or header may hold)."""
    if not isinstance(value, str):
        raise TierConfigError(f"{what} must be a str; got {type(value).__name__}")
    if "\0" in value:
        raise TierConfigError(f"{what} must not contain NUL")
    return value


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # an HTTP header name (RFC 9110 token)
# a duration as obstore reads one (humantime): numbers, each with its unit
_DURATION = re.compile(
    r"\s*(?:\d+(?:\.\d+)?\s*(?:nsec|ns|usec|us|µs|msec|ms|seconds?|secs?|s|minutes?|mins?|m|hours?|hrs?|h"
    r"|days?|d|weeks?|w|months?|M|years?|y)\s*)+"
)


def _header_value(v: object) -> bool:
    if isinstance(v, bytes):
        v = v.decode("latin-1")
    return isinstance(v, str) and not any(c in v for c in "\r\n\0")


def _headers(value: object) -> bool:
    return isinstance(value, Mapping) and all(
        isinstance(k, str) and _TOKEN.fullmatch(k) is not None and _header_value(v) for k, v in value.items()
    )


#: Kinds that also take a str, and the test of every other value of each kind.
_TAKES_STR = frozenset({"str", "payer", "duration", "count", "pem"})
_OTHER_VALUES: dict[str, Callable[[object], bool]] = {
    "bool": lambda v: isinstance(v, bool),
    "payer": lambda v: isinstance(v, bool),
    "duration": lambda v: isinstance(v, datetime.timedelta) and v >= datetime.timedelta(0),
    "count": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
    "headers": _headers,
    "pem": lambda v: isinstance(v, bytes),
}


def _check_value(what: str, kind: str, value: object) -> object:
    """``value`` as obstore takes it, or a TierConfigError naming what is accepted (the value
    itself is never shown: it may be a secret)."""
    if isinstance(value, str) and kind in _TAKES_STR:
        if (kind == "count" and not (value.isascii() and value.isdigit())) or (
            kind == "duration" and not _DURATION.fullmatch(value)
        ):
            _refuse(what, kind, value)
        return check_str(what, value)
    test = _OTHER_VALUES.get(kind)
    if test is None or not test(value):
        _refuse(what, kind, value)
    return str(value) if kind == "count" else value  # obstore reads a count from a str only


def _refuse(what: str, kind: str, value: object) -> NoReturn:
    raise TierConfigError(f"{what} must be {_ACCEPTED[kind]}; got {type(value).__name__}")


def check_store_options(kind: str, options: Mapping[object, object], what: str) -> dict[str, object]:
    """``options`` (the tier's ``config`` or ``credentials``) checked against the keys and
    value types obstore documents for a ``kind`` store."""
    out: dict[str, object] = {}
    for name, value in options.items():
        key = _documented_key(kind, name, what)
        vkind = "bool" if key in BOOL_STORE_KEYS else "payer" if key == "request_payer" else "str"
        out[str(name)] = _check_value(f"{what}[{name!r}]", vkind, value)
    return out


def check_client_options(options: Mapping[object, object]) -> dict[str, object]:
    """``client_options`` checked against obstore's ``ClientConfig`` keys and value types."""
    out: dict[str, object] = {}
    for name, value in options.items():
        if not isinstance(name, str) or name not in CLIENT_KINDS:
            raise TierConfigError(
                f"client_options[{name!r:.60}] is not an HTTP client option; accepted: {', '.join(CLIENT_KEYS)}"
            )
        out[name] = _check_value(f"client_options[{name!r}]", CLIENT_KINDS[name], value)
    return out
