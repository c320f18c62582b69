"""The findings as fixed programs (``findings.py``): each broke an invariant on 8908ba9
(FINDINGS-8908ba9.md) and must hold once it is fixed. The same checks as the generated programs. The open
findings of ``fence_mode="commit"`` (``COMMIT_FINDINGS``) are expected to break theirs until fixed."""

from __future__ import annotations

import pytest

from .checks import check
from .chooser import Scripted
from .findings import COMMIT_FINDINGS, END, FINDINGS
from .runner import report

KNOWN_LIMIT = "N4 a broker's second delivery re-runs a FAILURE"  # docs/reliability.md: open, not fixed


@pytest.mark.parametrize(
    "finding",
    [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason="N4: an open limit"))
        if name == KNOWN_LIMIT else name
        for name in sorted(FINDINGS)
    ],
)
def test_each_finding_program_runs_clean_to_its_end(finding: str, request: pytest.FixtureRequest) -> None:
    store, script = FINDINGS[finding]
    sim = request.getfixturevalue(f"{store}_sim")
    sim.strict_failure = finding == KNOWN_LIMIT
    chooser = Scripted(script)
    problems = check(sim.run(chooser))
    assert not problems, report(chooser, problems, store, eager=False)
    left = [entry for entry in chooser.script if entry != END]  # a program may end before its own "end"
    assert not left, f"the program did not reach {left}: it no longer shows the finding"


@pytest.mark.parametrize("finding", sorted(COMMIT_FINDINGS))
@pytest.mark.xfail(strict=True, raises=AssertionError, reason="open: found by the commit-mode simulation")
def test_each_open_commit_mode_finding_still_breaks_its_invariant(
    finding: str, request: pytest.FixtureRequest
) -> None:
    """Once fixed, the program runs clean and this test XPASSes: move it to the fixed ones. A program that
    no longer reaches its end fails outright (not an expected failure)."""
    store, script = COMMIT_FINDINGS[finding]
    sim = request.getfixturevalue(f"{store}_sim")
    chooser = Scripted(script)
    problems = check(sim.run(chooser))
    left = [entry for entry in chooser.script if entry != END]
    if left:
        pytest.fail(f"the program did not reach {left}: it no longer shows the finding")
    assert not problems, report(chooser, problems, store, eager=False)
