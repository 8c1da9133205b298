"""Tier configs as the command line reads them: TOML tier files, ``[spec]`` and ``[bench]``
tables, the bench placeholders (``{dir}``, ``"{capacity}"``), and the two rules every config
from the command line follows (sizes may be written as sizes; ``module_path`` is a module name).
"""

from __future__ import annotations

import copy
import importlib
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import TierConfigError
from ..spec import OffloadingSpec
from .sizes import looks_like_size, parse_size

__all__ = [
    "DEFAULT_TIERS",
    "TierFile",
    "load_tier_file",
    "nested_configs",
    "normalize_config",
    "redact",
    "resolve_tiers",
    "spec_from_table",
    "substitute",
    "type_default",
    "uses_dir",
    "uses_placeholders",
]

#: The embedded defaults: every point gets a fresh directory for ``{dir}``; ``"{capacity}"``
#: becomes a byte count that holds the point's chunks twice over.
DEFAULT_TIERS: dict[str, dict[str, Any]] = {
    "fs": {"type": "fs", "root": "{dir}"},
    "nvme": {"type": "nvme", "path": "{dir}/slab", "capacity_bytes": "{capacity}"},
    "obj": {"type": "obj", "url": "file://{dir}"},
}
#: Configs used for ``--tier TYPE`` when TYPE is not named in a config file. The chain: a
#: memory tier holding the point's chunks in front of an fs tier, with the chain's defaults.
_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    **DEFAULT_TIERS,
    "memory": {"type": "memory"},
    "chain": {
        "type": "chain",
        "tiers": [{"type": "memory", "capacity_bytes": "{capacity}"}, {"type": "fs", "root": "{dir}/fs"}],
    },
    "valkey": {"type": "valkey", "url": "{local_valkey}"},  # a server started for the run (cli/valkey_server.py)
}


def type_default(tier_type: str) -> dict[str, Any]:
    """The config ``--tier TYPE`` runs when no tier file names TYPE (a copy: nested ones too)."""
    return copy.deepcopy(_TYPE_DEFAULTS.get(tier_type, {"type": tier_type}))


