"""The shop's fixtures: the Celery app's tasks run in process (``task.apply()``, Celery's eager
mode for one call) on the test database, which pytest-django creates and migrates (the fence_* tables
with it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_fence._runtime import runtime_for

from orders.models import Order, Stock
from shopsite.celery import app

SKU = "widget"


@pytest.fixture(scope="session", autouse=True)
def fence_runtime_closed(django_db_setup: Any) -> Iterator[None]:
    """The runs' fence store holds connections to the test database: closed before pytest-django drops it.
    (celery-fence has no public call for this yet: ``runtime_for`` is its runtime's own.)"""
    yield
    runtime_for(app).close()


@pytest.fixture
def shop(transactional_db: Any) -> Iterator[None]:
    """A stocked shop. ``transactional_db``: the runs commit for real (a test transaction around them
    would own their commit, and ``self.fence.atomic()`` refuses to run inside one)."""
    Stock.objects.create(sku=SKU, qty=10)
    yield


@pytest.fixture
def order(shop: None) -> Order:
    return Order.objects.create(sku=SKU, cents=1999)
