"""The store-harness fixtures and the ``stores`` mark that chooses a test's stores
(tests/support/harness_fixtures.py)."""

from __future__ import annotations

from tests.support.harness_fixtures import (
    expire,
    fence_contract_harness,
    harness,
    pytest_generate_tests,
    store,
)

__all__ = ["expire", "fence_contract_harness", "harness", "pytest_generate_tests", "store"]
