"""``self.fence.atomic()`` on the ``django://`` store, through Celery's in-process worker on SQLite and
PostgreSQL: the ORM writes of a run commit together with its completion (docs/django.md), or not at all;
``on_commit`` callbacks run after that commit only; nested ``transaction.atomic()`` blocks are savepoints;
a hand-made commit is refused."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import pytest
from celery import Celery
from django.db import connections, transaction
from django.db.transaction import TransactionManagementError
from sqlalchemy import text

from celery_fence import FencedTask, LeaseHeld, StaleToken, StoreUnavailable, UsageError
from celery_fence.fence import Fence
from celery_fence.stores import open_store
from celery_fence.stores.django import run as django_run
from tests.django_app.orders.models import Order


def new_key() -> str:
    return f"order-{uuid.uuid4().hex[:12]}"


def orders(alias: str, key: str) -> list[tuple[str, int]]:
    """The committed orders of ``key``, read on a fresh Django query outside any run."""
    return sorted(Order.objects.using(alias).filter(key=key).values_list("what", "paid"))


def committed_elsewhere(store: Any, key: str) -> int:
    """The orders of ``key`` another connection sees (the store's own engine): committed ones only."""
    with store.autocommit_engine.connect() as conn:  # no BEGIN IMMEDIATE: SQLite's write lock is the run's
        query = text("SELECT count(*) FROM orders_order WHERE key = :k")
        return int(conn.execute(query, {"k": key}).scalar_one())


def events(store: Any, key: str) -> list[str]:
    return [e.event for e in store.history(key)]


def take_over(store: Any, key: str) -> None:
    """The run's lease expires (its stored expiry moves 10,000 s back) and another owner acquires it."""
    with store.engine.begin() as conn:
        query = "UPDATE fence_leases SET expires_at = expires_at - 10000 WHERE key = :k"
        conn.execute(text(query), {"k": key})
    assert store.acquire(key, "another-worker", 30.0).taken_over


def test_orm_writes_in_fence_atomic_commit_with_the_completion(app: Celery, store: Any, alias: str) -> None:
    seen: dict[str, Any] = {}

    @app.task(base=FencedTask, bind=True, shared=False)
    def pay(self: Any) -> str:
        key = self.fence.key
        with self.fence.atomic():
            Order.objects.using(alias).create(key=key, what="book")
            Order.objects.using(alias).filter(key=key).update(paid=10)
            locked = list(Order.objects.using(alias).select_for_update().filter(key=key))
            seen["locked"] = [(o.what, o.paid) for o in locked]
        # Written, not committed: neither another connection nor the store sees any of it yet.
        seen["before"] = (committed_elsewhere(store, key), store.get(key).done)
        return "paid"

    key = new_key()
    assert pay.apply(task_id=key).get() == "paid"
    assert seen == {"locked": [("book", 10)], "before": (0, False)}
    assert orders(alias, key) == [("book", 10)]
    assert events(store, key) == ["acquire", "write", "complete"]


def test_a_run_raising_between_its_orm_write_and_its_completion_leaves_no_write(
    app: Celery, store: Any, alias: str
) -> None:
    fail = {"now": True}

    @app.task(base=FencedTask, bind=True, shared=False)
    def pay(self: Any) -> str:
        with self.fence.atomic():
            Order.objects.using(alias).create(key=self.fence.key, what="book")
        if fail["now"]:
            raise RuntimeError("the body fails after its ORM write")
        return "paid"

    key = new_key()
    assert pay.apply(task_id=key).failed()
    assert orders(alias, key) == []
    state = store.get(key)
    assert state is not None and not state.done and state.expires_in is None  # released: may run again
    fail["now"] = False
    assert pay.apply(task_id=key).get() == "paid"
    assert orders(alias, key) == [("book", 0)]  # one write: the first attempt's never committed


def test_a_run_interrupted_at_its_commit_leaves_no_write(
    app: Celery, store: Any, alias: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The completion was written in the run's transaction, and the run stops before the COMMIT (the
    ``before-commit`` failpoint): nothing of it commits, the ORM write neither."""

    def stop(name: str) -> None:
        if name == "before-commit":
            raise RuntimeError("stopped before the COMMIT")

    monkeypatch.setattr(django_run, "failpoint", stop)

    @app.task(base=FencedTask, bind=True, shared=False)
    def pay(self: Any) -> str:
        with self.fence.atomic():
            Order.objects.using(alias).create(key=self.fence.key, what="book")
        return "paid"

    key = new_key()
    pay.apply(task_id=key)
    assert orders(alias, key) == []
    state = store.get(key)
    assert state is not None and not state.done
    assert "complete" not in events(store, key) and "write" not in events(store, key)


def test_a_stale_run_writes_nothing_and_raises_stale_token(app: Celery, store: Any, alias: str) -> None:
    raised: list[BaseException] = []

    @app.task(base=FencedTask, bind=True, shared=False)
    def pay(self: Any) -> str:
        take_over(store, self.fence.key)  # while this run believes it holds the lease
        try:
            with self.fence.atomic():
                Order.objects.using(alias).create(key=self.fence.key, what="stale")
        except StaleToken as exc:
            raised.append(exc)
            raise
        return "paid"

    key = new_key()
    pay.apply(task_id=key)
    assert [type(e) for e in raised] == [StaleToken]
    assert orders(alias, key) == []
    assert "refused" in events(store, key) and "write" not in events(store, key)
    assert not connections[alias].in_atomic_block  # the refused run left Django's connection clean


@pytest.mark.postgres
def test_a_paused_holders_orm_writes_roll_back_when_its_lease_is_taken_over(migrated_postgres: str) -> None:
    """On PostgreSQL the run's transaction idles out after one ttl (the server ends the session); the
    lease is then taken over, and the stale holder's ORM writes are gone; its completion fails."""
    alias = migrated_postgres
    store = open_store(f"django://{alias}")
    key = new_key()
    fence = Fence(store, store.acquire(key, "a", 1.0), None, 1.0)
    with fence.atomic():
        Order.objects.using(alias).create(key=key, what="paused")
    deadline = time.monotonic() + 30  # a bound for the poll, not a measurement
    while True:
        try:
            store.acquire(key, "b", 30.0)
            break
        except LeaseHeld:
            assert time.monotonic() < deadline, "the paused holder's transaction was never ended"
            time.sleep(0.05)
    with pytest.raises(StoreUnavailable):
        fence.commit("a's result")
    fence.abort()
    assert orders(alias, key) == []
    assert [(e.event, e.owner) for e in store.history(key)] == [("acquire", "a"), ("takeover", "b")]
    store.close()


@pytest.mark.postgres
def test_a_session_timeout_in_an_orm_statement_is_the_store_unavailable(migrated_postgres: str) -> None:
    """What waiting can heal (here the session's statement_timeout) in the run's ORM statements is
    ``StoreUnavailable``, as in ``transaction()``: nothing committed, and the run runs again."""
    alias, key = migrated_postgres, new_key()
    store = open_store(f"django://{alias}")
    fence = Fence(store, store.acquire(key, "w", 30.0), None, 30.0)
    with pytest.raises(StoreUnavailable, match="nothing of it was committed"), fence.atomic():
        Order.objects.using(alias).create(key=key, what="slow")
        with connections[alias].cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = 50")
            cursor.execute("SELECT pg_sleep(5)")
    fence.abort()
    assert orders(alias, key) == [] and events(store, key) == ["acquire"]
    assert not connections[alias].in_atomic_block
    store.close()


def test_on_commit_runs_once_after_the_completion_and_never_for_a_run_that_rolled_back(
    app: Celery, store: Any, alias: str
) -> None:
    calls: list[tuple[str, bool]] = []
    fail = {"now": True}

    @app.task(base=FencedTask, bind=True, shared=False)
    def pay(self: Any) -> str:
        key = self.fence.key
        with self.fence.atomic():
            Order.objects.using(alias).create(key=key, what="book")
            transaction.on_commit(lambda: calls.append((key, store.get(key).done)), using=alias)
        if fail["now"]:
            raise RuntimeError("rolled back")
        return "paid"

    key = new_key()
    assert pay.apply(task_id=key).failed()
    assert calls == []  # the run rolled back: its callback never ran
    fail["now"] = False
    assert pay.apply(task_id=key).get() == "paid"
    assert calls == [(key, True)]  # once, and the completion was committed when it ran
    assert pay.apply(task_id=key).get() == "paid"  # a duplicate: the body does not run, nor the callback
    assert calls == [(key, True)]


def test_an_on_commit_callback_that_raises_is_logged_and_the_run_stays_completed(
    app: Celery, store: Any, alias: str, caplog: pytest.LogCaptureFixture
) -> None:
    def broken() -> None:
        raise ValueError("the callback fails")

    @app.task(base=FencedTask, bind=True, shared=False)
    def pay(self: Any) -> str:
        with self.fence.atomic():
            Order.objects.using(alias).create(key=self.fence.key, what="book")
            transaction.on_commit(broken, using=alias)
        return "paid"

    key = new_key()
    with caplog.at_level(logging.ERROR, logger=django_run.__name__):
        assert pay.apply(task_id=key).get() == "paid"
    assert orders(alias, key) == [("book", 0)] and store.get(key).done
    assert [r.exc_info[1].args for r in caplog.records if r.exc_info] == [("the callback fails",)]


def test_a_duplicate_delivery_of_a_finished_key_runs_the_body_once(
    app: Celery, store: Any, alias: str
) -> None:
    bodies: list[str] = []

    @app.task(base=FencedTask, bind=True, shared=False, fence_key="order:{n}")
    def pay(self: Any, n: str) -> str:
        bodies.append(self.request.id)
        with self.fence.atomic():
            Order.objects.using(alias).create(key=self.fence.key, what="book")
        return "paid"

    n = new_key()
    assert pay.apply(args=(n,), task_id=f"{n}-1").get() == "paid"
    assert pay.apply(args=(n,), task_id=f"{n}-1").get() == "paid"  # the broker delivered it again
    assert pay.apply(args=(n,), task_id=f"{n}-2").get() == "paid"  # a second message for the same key
    assert len(bodies) == 1
    assert orders(alias, f"order:{n}") == [("book", 0)]


def test_a_nested_atomic_is_a_savepoint_its_exception_undoes_that_part_only(
    app: Celery, store: Any, alias: str
) -> None:
    @app.task(base=FencedTask, bind=True, shared=False)
    def pay(self: Any) -> str:
        key = self.fence.key
        with self.fence.atomic():
            Order.objects.using(alias).create(key=key, what="a-kept")
            with transaction.atomic(using=alias):
                Order.objects.using(alias).create(key=key, what="b-nested")
            with pytest.raises(ZeroDivisionError), transaction.atomic(using=alias):
                Order.objects.using(alias).create(key=key, what="c-undone")
                _ = 1 / 0
        with pytest.raises(KeyError), self.fence.atomic():  # a later block is a savepoint too
            Order.objects.using(alias).create(key=key, what="d-undone")
            raise KeyError("this block alone is undone")
        with self.fence.atomic():
            Order.objects.using(alias).create(key=key, what="e-kept")
        return "paid"

    key = new_key()
    assert pay.apply(task_id=key).get() == "paid"
    assert orders(alias, key) == [("a-kept", 0), ("b-nested", 0), ("e-kept", 0)]


def test_a_hand_made_commit_is_refused_and_commits_nothing(app: Celery, store: Any, alias: str) -> None:
    refused: list[type[BaseException]] = []

    @app.task(base=FencedTask, bind=True, shared=False)
    def pay(self: Any) -> str:
        with self.fence.atomic():
            Order.objects.using(alias).create(key=self.fence.key, what="django")
            try:
                transaction.commit(using=alias)  # Django refuses it inside atomic()
            except TransactionManagementError:
                refused.append(TransactionManagementError)
            raise RuntimeError("and then the run fails")

    @app.task(base=FencedTask, bind=True, shared=False)
    def by_sqlalchemy(self: Any) -> str:
        with self.fence.transaction() as conn:
            Order.objects.using(alias).create(key=self.fence.key, what="sqlalchemy")
            conn.commit()  # celery-fence refuses it on the transaction() connection
        return "never"

    key = new_key()
    assert pay.apply(task_id=key).failed()
    assert refused == [TransactionManagementError]
    assert orders(alias, key) == []
    result = by_sqlalchemy.apply(task_id=key + "-sa")
    assert result.failed() and isinstance(result.result, UsageError)
    assert orders(alias, key + "-sa") == []


def test_orm_and_sqlalchemy_writes_and_steps_join_one_transaction(
    app: Celery, store: Any, alias: str
) -> None:
    fail = {"now": True}

    @app.task(base=FencedTask, bind=True, shared=False)
    def pay(self: Any) -> str:
        key = self.fence.key
        def reserve(conn: Any) -> None:  # an ORM write: it commits on its own, with its step record
            Order.objects.using(alias).create(key=key, what="0-step")

        self.fence.atomic_step("reserve", reserve)
        with self.fence.atomic():
            Order.objects.using(alias).create(key=key, what="1-orm")
        with self.fence.transaction() as conn:  # the same transaction, through SQLAlchemy
            insert = "INSERT INTO orders_order (key, what, paid) VALUES (:k, '2-sql', 0)"
            conn.execute(text(insert), {"k": key})
        self.fence.step("total", lambda: 42)  # joins the run's transaction
        if fail["now"]:
            raise RuntimeError("all of the run's transaction rolls back")
        return "paid"

    key = new_key()
    assert pay.apply(task_id=key).failed()
    assert orders(alias, key) == [("0-step", 0)] and store.steps(key) == {"reserve": None}
    fail["now"] = False
    assert pay.apply(task_id=key).get() == "paid"
    assert orders(alias, key) == [("0-step", 0), ("1-orm", 0), ("2-sql", 0)]
    assert store.steps(key) == {"reserve": None, "total": 42}


def test_fence_atomic_inside_transaction_atomic_is_a_usage_error(
    app: Celery, store: Any, alias: str
) -> None:
    @app.task(base=FencedTask, bind=True, shared=False)
    def pay(self: Any) -> str:
        with transaction.atomic(using=alias), self.fence.atomic():
            Order.objects.using(alias).create(key=self.fence.key, what="never")
        return "paid"

    key = new_key()
    result = pay.apply(task_id=key)
    assert result.failed() and isinstance(result.result, UsageError)
    assert "nest transaction.atomic() in it" in str(result.result)
    assert orders(alias, key) == []


def test_fence_atomic_on_a_store_that_is_not_django_names_the_fix(tmp_path: Any) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'fence.db'}")
    fence = Fence(store, store.acquire("k", "w", 30.0), None, 30.0)
    with pytest.raises(UsageError, match="django://default"), fence.atomic():
        pass
    assert not fence.joined  # nothing was opened
    store.close()


def test_an_sqlalchemy_session_joins_the_same_django_transaction(app: Celery, store: Any, alias: str) -> None:
    fail = {"now": True}

    @app.task(base=FencedTask, bind=True, shared=False)
    def pay(self: Any) -> str:
        key = self.fence.key
        with self.fence.atomic():
            Order.objects.using(alias).create(key=key, what="1-django")
        with self.fence.session() as session:  # SQLAlchemy's ORM on Django's connection, in its transaction
            insert = "INSERT INTO orders_order (key, what, paid) VALUES (:k, '2-session', 0)"
            session.execute(text(insert), {"k": key})
        if fail["now"]:
            raise RuntimeError("both roll back with the run's transaction")
        return "paid"

    key = new_key()
    assert pay.apply(task_id=key).failed()
    assert orders(alias, key) == []
    fail["now"] = False
    assert pay.apply(task_id=key).get() == "paid"
    assert orders(alias, key) == [("1-django", 0), ("2-session", 0)]
