"""Shared fixtures of the unit layer: a memory store on a fake clock. No network, no sleeps."""

from __future__ import annotations

import pytest

from celery_fence._runtime import Renewer
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    """The store's clock: it moves only when a test calls ``advance``."""
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> MemoryStore:
    return MemoryStore(clock=clock)


@pytest.fixture
def mono() -> FakeClock:
    """The renewer's monotonic clock, which decides local deadlines (the store's is ``clock``)."""
    return FakeClock(start=0.0)


@pytest.fixture
def renewer(store: MemoryStore, mono: FakeClock, monkeypatch: pytest.MonkeyPatch) -> Renewer:
    """A renewer on ``mono`` whose thread never starts: each test calls ``tick()`` itself."""
    monkeypatch.setattr(Renewer, "_ensure_thread", lambda self: None)
    return Renewer(store, 10.0, clock=mono)
