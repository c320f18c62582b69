from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .checks import seed
from .harness import HARNESSES, Harness, harness_params

# On the Redis Cluster, make test runs these modules; the rest of the suite there is marked cluster_full
# (make contract-cluster): each cluster test costs more (SCANs of every primary, 16,384-slot advances).
CLUSTER_REPRESENTATIVE = {"test_store_contract.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("harness") == "redis_cluster" and item.path.name not in CLUSTER_REPRESENTATIVE:
            item.add_marker(pytest.mark.cluster_full)


@pytest.fixture(params=harness_params())
def harness(request: pytest.FixtureRequest) -> Harness:
    return HARNESSES[request.param]


@pytest.fixture
def store(harness: Harness, request: pytest.FixtureRequest) -> Iterator[Any]:
    yield from harness.open(request)


@pytest.fixture
def expire(harness: Harness, store: Any) -> Any:
    return lambda: harness.expire_all(store)


@pytest.fixture
def seeded(store: Any, expire: Any) -> Any:
    """``(store, live lease)``: a store holding a live lease, a finished key, a step and a refusal."""
    return seed(store, expire)
