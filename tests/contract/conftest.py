from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .harness import HARNESSES, Harness


@pytest.fixture(params=sorted(HARNESSES))
def harness(request: pytest.FixtureRequest) -> Harness:
    return HARNESSES[request.param]


@pytest.fixture
def store(harness: Harness, request: pytest.FixtureRequest) -> Iterator[Any]:
    yield from harness.open(request)


@pytest.fixture
def expire(harness: Harness, store: Any) -> Any:
    return lambda: harness.expire_all(store)
