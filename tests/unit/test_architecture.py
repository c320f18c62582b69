"""docs/architecture.md stays true: every module and test file it names exists, and the import graph of
``celery_fence`` keeps to the layers the page draws (no module imports a layer above its own, production
code never imports the test kit, no import cycle); the library cites only files that are in the repository.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import`` counts, at module
level, inside functions and classes, and under ``if TYPE_CHECKING:``, relative ones resolved. A dynamic
import the page names as such (an entry point, Celery's ``Request`` by name) is not seen here.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
PACKAGE = "celery_fence"
KIT = f"{PACKAGE}.testing"


# -- the graph --


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its ``__init__``)."""
    return {module_name(path, root): path for path in sorted((root / PACKAGE).rglob("*.py"))}


def _imported(name: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> Iterator[tuple[str, str]]:
    """``(target, imported name)`` for each name ``node`` imports; a ``from`` import's target is its module
    (``from x import y`` also yields ``x.y``, which counts only where ``x.y`` is a module)."""
    if isinstance(node, ast.Import):
        yield from ((alias.name, "") for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        package = name.split(".") if is_package else name.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([node.module] if node.module else [])])
    for alias in node.names:
        yield base, alias.name


def imports_of(name: str, path: Path, known: set[str]) -> dict[str, int]:
    """The package's modules ``name`` imports, each with the line of its first import."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        for base, alias in _imported(name, path.name == "__init__.py", node):
            target = f"{base}.{alias}" if f"{base}.{alias}" in known else base
            while target and target not in known:  # ``import a.b.c`` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.setdefault(target, node.lineno)
    return found


def import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    found = modules(root)
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


# -- the layers the page draws --


def layers(text: str) -> list[tuple[str, list[str]]]:
    """The rows of the page's layer table, bottom first: ``(layer, the paths in its modules column)``."""
    rows = re.findall(r"^\| \*\*([^*|]+)\*\* \| ([^|]+) \|", text, re.MULTILINE)
    return [(layer, re.findall(r"`(celery_fence/[\w/]*(?:\.py|/))`", paths)) for layer, paths in rows]


def layer_of(name: str, drawn: list[tuple[str, list[str]]]) -> int | None:
    """The layer (its row number) of the most specific path that covers module ``name``."""
    file = name.replace(".", "/") + ".py"
    package = name.replace(".", "/") + "/"
    best: tuple[int, int] | None = None  # (length of the path, row)
    for row, (_, paths) in enumerate(drawn):
        for path in paths:
            covers = path in (file, f"{package}__init__.py") or (
                path.endswith("/") and package.startswith(path)
            )
            if covers and (best is None or len(path) > best[0]):
                best = (len(path), row)
    return None if best is None else best[1]


def upward_imports(graph: dict[str, dict[str, int]], drawn: list[tuple[str, list[str]]]) -> list[str]:
    wrong = []
    for name, targets in sorted(graph.items()):
        own = layer_of(name, drawn)
        for target, line in sorted(targets.items()):
            theirs = layer_of(target, drawn)
            if own is not None and theirs is not None and theirs > own:
                wrong.append(f"{name}:{line} ({drawn[own][0]}) imports {target} ({drawn[theirs][0]})")
    return wrong


def kit_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    def in_kit(name: str) -> bool:
        return name == KIT or name.startswith(f"{KIT}.")

    return [
        f"{name}:{line} imports {target}"
        for name, targets in sorted(graph.items())
        if not in_kit(name)
        for target, line in sorted(targets.items())
        if in_kit(target)
    ]


# -- the checks --


def test_every_module_the_architecture_page_names_exists() -> None:
    named = set(re.findall(r"`((?:celery_fence|tests)/[\w/]*\.py|celery_fence/[\w/]+/)`", PAGE.read_text()))
    assert len(named) > 20
    assert sorted(name for name in named if not (ROOT / name).exists()) == []


def test_the_page_names_every_top_level_module_of_the_package() -> None:
    text = PAGE.read_text()
    found = [p for p in (ROOT / "celery_fence").glob("*.py") if p.name != "__init__.py"]
    public = [p for p in found if not p.name.startswith("_")]
    unnamed = [p.name for p in public if f"celery_fence/{p.name}" not in text and f"`{p.name}`" not in text]
    assert unnamed == []


def test_every_module_of_the_package_is_in_a_layer() -> None:
    drawn = layers(PAGE.read_text())
    assert len(drawn) >= 4
    assert sorted(name for name in modules() if layer_of(name, drawn) is None) == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert upward_imports(import_graph(), layers(PAGE.read_text())) == []


def test_production_code_never_imports_the_test_kit() -> None:
    assert kit_imports(import_graph()) == []


