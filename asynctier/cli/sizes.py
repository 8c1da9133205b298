"""Byte sizes as people type them (``256K``, ``2MiB``, ``1.5G``): one parser for every option,
``--param`` value and tier-file entry of the command line."""

from __future__ import annotations

import re
from decimal import Decimal

__all__ = ["GiB", "KiB", "MiB", "format_size", "looks_like_size", "parse_size", "short_size"]

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": KiB, "m": MiB, "g": GiB, "t": GiB << 10}


def looks_like_size(text: str) -> bool:
    """Whether ``text`` is written as a size (digits and an optional binary unit)."""
    return _SIZE_RE.match(text) is not None


def parse_size(text: str | int, *, allow_zero: bool = False) -> int:
    """Parse ``"256K"``, ``"2MiB"``, ``"1.5G"``, ``"4096"`` (binary units) into bytes.

    An int is returned as it is. Raises ``ValueError`` for anything else (a float too, which
    a TOML file gives for ``4096.5``), for a size that is not a whole number of bytes
    (``"1.9"``; ``"1.5K"`` is), and for one that is not positive (zero is accepted with
    ``allow_zero``).
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif not isinstance(text, str):
        raise ValueError(f"a size is an int or a string such as '256K'; got {type(text).__name__} {text!r}")
    else:
        m = _SIZE_RE.match(text)
        if not m:
            raise ValueError(f"not a size: {text!r} (examples: 256K, 2MiB, 1G, 4096)")
        exact = Decimal(m.group(1)) * _UNITS[m.group(2).lower()]
        if exact != exact.to_integral_value():
            raise ValueError(f"{text!r} is not a whole number of bytes (examples: 4096, 1.5K)")
        value = int(exact)
    if value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"size must be positive; got {text!r}")
    return value


def format_size(n: int) -> str:
    """``262144`` -> ``"256 KiB"``; ``1572864`` -> ``"1.5 MiB"``."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def short_size(n: int) -> str:
    """``262144`` -> ``"256K"``: a size as it is typed on the command line."""
    return format_size(n).replace(" ", "").replace("iB", "")
