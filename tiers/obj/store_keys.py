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

from collections.abc import Mapping

from asynctier.errors import TierConfigError

__all__ = ["CLIENT_KEYS", "STORE_KEYS", "check_client_keys", "check_store_keys", "store_kind"]

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


def check_store_keys(kind: str, options: Mapping[object, object], what: str) -> dict[str, str]:
    """Refuse keys of ``options`` (the tier's ``config`` or ``credentials``) that are not
    documented keys of a ``kind`` store; return each given key -> the documented key."""
    spellings = _spellings(kind)
    prefix = STORE_KEYS[kind][0]
    out: dict[str, str] = {}
    for name in options:
        if not isinstance(name, str):
            raise TierConfigError(f"{what} keys must be str; got {name!r:.60}")
        key = spellings.get(name.lower())
        if key is not None:
            out[name] = key
        elif (client := _as_client_key(name, prefix)) is not None:
            raise TierConfigError(
                f"{what}[{name!r}] is an HTTP client option, not a {kind} store key: pass it in client_options "
                f"as {client!r}"
            )
        else:
            accepted = ", ".join(sorted(STORE_KEYS[kind][1]))
            raise TierConfigError(f"{what}[{name!r}] is not a {kind} store key; accepted: {accepted}")
    return out


def check_client_keys(options: Mapping[object, object]) -> None:
    """Refuse keys of ``client_options`` that obstore's ``ClientConfig`` does not have."""
    for name in options:
        if name not in CLIENT_KEYS:
            raise TierConfigError(
                f"client_options[{name!r:.60}] is not an HTTP client option; accepted: {', '.join(CLIENT_KEYS)}"
            )
