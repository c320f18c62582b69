"""docs/claims.md names, for every promise of the docs, tests that exist (pure: the test files are parsed
with ``ast``, never imported), and every link to a claim from a page points at one."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLAIMS = ROOT / "docs" / "claims.md"
HEADING = re.compile(r"^### (C\d+)$", re.MULTILINE)
# tests/, and the contract suite that ships in the package (celery_fence/testing/contract)
NAMED = re.compile(r"`((?:tests|celery_fence/testing)/[\w/]+\.py)::([\w:]+)`")
LINK = re.compile(r"claims\.md#(c\d+)")


def claims() -> dict[str, str]:
    """Claim number -> its text (up to the next heading)."""
    text = CLAIMS.read_text()
    marks = list(HEADING.finditer(text))
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return {m.group(1): text[m.end() : end] for m, end in zip(marks, ends, strict=True)}


@cache
def defined(path: str) -> frozenset[str]:
    """The top-level functions, classes and assigned names of a test file, and ``Class::method``."""
    names: set[str] = set()
    for node in ast.parse((ROOT / path).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{m.name}" for m in node.body if isinstance(m, ast.FunctionDef)}
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return frozenset(names)


def test_the_claims_are_numbered_in_order_from_c1() -> None:
    numbers = list(claims())
    assert numbers, "docs/claims.md has no claims"
    assert numbers == [f"C{i}" for i in range(1, len(numbers) + 1)]


def test_every_claim_names_a_test() -> None:
    bare = [number for number, text in claims().items() if not NAMED.search(text)]
    assert bare == [], f"claims that name no test: {bare}"


def test_every_named_test_exists() -> None:
    missing = []
    for number, text in claims().items():
        for path, name in NAMED.findall(text):
            if not (ROOT / path).is_file():
                missing.append(f"{number}: {path} (no such file)")
            elif name not in defined(path):
                missing.append(f"{number}: {path}::{name}")
    assert missing == [], "docs/claims.md names tests that do not exist:\n" + "\n".join(missing)


def test_every_link_to_a_claim_points_at_one() -> None:
    known = {number.lower() for number in claims()}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    dangling = [
        f"{page.relative_to(ROOT)}: #{anchor}"
        for page in pages
        for anchor in LINK.findall(page.read_text())
        if anchor not in known
    ]
    assert dangling == []


def test_the_guarantee_pages_link_to_their_claims() -> None:
    for name in (
        "README.md",
        "docs/guarantees.md",
        "docs/stores.md",
        "docs/configuration.md",
        "docs/operating.md",
        "docs/canvas.md",
    ):
        assert LINK.search((ROOT / name).read_text()), f"{name} links to no claim in docs/claims.md"
