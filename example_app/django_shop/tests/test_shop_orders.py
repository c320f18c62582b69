"""The order pipeline on the Django ORM, fenced: each order's writes commit with its run's completion,
once, whatever happens to the runs (issue 29's "done when" for the Django example)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from sqlalchemy import text

from celery_fence.signals import lease_acquired
from celery_fence.stores import open_store
from tests.effects import DONE, UNTOUCHED, effects

from orders import tasks
from orders.models import Order
from shopsite.celery import app


def test_an_order_is_processed_once_and_notified_after_the_commit(order: Order) -> None:
    result = tasks.process_order.apply(args=(order.pk,))
    assert result.get()["order"] == order.pk
    assert effects(order) == DONE


def test_a_run_failing_between_its_writes_and_its_completion_leaves_none_and_the_next_writes_once(
    order: Order, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(order_id: int) -> None:
        raise ConnectionResetError("the worker dies here")

    monkeypatch.setattr(tasks, "after_writes", fail)
    assert tasks.process_order.apply(args=(order.pk,)).failed()
    assert effects(order) == UNTOUCHED  # nothing of it committed, nobody was notified
    monkeypatch.undo()
    assert tasks.process_order.apply(args=(order.pk,)).successful()
    assert effects(order) == DONE


def test_a_duplicate_delivery_runs_the_pipeline_once(order: Order) -> None:
    first = tasks.process_order.apply(args=(order.pk,), task_id=f"order-{order.pk}")
    again = tasks.process_order.apply(args=(order.pk,), task_id=f"order-{order.pk}")  # redelivered
    other = tasks.process_order.apply(args=(order.pk,))  # a second message for the same order
    assert first.get() == again.get() == other.get()
    assert effects(order) == DONE


def test_a_stale_run_writes_nothing(order: Order) -> None:
    """The run was paused past its lease right after it acquired it, and another worker took the order
    over and finished it: the stale run's ``atomic()`` is refused (``StaleToken``) before any write, and it
    ends with the other worker's result."""
    store = open_store(app.conf.fence_store_url)  # django://default: the leases are in the shop's database
    key = f"order:{order.pk}"

    def taken_over_meanwhile(key: str, **_: Any) -> None:
        with store.engine.begin() as conn:  # the lease expired
            expire = "UPDATE fence_leases SET expires_at = expires_at - 1000 WHERE key = :k"
            conn.execute(text(expire), {"k": key})
        winner = {"order": order.pk, "by": "the other worker"}
        store.complete(store.acquire(key, "the other worker", 30.0), winner)

    lease_acquired.connect(taken_over_meanwhile, weak=False)
    try:
        result = tasks.process_order.apply(args=(order.pk,))
    finally:
        lease_acquired.disconnect(taken_over_meanwhile)
    assert result.get() == {"order": order.pk, "by": "the other worker"}
    assert effects(order) == UNTOUCHED
    assert [e.event for e in store.history(key)][-1] == "refused"
    assert not connection.in_atomic_block  # the refused run left Django's connection clean
    store.close()