def test_the_library_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def lazy_imports(root: Path = ROOT) -> list[str]:
    """The modules that import one of the package's own modules inside a function."""
    lazy = set()
    for name, path in modules(root).items():
        functions = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)]
        for node in (
            n for f in functions for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))
        ):
            bases = [base for base, _ in _imported(name, path.name == "__init__.py", node)]
            if any(base == PACKAGE or base.startswith(f"{PACKAGE}.") for base in bases):
                lazy.add(str(path.relative_to(root)))
    return sorted(lazy)


def test_every_import_inside_a_function_is_named_on_the_page() -> None:
    """A function-level import of the package's own modules is a deliberate exception the page names."""
    text = PAGE.read_text()
    assert [path for path in lazy_imports() if f"`{path}`" not in text] == []


def test_the_checker_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The graph above counts what a reader would: relative imports, ``from . import x``, imports inside
    functions and under ``TYPE_CHECKING``; and it finds the layer breach and the cycle they make."""
    package = tmp_path / PACKAGE
    (package / "low").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "low" / "__init__.py").write_text("from . import leaf\n")
    (package / "low" / "leaf.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..high import Thing\n"
    )
    (package / "high.py").write_text("def f():\n    import celery_fence.low.leaf\n")
    (package / "other.py").write_text("from .low.leaf import x\nfrom celery_fence import high\n")
    graph = import_graph(tmp_path)
    assert graph == {
        PACKAGE: {},
        f"{PACKAGE}.low": {f"{PACKAGE}.low.leaf": 1},
        f"{PACKAGE}.low.leaf": {f"{PACKAGE}.high": 3},
        f"{PACKAGE}.high": {f"{PACKAGE}.low.leaf": 2},
        f"{PACKAGE}.other": {f"{PACKAGE}.low.leaf": 1, f"{PACKAGE}.high": 2},
    }
    assert cycles(graph) == [[f"{PACKAGE}.high", f"{PACKAGE}.low.leaf"]]
    drawn = layers(
        "| **low** | `celery_fence/low/` |\n| **high** | `celery_fence/high.py`, `celery_fence/other.py` |"
    )
    assert upward_imports(graph, drawn) == [f"{PACKAGE}.low.leaf:3 (low) imports {PACKAGE}.high (high)"]


# -- what the library cites --

_CITED = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md)(#[\w-]+)?")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of the page's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def citations(root: Path = ROOT) -> list[tuple[str, str, str]]:
    """``(where, file, anchor)`` for each ``*.md`` the library's source names."""
    found = []
    for path in sorted((root / PACKAGE).rglob("*")):
        if path.suffix in (".py", ".lua") and path.is_file():
            for number, line in enumerate(path.read_text().splitlines(), 1):
                for file, anchor in _CITED.findall(line):
                    found.append((f"{path.relative_to(root)}:{number}", file, anchor.lstrip("#")))
    return found


def test_the_library_cites_only_files_and_sections_in_the_repository() -> None:
    cited = citations()
    assert len(cited) >= 9
    missing = [f"{where}: {file}" for where, file, _ in cited if not (ROOT / file).is_file()]
    assert missing == []
    unknown = [
        f"{where}: {file}#{anchor}"
        for where, file, anchor in cited
        if anchor and (ROOT / file).is_file() and anchor not in _anchors(ROOT / file)
    ]
    assert unknown == []


def test_nothing_in_the_repository_cites_the_design_file_it_does_not_hold() -> None:
    """DESIGN.md is the project's brief, outside the repository and the wheel: a reader of the code, tests
    or docs must find what they cite, so they cite docs/ instead."""
    files = [ROOT / "README.md", *ROOT.glob("docs/*.md")]
    for folder in (PACKAGE, "tests", "example_app", "benchmarks"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md", ".lua")]
    this = Path(__file__).resolve()
    citing = [str(p.relative_to(ROOT)) for p in files if p.resolve() != this and "DESIGN" in p.read_text()]
    assert citing == []


def test_one_ordinary_run_crosses_at_most_twelve_modules(tmp_path: Path) -> None:
    """The path a reader follows through one ordinary run (a fenced task with a step, on SQLite): the
    modules whose functions it calls, as ``python -m benchmarks.run_path`` prints them. In a process of its
    own: a profile hook in this one would also see what earlier tests left running here."""
    store = f"sqlite:///{tmp_path / 'fence.db'}"
    command = [sys.executable, "-m", "benchmarks.run_path", "--store", store]
    env = {name: value for name, value in os.environ.items() if not name.startswith("CELERY_FENCE_")}
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    *rows, last = done.stdout.strip().splitlines()
    crossed = [row.split()[1] for row in rows]
    assert last.startswith(f"{len(crossed)} modules") and len(crossed) <= 12, done.stdout
    assert {"celery_fence.run", "celery_fence.stores.sql.store"} <= set(crossed)  # it did count the run
