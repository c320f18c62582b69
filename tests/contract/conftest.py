from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .checks import seed
from .harness import HARNESSES, Harness, harness_params


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
