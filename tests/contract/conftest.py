from __future__ import annotations

from typing import Any

import pytest

from celery_fence.testing.contract import run_role

from .harness import HARNESSES, Harness, harness_params

# On the Redis Cluster, make test runs the run role of the store contract; the rest of the suite there is
# marked cluster_full (make contract-cluster): each cluster test costs more (SCANs of every primary,
# 16,384-slot advances).
CLUSTER_REPRESENTATIVE = {run_role.__name__}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        module = getattr(getattr(item, "function", None), "__module__", None)
        if params.get("harness") == "redis_cluster" and module not in CLUSTER_REPRESENTATIVE:
            item.add_marker(pytest.mark.cluster_full)


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
