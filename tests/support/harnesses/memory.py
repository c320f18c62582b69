"""The memory store's harness: a fresh store on a fake clock for each test, behind the front as
``open_store`` puts it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_fence.stores.front import checked
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import FakeClock
from celery_fence.testing import StoreHarness as Harness


def _memory(request: pytest.FixtureRequest) -> Iterator[Any]:
    yield checked(MemoryStore(clock=FakeClock()))  # behind the front, as open_store puts it


def _memory_expire(store: MemoryStore) -> None:
    assert isinstance(store.clock, FakeClock)
    store.clock.advance(10_000)


HARNESS = Harness("memory", _memory, _memory_expire, multiprocess=False)
