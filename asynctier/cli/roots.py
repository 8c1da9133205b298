"""Where a command may create the directories and files a tier lives in.

One rule, stated in each command's ``--help``: ``selfcheck`` and ``bench --root`` create a
missing root only when its parent exists (a typo deep in a path is said, not built);
``fsck`` never creates anything (a check that made an empty root would report it "clean").
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import TierConfigError
from .tierfile import nested_configs

__all__ = ["check_creatable", "check_exists", "local_places", "usable_directory"]

#: Config keys that name a place on the local file system (and ``url`` when it is file://).
_PLACE_KEYS = ("root", "path", "paths", "url")


def local_places(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(key, path)`` for every local place a tier config names (root, path, paths, file:// url)."""
    out: list[tuple[str, str]] = []
    for key in _PLACE_KEYS:
        value = config.get(key)
        for where in value if isinstance(value, list) else [value]:
            if key == "url":
                if isinstance(where, str) and where.startswith("file://"):
                    out.append((key, where[len("file://") :]))
            elif isinstance(where, (str, os.PathLike)):
                out.append((key, os.fspath(where)))
    return out


def check_creatable(where: str, config: Mapping[str, Any], *, placeholders: bool = False) -> None:
    """Refuse a config whose missing root could only be made by creating its parents too (a
    chain's members too). ``placeholders``: a place under ``{dir}`` is the command's own,
    made for it (bench's tier files), not checked."""
    for key, place in (kp for cfg in nested_configs(config) for kp in local_places(cfg)):
        if os.path.exists(place) or (placeholders and "{dir}" in place):
            continue
        parent = os.path.dirname(os.path.abspath(place))
        if not os.path.isdir(parent):
            raise TierConfigError(
                f"{where} {key}: {place!r} does not exist and neither does its parent {parent!r}; "
                "only a root whose parent exists is created (make the parent first)"
            )


def check_exists(where: str, config: Mapping[str, Any]) -> None:
    """A check creates nothing: a mistyped ``root``/``path``/``url`` is said, not made."""
    for key, place in local_places(config):
        if not os.path.exists(place):
            raise TierConfigError(f"{where} {key}: {place!r} does not exist: nothing to check")


def usable_directory(path: str) -> Path:
    """``path`` as a directory the command can create files in, made if only it was missing.

    Raises ``TierConfigError`` saying why not (a file, a parent that is missing, a file
    system such as /proc or /sys that takes no new directories, no permission).
    """
    p = Path(path)
    created = False
    if not p.exists():
        if not p.absolute().parent.is_dir():
            raise TierConfigError(
                f"{path!r} does not exist and neither does its parent; only a directory whose parent "
                "exists is created (make the parent first)"
            )
        try:
            p.mkdir()
        except OSError as e:
            raise TierConfigError(f"cannot create {path!r}: {e.strerror or e}") from None
        created = True
    elif not p.is_dir():
        raise TierConfigError(f"{path!r} is not a directory")
    try:  # the real test: root passes access() on /proc, and mkdir there still fails
        probe = tempfile.mkdtemp(prefix=".asynctier-probe-", dir=p)
    except OSError as e:
        if created:
            shutil.rmtree(p, ignore_errors=True)
        raise TierConfigError(f"cannot create files in {path!r}: {e.strerror or e}") from None
    os.rmdir(probe)
    return p
