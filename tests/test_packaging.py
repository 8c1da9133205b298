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


def test_the_native_extension_is_optional_and_inside_the_engines_package() -> None:
    (ext,) = CONFIG["ext-modules"]
    assert ext["name"] == "asynctier.engines._nativeio" and ext["optional"] is True
    assert all((ROOT / f).exists() for f in ext["sources"] + ext["depends"])
