"""Every Markdown table in README.md and docs/*.md renders as one table (pure: the pages are read as text):
a header row, then its separator, then rows of as many cells as the header. A blank line inside a table
ends it, and the rows after it render as a paragraph of pipes; so does a row with a stray ``|``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+$")


def cells(row: str) -> int:
    """The cells of a table row: ``|`` separates them, except escaped (``\\|``) or inside a code span."""
    text = re.sub(r"`[^`]*`", "code", row.replace("\\|", ""))
    return text.strip().strip("|").count("|") + 1


def tables(page: Path) -> list[tuple[int, list[str]]]:
    """Each run of lines starting with ``|`` (code blocks blanked out), with its first line number."""
    text = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), page.read_text())
    found: list[tuple[int, list[str]]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|"):
            continue
        if found and found[-1][0] + len(found[-1][1]) == number:
            found[-1][1].append(line)
        else:
            found.append((number, [line]))
    return found


def problems(page: Path) -> list[str]:
    found = []
    for start, rows in tables(page):
        if len(rows) < 2 or not SEPARATOR.match(rows[1].strip()):
            found.append(f"line {start}: no header separator under the first row (a blank line cut a table?)")
            continue
        width = cells(rows[0])
        found += [
            f"line {start + i}: {cells(row)} cells, the header has {width}"
            for i, row in enumerate(rows)
            if cells(row) != width
        ]
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_table_renders_as_one(page: Path) -> None:
    found = problems(page)
    assert not found, f"{page.relative_to(ROOT)}: broken tables:\n" + "\n".join(found)


def test_a_blank_line_in_a_table_and_a_stray_pipe_are_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("| a | b |\n|---|---|\n| 1 | 2 |\n\n| 3 | 4 |\n\n| c | d |\n|---|---|\n| x | y | z |\n")
    assert problems(page) == [
        "line 5: no header separator under the first row (a blank line cut a table?)",
        "line 9: 3 cells, the header has 2",
    ]
