"""Mutation testing of the decide table's rows (``python -m tests.mutation.table_mutation``).

For each mutant of tests/mutation/table_rows.py, the real backing tests run with ``-x`` in a child process
forked from one that imported and collected them once (so a mutant costs its tests, not pytest's start-up),
with the mutant applied to the imported module before the tests run: each changed function gets the mutant's
code, each changed dict of rows is changed in place. The working tree is never written.

Only the tests that reach a row are run for its mutants, fastest first: one instrumented pass records, per
test, the rows it looked up or returned. A row no test reaches survives without a run. A mutant that makes a
test hang is killed by pytest-timeout (10 times the test's own time, at least 20 s) and counts as killed.
"""

from __future__ import annotations

import argparse
import ast
import configparser
import dataclasses
import inspect
import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FunctionType, ModuleType
from typing import Any

import pytest

from . import table_rows
from .table_rows import DELETE, Row

ROOT = Path(__file__).resolve().parents[2]


def _mutmut_option(name: str) -> list[str]:
    """A list of setup.cfg's ``[mutmut]`` section: the row mutants run the tests mutmut runs."""
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return [line for line in parser.get("mutmut", name).splitlines() if line]


TESTS = _mutmut_option("pytest_add_cli_args_test_selection")
PYTEST = [*_mutmut_option("pytest_add_cli_args"), "-q", "--no-header"]


@dataclasses.dataclass
class Outcome:
    row: Row
    replacement: str
    killed: bool
    by: str  # the test that failed, "timeout", or why nothing ran


def apply(module: ModuleType, source: str) -> None:
    """Make the imported ``module`` behave as ``source`` where the two differ (functions and dicts of rows;
    a new top-level statement runs in the module)."""
    original = {ast.dump(stmt) for stmt in ast.parse(inspect.getsource(module)).body}
    namespace = module.__dict__
    for stmt in ast.parse(source).body:
        if ast.dump(stmt) in original:
            continue
        code = compile(ast.Module([stmt], type_ignores=[]), module.__file__ or "", "exec")
        if isinstance(stmt, ast.FunctionDef) and isinstance(namespace.get(stmt.name), FunctionType):
            scratch = dict(namespace)
            exec(code, scratch)
            namespace[stmt.name].__code__ = scratch[stmt.name].__code__
        elif isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Dict):
            table = namespace[ast.unparse(stmt.targets[0])]
            new = eval(compile(ast.Expression(stmt.value), "", "eval"), namespace)
            table.clear()
            table.update(new)
        else:
            exec(code, namespace)


