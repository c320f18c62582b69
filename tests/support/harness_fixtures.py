"""The fixtures that put a test on a store harness (tests/support/harnesses/), shared by tests/contract,
tests/stores and tests/run: each of their conftests imports them. A test module chooses its stores by
overriding ``harness``; ``store`` and ``expire`` come from the shipped plugin's ``fence_contract_*``."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.harnesses import HARNESSES, Harness, harness_params


@pytest.fixture(params=harness_params())
def harness(request: pytest.FixtureRequest) -> Harness:
    return HARNESSES[request.param]


@pytest.fixture
def fence_contract_harness(harness: Harness) -> Harness:
    """The shipped contract suite (test_store_suite.py) on this directory's harnesses: every store."""
    return harness


@pytest.fixture
def store(fence_contract_store: Any) -> Any:
    return fence_contract_store


@pytest.fixture
def expire(fence_contract_expire: Any) -> Any:
    return fence_contract_expire