def nested_configs(config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """``config`` and every tier config inside it (a chain's ``tiers``, at any depth), outermost first."""
    out: list[Mapping[str, Any]] = [config]
    inner = config.get("tiers")
    if isinstance(inner, list):
        for sub in inner:
            if isinstance(sub, Mapping):
                out += nested_configs(sub)
    return out


def _is_size_key(key: str) -> bool:
    # the naming rule of the built-in tiers: capacity_bytes, coalesce_bytes, part_size, ...
    return key.endswith(("_bytes", "_size"))


def normalize_config(where: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """A tier config from the command line made ready for the factory (the caller's is untouched).

    A string that reads as a size (``"64MiB"``) under a ``*_bytes`` or ``*_size`` key becomes
    its byte count, so ``--param capacity_bytes=64MiB`` and ``capacity_bytes = "64MiB"`` mean
    what ``--data-size 64M`` does. A ``module_path`` that looks like a file path is refused:
    it names a module, imported by the usual rules. Nested configs (a tier of tiers) follow
    the same rules. ``where`` names the config in messages (``[tiers.kv]``, ``--param``).
    """
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, str) and _is_size_key(key) and looks_like_size(value):
            try:
                value = parse_size(value, allow_zero=True)
            except ValueError as e:
                raise TierConfigError(f"{where} {key}: {e}") from e
        elif isinstance(value, Mapping):
            value = normalize_config(where, value)
        elif isinstance(value, list):
            value = [normalize_config(where, v) if isinstance(v, Mapping) else v for v in value]
        out[key] = value
    module_path = out.get("module_path")
    if isinstance(module_path, str) and ("/" in module_path or "\\" in module_path or module_path.endswith(".py")):
        stem = module_path.replace("\\", "/").rsplit("/", 1)[-1].removesuffix(".py")
        raise TierConfigError(
            f"{where} module_path {module_path!r} looks like a file path: module_path is a Python module "
            f"name, as in an import statement; write module_path={stem!r} and name the directory it is in "
            "with --path DIR (no directory is searched unless named: --path . for the current one)"
        )
    return out


@dataclass
class TierFile:
    """A parsed tier file: named tier configs, the layout (``[spec]``), bench defaults (``[bench]``)."""

    tiers: dict[str, dict[str, Any]]
    spec: dict[str, Any] = field(default_factory=dict)
    bench: dict[str, Any] = field(default_factory=dict)
    path: str = ""


def _toml_loads(text: str) -> dict[str, Any]:
    name = "tomllib" if sys.version_info >= (3, 11) else "tomli"  # tomllib is 3.11+
    try:
        toml: Any = importlib.import_module(name)
    except ImportError as e:  # pragma: no cover - 3.10 without the bench extra
        raise TierConfigError(
            "reading a tier file on Python 3.10 needs 'tomli' (pip install 'asynctier[bench]')"
        ) from e
    out: dict[str, Any] = toml.loads(text)
    return out


def load_tier_file(path: str | os.PathLike[str]) -> TierFile:
    """Read a TOML tier file.

    Either one table per tier under ``[tiers.NAME]`` (``type`` defaults to NAME), or a single
    tier given by top-level keys (``type = "fs"``, ``root = ...``). Optional tables: ``[spec]``
    (``chunk_bytes``, ``namespace``: the layout the chunks were written with, needed by fsck)
    and ``[bench]`` (``chunk_sizes``, ``depths``, ``data_size``). Every tier config goes
    through :func:`normalize_config`. Raises :class:`~asynctier.errors.TierConfigError` for a
    malformed file.
    """
    p = Path(path)
    try:
        raw = _toml_loads(p.read_text())
    except OSError as e:
        raise TierConfigError(f"cannot read tier file {str(p)!r}: {e}") from e
    except ValueError as e:  # tomllib.TOMLDecodeError is a ValueError
        raise TierConfigError(f"{p}: not valid TOML: {e}") from e
    spec = raw.pop("spec", {})
    bench = raw.pop("bench", {})
    if not isinstance(spec, dict) or not isinstance(bench, dict):
        raise TierConfigError(f"{p}: [spec] and [bench] must be tables")
    tiers: dict[str, dict[str, Any]] = {}
    table = raw.pop("tiers", None)
    if table is not None:
        if not isinstance(table, dict):
            raise TierConfigError(f"{p}: 'tiers' must be a table of [tiers.NAME] tables")
        for name, cfg in table.items():
            if not isinstance(cfg, dict):
                raise TierConfigError(f"{p}: [tiers.{name}] must be a table")
            tiers[name] = normalize_config(f"[tiers.{name}]", {"type": name, **cfg})
    if "type" in raw and tiers:
        raise TierConfigError(
            f"{p}: a top-level tier (type = {raw['type']!r}) and [tiers.NAME] tables in one file; give one "
            "tier at the top level, or every tier in its own [tiers.NAME] table"
        )
    if "type" in raw:
        tiers[str(raw["type"])] = normalize_config(f"{p}:", raw)
    elif raw:
        raise TierConfigError(
            f"{p}: unexpected top-level keys {sorted(raw)}; put tier configs in [tiers.NAME] tables "
            "or give a single tier with a top-level 'type'"
        )
    if not tiers:
        misplaced = sorted({"type", "module_path"} & set(spec))
        if misplaced:  # TOML puts every key after a [spec] header into [spec]
            raise TierConfigError(
                f"{p}: no tier configured, and [spec] holds {misplaced}: a single tier's keys go above the "
                "[spec] table (keys below a table header belong to that table), or in a [tiers.NAME] table"
            )
        raise TierConfigError(f"{p}: no tier configured (add a [tiers.NAME] table)")
    return TierFile(tiers=tiers, spec=dict(spec), bench=dict(bench), path=str(p))


def spec_from_table(table: Mapping[str, Any], *, default_namespace: str = "default") -> OffloadingSpec:
    """An :class:`OffloadingSpec` from a ``[spec]`` table (``chunk_bytes`` required)."""
    if "chunk_bytes" not in table:
        raise TierConfigError("the tier file's [spec] table needs 'chunk_bytes' (the chunk size the tier holds)")
    unknown = sorted(set(table) - {"chunk_bytes", "namespace", "num_chunks"})
    if unknown:
        raise TierConfigError(f"[spec]: unknown keys {unknown}; accepted: chunk_bytes, namespace, num_chunks")
    try:
        chunk = parse_size(table["chunk_bytes"])
    except ValueError as e:
        raise TierConfigError(f"[spec] chunk_bytes: {e}") from e
    num = table.get("num_chunks", 1)
    if isinstance(num, bool) or not isinstance(num, int):
        raise TierConfigError(f"[spec] num_chunks must be an int; got {num!r}")
    namespace = table.get("namespace", default_namespace)
    if not isinstance(namespace, str):
        raise TierConfigError(f"[spec] namespace must be a string; got {type(namespace).__name__} {namespace!r}")
    return OffloadingSpec(chunk, num, namespace)


def substitute(value: Any, mapping: Mapping[str, Any]) -> Any:
    """Replace ``{dir}`` in strings and the exact string ``"{capacity}"`` (an int) in a config."""
    if isinstance(value, str):
        if value == "{capacity}":
            return mapping["capacity"]
        return value.replace("{dir}", str(mapping["dir"]))
    if isinstance(value, dict):
        return {k: substitute(v, mapping) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, mapping) for v in value]
    return value