def in_child(source: str, args: list[str], output: Path, seconds: float) -> int:
    """Run pytest with ``args`` in a forked child with ``source`` applied; its exit code (-1: killed)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            from celery_fence import _decide

            apply(_decide, source)
            code = int(pytest.main([*PYTEST, *args]))
        finally:
            os._exit(code)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -1


def record_hits(source: str, rows: list[Row], folder: Path) -> dict[str, list[tuple[float, str]]]:
    """``{row: [(seconds, test id), ...]}``, fastest first, from one instrumented pass of every test."""
    out = folder / "row-hits.json"
    os.environ["FENCE_ROW_HITS"] = str(out)
    instrumented = table_rows.instrumented_source(source, rows)
    code = in_child(instrumented, ["-p", "tests.mutation.table_hits", *TESTS], folder / "hits.log", 1800)
    if code != 0:
        sys.exit(f"the backing tests fail without a mutant:\n{(folder / 'hits.log').read_text()[-4000:]}")
    hits: dict[str, list[tuple[float, str]]] = {}
    for test, (seconds, rows_hit) in json.loads(out.read_text()).items():
        for where in rows_hit:
            hits.setdefault(where, []).append((seconds, test))
    return {where: sorted(tests) for where, tests in hits.items()}


def check(source: str, tests: list[tuple[float, str]], folder: Path) -> tuple[bool, str]:
    if not tests:
        return False, "no test reaches it"
    per_test = max(20, int(10 * max(seconds for seconds, _ in tests)))
    args = ["-x", "-o", f"timeout={per_test}", *[test for _, test in tests]]
    seconds = 60 + 3 * sum(s for s, _ in tests) + per_test
    code = in_child(source, args, folder / "mutant.log", seconds)
    if code == 0:
        return False, f"{len(tests)} tests pass"
    if code == -1:
        return True, "timeout"
    return True, _first_failure((folder / "mutant.log").read_text()) or f"pytest exit {code}"


def _first_failure(output: str) -> str:
    """The first failed test's id, else pytest's last line (e.g. "1 failed in 3.2s")."""
    failed = re.search(r"^(?:FAILED|ERROR) (tests/\S+)", output, re.MULTILINE)
    if failed:
        return failed.group(1)
    lines = [line for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="mutate only the rows whose name contains this text")
    parser.add_argument("--json", type=Path, help="write every outcome to this file")
    parser.add_argument(
        "--survivors", type=Path, help="run again only the mutants that survived in this --json file"
    )
    args = parser.parse_args(argv)
    before = {} if args.survivors is None else _earlier(args.survivors)
    os.chdir(ROOT)
    from celery_fence import _decide

    source = inspect.getsource(_decide)
    rows = [row for row in table_rows.rows_of(ast.parse(source)) if args.only in row.where]
    actions = [action.name for action in _decide.Action]  # read from the module: the table may grow
    # Import and collect the tests once here: each child starts with them loaded.
    pytest.main([*PYTEST, "--collect-only", "-qq", *TESTS])
    started = time.monotonic()
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="fence-rows-") as folder:
        hits = record_hits(source, rows, Path(folder))
        print(f"{len(rows)} rows x {len(actions)} actions; the tests per row from one instrumented pass")
        for row in rows:
            for replacement in [*[a for a in actions if a != row.action], DELETE]:
                mutant = table_rows.mutant_source(source, row, replacement)
                if before.get((row.where, replacement), (False, ""))[0]:
                    outcomes.append(Outcome(row, replacement, *before[row.where, replacement]))
                    continue
                killed, by = check(mutant, hits.get(row.where, []), Path(folder))
                outcomes.append(Outcome(row, replacement, killed, by))
                mark = "killed  " if killed else "SURVIVED"
                print(f"{mark} {row.where} {row.action} -> {replacement}: {by}", flush=True)
    report(outcomes, time.monotonic() - started)
    if args.json:
        args.json.write_text(json.dumps([_as_json(o) for o in outcomes], indent=1))
    return 0


def _earlier(path: Path) -> dict[tuple[str, str], tuple[bool, str]]:
    """The outcomes of an earlier run (``--json``), by row and mutant."""
    return {(o["row"], o["mutant"]): (o["killed"], o["by"]) for o in json.loads(path.read_text())}


def report(outcomes: list[Outcome], seconds: float) -> None:
    by_row: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        by_row.setdefault(f"{outcome.row.where} = {outcome.row.action}", []).append(outcome)
    print(f"\n{'row':<48} killed/mutants  survivors")
    for name, group in by_row.items():
        left = ", ".join(o.replacement for o in group if not o.killed)
        print(f"{name:<48} {sum(o.killed for o in group):>3}/{len(group):<3}  {left}")
    killed = sum(o.killed for o in outcomes)
    share, minutes = 100 * killed / max(1, len(outcomes)), seconds / 60
    print(f"\ntable rows: {killed} of {len(outcomes)} mutants killed ({share:.0f}%) in {minutes:.1f} min")


def _as_json(outcome: Outcome) -> dict[str, Any]:
    row = outcome.row
    return {
        "row": row.where,
        "action": row.action,
        "mutant": outcome.replacement,
        "killed": outcome.killed,
        "by": outcome.by,
    }


if __name__ == "__main__":
    sys.exit(main())
