"""``fence_mode="commit"`` on the ``django://`` store, through Celery's in-process worker on SQLite and
PostgreSQL: the ORM writes in ``self.fence.atomic()`` commit together with the claim of the key in one
Django transaction, or not at all; ``on_commit`` callbacks run after that commit only; a finished key runs
nothing."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery import Celery
from django.db import transaction

from celery_fence import FencedTask
from tests.django_app.orders.models import Order


def new_key() -> str:
    return f"order-{uuid.uuid4().hex[:12]}"


def orders(alias: str, key: str) -> list[tuple[str, int]]:
    return sorted(Order.objects.using(alias).filter(key=key).values_list("what", "paid"))


def test_orm_writes_commit_with_the_claim_and_on_commit_runs_after_it(
    app: Celery, store: Any, alias: str
) -> None:
    notified: list[tuple[str, bool]] = []
    bodies: list[str] = []

    @app.task(base=FencedTask, bind=True, shared=False, fence_key="order:{key}", fence_mode="commit")
    def pay(self: Any, key: str) -> str:
        bodies.append(self.request.id)
        with self.fence.atomic():
            Order.objects.using(alias).create(key=key, what="book", paid=10)
            transaction.on_commit(
                lambda: notified.append((key, store.get(f"order:{key}").done)), using=alias
            )
        return "paid"

    key = new_key()
    assert pay.apply((key,), task_id=f"{key}-1").get() == "paid"
    assert pay.apply((key,), task_id=f"{key}-2").get() == "paid"  # a duplicate: the stored result, unrun
    assert bodies == [f"{key}-1"] and orders(alias, key) == [("book", 10)]
    assert notified == [(key, True)]  # once, after the claim committed
    assert [e.event for e in store.history(f"order:{key}")] == ["commit"]


def test_a_failed_run_leaves_no_orm_write_and_no_callback_and_another_task_id_commits_once(
    app: Celery, store: Any, alias: str
) -> None:
    notified: list[str] = []
    fail = {"now": True}

    @app.task(base=FencedTask, bind=True, shared=False, fence_mode="commit")
    def pay(self: Any) -> str:
        with self.fence.atomic():
            Order.objects.using(alias).create(key=self.request.id, what="book")
            transaction.on_commit(lambda: notified.append(self.request.id), using=alias)
        if fail["now"]:
            raise RuntimeError("the body fails after its ORM write")
        return "paid"

    key = new_key()
    assert pay.apply(task_id=key).failed()
    assert orders(alias, key) == [] and notified == [] and not store.get(key).done
    fail["now"] = False
    assert pay.apply(task_id=f"{key}-b").get() == "paid"
    assert orders(alias, f"{key}-b") == [("book", 0)] and notified == [f"{key}-b"]


@pytest.mark.parametrize("alias", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True)
def test_a_claim_refused_by_a_copy_that_committed_first_rolls_back_the_orm_writes(
    app: Celery, store: Any, alias: str
) -> None:
    """A copy claims the key while this run is in its body (on SQLite it could not: the run holds the
    database's write lock from its read): this run's claim changes no row, its ORM write and its on_commit
    callback go with its rolled-back transaction, and it returns the winner's result."""
    notified: list[str] = []

    @app.task(base=FencedTask, bind=True, shared=False, fence_mode="commit")
    def pay(self: Any) -> str:
        with self.fence.atomic():
            Order.objects.using(alias).create(key=self.request.id, what="late")
            transaction.on_commit(lambda: notified.append("late"), using=alias)
        store.claim(self.request.id, "the-copy", "paid by the copy")  # another connection, committed
        return "paid late"

    key = new_key()
    assert pay.apply(task_id=key).get() == "paid by the copy"
    assert orders(alias, key) == [] and notified == []
    assert [(e.event, e.detail) for e in store.history(key)] == [("commit", None), ("refused", "commit")]