def resolve_tiers(names: Sequence[str], tier_file: TierFile | None) -> dict[str, dict[str, Any]]:
    """The tiers ``asynctier bench`` runs: ``names`` looked up in the tier file, else taken as
    tier types with their embedded default config; no names: every tier of the file, else
    :data:`DEFAULT_TIERS`."""
    available = dict(tier_file.tiers) if tier_file else {k: dict(v) for k, v in DEFAULT_TIERS.items()}
    if not names:
        return available
    return {n: dict(available[n]) if n in available else type_default(n) for n in names}


def uses_placeholders(config: Mapping[str, Any]) -> bool:
    """Whether a config holds bench placeholders (``{dir}``, ``"{capacity}"``)."""
    return uses_dir(dict(config)) or "{capacity}" in repr(dict(config))


def uses_dir(value: Any) -> bool:
    """Whether a config (or a value in it) holds the ``{dir}`` placeholder: a tier on local files."""
    if isinstance(value, str):
        return "{dir}" in value
    if isinstance(value, dict):
        return any(uses_dir(v) for v in value.values())
    if isinstance(value, list):
        return any(uses_dir(v) for v in value)
    return False


#: ``scheme://user:password@``: the user info of a URL (a valkey url's password), to the last
#: "@" (a password may hold "/" unencoded)
_URL_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)\S*@")


#: Names whose values are secrets: credentials, header names such as Authorization, Cookie and
#: x-api-key, encryption keys (``sse_customer_key_base64``); a name such as ``hash_key`` is
#: hidden too (better a name hidden than a secret shown), ``key_prefix`` (valkey's) is not
_SECRET_NAME = re.compile(
    r"secret|passw|pwd|(^|[_-])pass($|[_-])|token|credential|access_key|key_id|sas|authoriz|(^|[_-])auth($|[_-])|"
    r"cookie|signature|(^|[_-])key($|[_-](?!prefix$))|api[_-]?key",
    re.IGNORECASE,
)


def redact(config: Mapping[str, Any]) -> dict[str, Any]:
    """A config safe to print or store: values of secret-looking keys hidden, and the user
    info of URLs (``redis://:password@host``)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        if _SECRET_NAME.search(str(k)):
            out[k] = "***"
        else:
            out[k] = _redact_value(v)
    return out


def _redact_value(v: Any) -> Any:
    """:func:`redact` inside a value: nested configs (a chain's ``tiers`` list) too."""
    if isinstance(v, Mapping):
        return redact(v)
    if isinstance(v, (list, tuple)):
        return [_redact_value(x) for x in v]
    if isinstance(v, str):
        return _URL_USERINFO.sub(r"\1***@", v)
    return v
