"""Every relative link in README.md and docs/*.md points to a file that exists (pure: no network)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")  # [text](target "title")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
CODE = re.compile(r"`[^`\n]*`")


def relative_links(page: Path) -> list[str]:
    text = CODE.sub("", FENCE.sub("", page.read_text()))  # links inside code are not links
    targets = [m.group(1) for m in LINK.finditer(text)]
    return [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def test_the_pages_have_links_to_check() -> None:
    assert (ROOT / "docs" / "index.md") in PAGES
    assert relative_links(ROOT / "docs" / "index.md")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    missing = []
    for target in relative_links(page):
        path = target.split("#", 1)[0]
        if not (page.parent / path).resolve().exists():
            missing.append(target)
    assert missing == [], f"{page.relative_to(ROOT)} links to missing files: {missing}"
