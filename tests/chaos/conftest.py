"""The chaos layer reuses the integration world (real workers, a Redis broker, every lease store)."""

from __future__ import annotations

from tests.integration.conftest import cluster, pytest_runtest_makereport

__all__ = ["cluster", "pytest_runtest_makereport"]
