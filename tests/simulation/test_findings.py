"""The findings as fixed programs (``findings.py``): each broke an invariant on 8908ba9
(FINDINGS-8908ba9.md), or a program of ``fence_mode="commit"`` (``memory_commit``) broke one, and must hold
once it is fixed. The same checks as the generated programs."""

from __future__ import annotations

import pytest

from .checks import check
from .chooser import Scripted
from .findings import END, FINDINGS
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
