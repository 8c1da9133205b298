"""The wheel's contents: every package of the source tree is listed in pyproject.toml, and the
tiers install inside the asynctier namespace (no top-level ``tiers`` in site-packages)."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _packages_under(folder: Path, dotted: str) -> set[str]:
    return {
        ".".join([dotted, *init.parent.relative_to(folder).parts])
        for init in folder.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }


def test_every_package_is_listed_and_tiers_live_in_the_asynctier_namespace() -> None:
    expected = _packages_under(ROOT / "asynctier", "asynctier") | _packages_under(ROOT / "tiers", "asynctier.tiers")
    assert set(CONFIG["packages"]) == expected
    assert CONFIG["package-dir"] == {"asynctier.tiers": "tiers"}
    assert not any(p == "tiers" or p.startswith("tiers.") for p in CONFIG["packages"])


def test_the_native_extensions_are_optional_and_where_their_python_twins_look() -> None:
    """Both build only where a C compiler is: the install goes on without them (the native
    engine then says why it is unavailable; key names fall back to the Python encoder)."""
    exts = {ext["name"]: ext for ext in CONFIG["ext-modules"]}
    assert set(exts) == {"asynctier.engines._nativeio", "asynctier._speedups"}
    for ext in exts.values():
        assert ext["optional"] is True
        assert all((ROOT / f).exists() for f in ext["sources"] + ext.get("depends", []))
    assert (ROOT / "asynctier" / "_speedups.pyi").exists()  # its types, for mypy and editors
