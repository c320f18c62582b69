"""docs/testing.md's real-worker test file for a user's own ``@app.task`` app (``example_app/invoices``),
run as written in an empty project: the files the page shows, nothing else, on Redis and SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

INVOICES = Path(__file__).resolve().parents[2] / "example_app" / "invoices"


def test_the_real_worker_file_passes_in_a_project_of_its_own(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, redis_server_url: str
) -> None:
    for name in ("invoices.py", "conftest.py", "test_invoices_on_workers.py"):
        (pytester.path / name).write_text((INVOICES / name).read_text())
    monkeypatch.setenv("INVOICES_BROKER_URL", redis_server_url)
    monkeypatch.setenv("INVOICES_RESULT_BACKEND", redis_server_url)
    monkeypatch.setenv("INVOICES_STORE_URL", "postgresql://127.0.0.1:9/unused")  # the tests set their own
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
