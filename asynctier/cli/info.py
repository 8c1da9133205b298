"""``asynctier info``: the registered tiers, where each comes from, and its parameters; and
whether the optional C parts were built (an install without a C compiler goes on without them)."""

from __future__ import annotations

import inspect
import json
from typing import Any

import click

from ..factory import SecondaryTierFactory, TierInfo, accepted_parameters

__all__ = ["info"]


def describe(tier: TierInfo) -> dict[str, Any]:
    """One tier type as ``info`` shows it: class, source, parameters with defaults, first doc line."""
    out: dict[str, Any] = {
        "type": tier.tier_type,
        "class": f"{tier.module_path}.{tier.class_name}",
        "source": tier.source,
    }
    try:
        cls = SecondaryTierFactory.get_tier_class({"type": tier.tier_type})
    except Exception as e:  # a tier whose module or client library is missing
        out["error"] = str(e)
        return out
    params = {}
    for name, p in sorted(accepted_parameters(cls).items()):
        params[name] = "required" if p.default is inspect.Parameter.empty else repr(p.default)
    out["parameters"] = params
    out["doc"] = (inspect.getdoc(cls) or "").split("\n")[0]
    return out


def native_parts() -> list[tuple[str, str]]:
    """Each optional C part and whether it serves here (else why not, and what serves instead)."""
    from ..engines import native
    from ..engines.speedups import speedups

    problem = native.problem()
    workers = "built" if problem is None else f"not available ({problem}): the tiers run on threads"
    if speedups() is not None:
        twins = "built"
    else:
        try:
            import asynctier._speedups  # noqa: F401
        except ImportError:
            why = "not built"
        else:
            why = "built, but no XXH3_64bits is loaded to hash with"
        twins = f"{why}: their Python references serve"
    return [("native I/O workers", workers), ("C twins of per-chunk helpers", twins)]


_THP = {
    "always": "always: large buffers get them unasked",
    "madvise": "madvise: buffers from asynctier.buffers.allocate_buffer get them, others not",
    "never": "never: primary buffers stay on 4 KiB pages, and O_DIRECT requests in smaller pieces",
}


def huge_pages_line() -> tuple[str, str]:
    """Whether primary buffers can be on transparent huge pages here (docs/configuration.md)."""
    from ..buffers import transparent_huge_pages

    mode = transparent_huge_pages()
    state = "not reported by this system" if mode is None else _THP.get(mode, mode)
    return "transparent huge pages", f'{state} (docs/configuration.md, "Huge pages")'


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def info(as_json: bool) -> None:
    """List the registered tiers, where each comes from, and its parameters."""
    tiers = [describe(i) for i in SecondaryTierFactory.registered()]
    shadowed = SecondaryTierFactory.shadowed()
    for t in tiers:  # an installed package's entry point of a registered name: never used
        if t["type"] in shadowed:
            t["shadowed_entry_points"] = shadowed[t["type"]]
    if as_json:
        click.echo(json.dumps(tiers, indent=2))
        return
    from rich.table import Table
    from rich.text import Text

    from .console import output_console

    table = Table(title="asynctier tiers", show_lines=True)
    for col in ("type", "class", "source", "parameters (default)"):
        table.add_column(col, overflow="fold", no_wrap=col == "type")
    for t in tiers:
        params = t.get("error") or ", ".join(f"{k}={v}" for k, v in t["parameters"].items())
        table.add_row(*(Text(c) for c in (t["type"], t["class"], t["source"], params)))  # not markup: "[s3]"
    console = output_console()
    console.print(table)
    for kind, eps in shadowed.items():
        console.print(Text(f"entry point {kind!r} never used (the registered tier wins): {', '.join(eps)}"))
    for part, state in [*native_parts(), huge_pages_line()]:
        console.print(f"{part}: {state}", highlight=False)
