"""A pytest plugin for tests/mutation/table_mutation.py: with an instrumented ``_decide.py`` (which
collects the rows a run uses in ``_ROW_HITS``), write ``{test id: [seconds, [rows]]}`` to
``$FENCE_ROW_HITS``."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

_seen: dict[str, list[Any]] = {}


def _hits() -> set[str]:
    from celery_fence import _decide

    hits: set[str] = _decide._ROW_HITS  # type: ignore[attr-defined]
    return hits


def pytest_runtest_logstart(nodeid: str) -> None:
    _hits().clear()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    entry = _seen.setdefault(report.nodeid, [0.0, []])
    entry[0] += report.duration
    if report.when == "teardown":
        entry[1] = sorted(_hits())


def pytest_sessionfinish() -> None:
    with open(os.environ["FENCE_ROW_HITS"], "w") as out:
        json.dump(_seen, out)
