"""Every relative link in the project's Markdown leads somewhere: the file exists, and an
``#anchor`` names one of its headings (as GitHub makes them: lower case, punctuation dropped,
spaces as hyphens, a repeated heading numbered)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted(
    [REPO / "README.md", REPO / "bench" / "README.md", *REPO.glob("docs/**/*.md"), *REPO.glob("bench/results/*.md")]
)
_FENCED = re.compile(r"^```.*?^```", re.M | re.S)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(text: str) -> set[str]:
    """The anchors of ``text``'s headings."""
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#+ (.*)$", _FENCED.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_anchors_are_made_as_github_makes_them() -> None:
    assert anchors("# Issue 28: where (2026-12-07, 04:00 UTC)\n## A b\n## A b\n```\n# not a heading\n```\n") == {
        "issue-28-where-2026-12-07-0400-utc",
        "a-b",
        "a-b-1",
    }


def test_relative_links_lead_somewhere() -> None:
    broken = []
    for page in PAGES:
        text = page.read_text()
        for link in _LINK.findall(_FENCED.sub("", text)):
            if re.match(r"[a-z]+:", link):  # http:, https:, mailto:
                continue
            path, _, anchor = link.partition("#")
            target = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(REPO)}: {link}"
            if not target.exists():
                broken.append(f"{where}: no such file")
            elif anchor and target.suffix == ".md" and anchor not in anchors(target.read_text()):
                broken.append(f"{where}: no such heading")
    assert not broken, broken
