"""The test tree keeps its shape: no module of it imports a test module or a conftest (shared support lives in
conftest fixtures, tests/support/ or tests/servers/); tests/contract, tests/stores/* and tests/run hold test
modules and their conftest only (the store harnesses are in tests/support/harnesses/, server processes in
tests/servers/). No two test modules share a file name, so a name found in a report, a claim or a traceback
points at one file.

Read from the source with ``ast``: every ``import`` and ``from ... import``, at any depth, relative ones
resolved.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

# What each folder of tests/ may import from the other folders (docs/architecture.md, "The test tree").
MAY_IMPORT = {
    "support": {"servers"},
    "servers": {"support"},
    "unit": {"support"},
    "contract": {"servers", "support"},
    "stores": {"servers", "support"},
    "run": {"support"},
    "integration": {"servers", "support"},
    "chaos": {"integration", "servers"},
    "simulation": {"support"},
    "django_app": {"support"},
    "mutation": set(),
}


def _name(path: Path, top: Path) -> str:
    parts = list(path.relative_to(top).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, top: Path = ROOT) -> Iterator[tuple[str, int]]:
    """``(dotted target, line)`` of each import in ``path`` (a module under ``top``); ``from x import y``
    yields ``x`` and ``x.y``."""
    name = _name(path, top)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[: len(package) - (node.level - 1)]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            yield base, node.lineno
            yield from ((f"{base}.{alias.name}", node.lineno) for alias in node.names)


def is_test_or_conftest(dotted: str) -> bool:
    last = dotted.rpartition(".")[2]
    return dotted.startswith("tests.") and (last.startswith("test_") or last == "conftest")


def imports_of_test_modules(top: Path = ROOT) -> list[str]:
    """``file:line -> module`` for each import of a test module or a conftest in ``top``/tests."""
    found = []
    for path in sorted((top / "tests").rglob("*.py")):
        for target, line in imported_modules(path, top):
            if is_test_or_conftest(target) and (top / (target.replace(".", "/") + ".py")).exists():
                found.append(f"{path.relative_to(top)}:{line} -> {target}")
    return found


def imports_across_folders(top: Path = ROOT) -> list[str]:
    """``file:line -> module`` for each import of another folder of ``top``/tests that ``MAY_IMPORT`` does
    not allow (a folder missing from it may import none)."""
    found = []
    for path in sorted((top / "tests").glob("*/**/*.py")):
        folder = path.relative_to(top / "tests").parts[0]
        for target, line in imported_modules(path, top):
            parts = target.split(".")
            other = parts[1] if len(parts) > 1 and parts[0] == "tests" else None
            if other not in (None, folder) and other not in MAY_IMPORT.get(folder, set()):
                found.append(f"{path.relative_to(top)}:{line} -> {target}")
    return found


def helper_modules(directory: Path) -> set[str]:
    """The modules of ``directory`` that are neither a test module, a conftest nor its ``__init__``."""
    names = {path.stem for path in directory.glob("*.py")}
    return {name for name in names if not name.startswith("test_") and name not in ("conftest", "__init__")}


def shared_test_module_names(top: Path = ROOT) -> dict[str, list[str]]:
    """Each test module file name used more than once under ``top``/tests (and ``top``/example_app/tests),
    with the paths that use it."""
    paths: dict[str, list[str]] = {}
    for tree in (top / "tests", top / "example_app" / "tests"):
        for path in sorted(tree.rglob("test_*.py")):
            paths.setdefault(path.name, []).append(str(path.relative_to(top)))
    return {name: found for name, found in paths.items() if len(found) > 1}


def test_no_module_of_the_test_tree_imports_a_test_module_or_a_conftest() -> None:
    assert imports_of_test_modules() == []


def test_an_import_of_a_test_module_or_a_conftest_is_found(tmp_path: Path) -> None:
    tree = tmp_path / "tests" / "layer"
    tree.mkdir(parents=True)
    for name in ("__init__.py", "conftest.py", "support.py"):
        (tree / name).write_text("")
    (tree / "test_b.py").write_text("Gates = object\n")
    (tree / "test_a.py").write_text(
        "from . import support\nfrom .test_b import Gates\nfrom . import conftest\n"
    )
    assert imports_of_test_modules(tmp_path) == [
        "tests/layer/test_a.py:2 -> tests.layer.test_b",
        "tests/layer/test_a.py:3 -> tests.layer.conftest",
    ]


def test_tests_contract_stores_and_run_hold_only_test_modules_and_their_conftest() -> None:
    stores = TESTS / "stores"
    folders = [
        TESTS / "contract",
        stores,
        *sorted(p for p in stores.iterdir() if p.is_dir() and p.name != "__pycache__"),
        TESTS / "run",
    ]
    assert [str(f.relative_to(TESTS)) for f in folders] == [
        "contract",
        "stores",
        "stores/etcd",
        "stores/redis",
        "stores/sql",
        "run",
    ]
    assert {str(f.relative_to(TESTS)): helpers for f in folders if (helpers := helper_modules(f))} == {}


def test_a_helper_module_beside_the_test_modules_is_found(tmp_path: Path) -> None:
    for name in ("__init__.py", "conftest.py", "test_a.py", "harness.py"):
        (tmp_path / name).write_text("")
    assert helper_modules(tmp_path) == {"harness"}


def test_each_folder_imports_only_the_folders_the_architecture_page_allows() -> None:
    assert imports_across_folders() == []


def test_an_import_of_a_folder_not_allowed_is_found(tmp_path: Path) -> None:
    for folder in ("run", "servers", "integration"):
        (tmp_path / "tests" / folder).mkdir(parents=True)
    (tmp_path / "tests" / "run" / "test_a.py").write_text(
        "from tests.servers import redis\nfrom ..integration import world\nfrom tests.support import racing\n"
    )
    assert imports_across_folders(tmp_path) == [
        "tests/run/test_a.py:1 -> tests.servers",
        "tests/run/test_a.py:1 -> tests.servers.redis",
        "tests/run/test_a.py:2 -> tests.integration",
        "tests/run/test_a.py:2 -> tests.integration.world",
    ]


def test_no_two_test_modules_share_a_file_name() -> None:
    assert shared_test_module_names() == {}


def test_two_test_modules_of_one_name_are_found(tmp_path: Path) -> None:
    for layer in ("unit", "integration"):
        (tmp_path / "tests" / layer).mkdir(parents=True)
        (tmp_path / "tests" / layer / "test_events.py").write_text("")
    (tmp_path / "tests" / "unit" / "test_other.py").write_text("")
    assert shared_test_module_names(tmp_path) == {
        "test_events.py": ["tests/integration/test_events.py", "tests/unit/test_events.py"]
    }


def harness_fixtures_outside_support(top: Path = ROOT) -> list[str]:
    """``file:line`` of each function named ``harness`` under ``top``/tests but in
    tests/support/harness_fixtures.py: a test chooses its stores with the ``stores`` mark, not by its own
    ``harness`` fixture."""
    found = []
    for path in sorted((top / "tests").rglob("*.py")):
        if path.relative_to(top).as_posix() == "tests/support/harness_fixtures.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef) and node.name == "harness":
                found.append(f"{path.relative_to(top)}:{node.lineno}")
    return found


def test_no_test_module_chooses_its_stores_by_a_harness_fixture_of_its_own() -> None:
    assert harness_fixtures_outside_support() == []


def test_a_harness_fixture_of_a_test_modules_own_is_found(tmp_path: Path) -> None:
    (tmp_path / "tests" / "run").mkdir(parents=True)
    module = "import pytest\n\n@pytest.fixture\ndef harness():\n    pass\n"
    (tmp_path / "tests" / "run" / "test_a.py").write_text(module)
    assert harness_fixtures_outside_support(tmp_path) == ["tests/run/test_a.py:4"]


# A citation of where a test came from (an issue's number or title, a review's point): a test's docstring or
# comment says what it holds instead. This module's own examples of it are left out.
CITATION = re.compile(r"\b[Ii]ssue\s*[\d\"':]|\b[Rr]eview\s+point|\bpoint\s+\d")


def citations(top: Path = ROOT) -> list[str]:
    """``file:line`` of each line of a Python module under ``top``/tests that cites an issue or a review
    point."""
    return [
        f"{path.relative_to(top)}:{number}"
        for path in sorted((top / "tests").rglob("*.py"))
        if path.resolve() != Path(__file__).resolve()
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if CITATION.search(line)
    ]


def test_no_test_docstring_or_comment_cites_an_issue_or_a_review_point() -> None:
    assert citations() == []


def test_a_citation_of_an_issue_or_a_review_point_is_found(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    lines = [
        '"""Issue 27, point 8: said once."""',
        "# Review point 4: never waits",
        '"""Exactly once per key (issue: exactly once per key)."""',
        "x = 1  # an issued token, at a point of its own",
    ]
    (tmp_path / "tests" / "test_a.py").write_text("\n".join(lines) + "\n")
    assert citations(tmp_path) == ["tests/test_a.py:1", "tests/test_a.py:2", "tests/test_a.py:3"]
