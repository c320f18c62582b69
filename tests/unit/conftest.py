"""Shared fixtures of the unit layer: a memory store on a fake clock. No network, no sleeps."""

from __future__ import annotations

import pytest

from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    """The store's clock: it moves only when a test calls ``advance``."""
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock=clock)
