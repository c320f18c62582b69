"""The findings as fixed programs (``findings.py``): each broke an invariant on 8908ba9
(FINDINGS-8908ba9.md) and must hold once it is fixed. The same checks as the generated programs."""

from __future__ import annotations

import pytest

from .checks import check
from .chooser import Scripted
from .findings import FINDINGS
from .runner import report


@pytest.mark.parametrize("finding", sorted(FINDINGS))
def test_finding(finding: str, request: pytest.FixtureRequest) -> None:
    store, script = FINDINGS[finding]
    sim = request.getfixturevalue(f"{store}_sim")
    chooser = Scripted(script)
    problems = check(sim.run(chooser))
    assert not problems, report(chooser, problems, store, eager=False)
    assert not chooser.script, f"the program did not reach {chooser.script}: it no longer shows the finding"
