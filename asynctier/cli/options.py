"""Options and parsing shared by the commands: sizes, lists, ``--param``, ``--path``, the loop."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import click

from .sizes import parse_size

__all__ = [
    "csv_callback",
    "import_path_option",
    "listed",
    "parse_params",
    "positive_int",
    "run_async",
    "size_callback",
]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop when installed (what servers use), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)
    result: T = uvloop.run(coro)
    return result


def size_callback(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """A click callback for one size (``128M``)."""
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


def csv_callback(
    kind: str, parse: Callable[[str], int]
) -> Callable[[click.Context, click.Parameter, str | None], list[int] | None]:
    """A click callback parsing a comma-separated list of positive ints (sizes or depths)."""

    def cb(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
        if value is None:
            return None
        try:
            out = [parse(v) for v in value.split(",") if v.strip()]
        except ValueError as e:
            raise click.BadParameter(str(e)) from None
        if not out or any(v <= 0 for v in out):
            raise click.BadParameter(f"expected a comma-separated list of positive {kind}")
        return out

    return cb


def positive_int(v: Any) -> int:
    """An int written as an int or a string (a depth); bools and other types are refused."""
    if isinstance(v, bool) or not isinstance(v, (int, str)):
        raise ValueError(f"not an int: {v!r}")
    return int(v)


def listed(key: str, value: Any, parse: Callable[[Any], int]) -> list[int]:
    """A ``[bench]`` list (or comma-separated string) of positive ints, checked as its option is."""
    items = [v for v in value.split(",") if v.strip()] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError(f"[bench] {key} must be a list or a comma-separated string; got {value!r}")
    try:
        out = [parse(v) for v in items]
    except (ValueError, TypeError) as e:
        raise ValueError(f"[bench] {key}: {e}") from None
    if not out or any(v <= 0 for v in out):
        raise ValueError(f"[bench] {key} must hold positive values; got {value!r}")
    return out


def parse_params(items: tuple[str, ...]) -> dict[str, Any]:
    """``--param KEY=VALUE`` items as a dict: VALUE read as JSON when it parses, else as a string."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected KEY=VALUE; got {item!r}", param_hint="--param")
        try:
            out[key.strip()] = json.loads(raw)
        except ValueError:
            out[key.strip()] = raw
    return out


def json_hint(config: Any, error: str) -> str:
    """A note for an ``error`` that quotes a Python spelling among a config's ``--param``
    values ("True", "None"): they are read as JSON, where those are strings."""
    if isinstance(config, dict):
        return next((h for v in config.values() if (h := json_hint(v, error))), "")
    if isinstance(config, list):
        return next((h for v in config if (h := json_hint(v, error))), "")
    if config in ("True", "False", "None") and repr(config) in error:
        return f" (--param values are read as JSON: true, false, null; {config!r} is a string there)"
    return ""


def _add_import_paths(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    for d in reversed(value):
        sys.path.insert(0, os.path.abspath(d))
    return value


def import_path_option(f: F) -> F:
    """``--path DIR`` (repeatable): where an out-of-tree tier's ``module_path`` may also be found.

    Configs name code to import, so no directory is searched unless the user names it: the
    current directory is not on the import path (``python -m asynctier.cli`` takes it off).
    """
    return click.option(
        "--path",
        "import_paths",
        multiple=True,
        metavar="DIR",
        type=click.Path(exists=True, file_okay=False),
        callback=_add_import_paths,
        expose_value=False,
        is_eager=True,
        help="Also import out-of-tree tier modules (module_path) from DIR (repeatable); the current "
        "directory is searched only when named, e.g. --path .",
    )(f)
