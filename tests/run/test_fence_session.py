"""``self.fence.session()`` on the SQL stores: an ORM ``Session`` whose flushed writes commit together with
the run's completion, as a ``transaction()`` block's do. A run that fails, is killed or was superseded leaves
none of them; a finished key runs its body once; the session's own ``commit()`` and ``rollback()`` are
refused."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import String, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from celery_fence import FencedTask, StaleToken, UsageError, open_store
from celery_fence.fence import Fence
from tests.support.forked import exit_code_of
from tests.support.harnesses import Harness
from tests.support.inprocess import eager_app


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "fence_test_orm_orders"
    id: Mapped[str] = mapped_column(String(80), primary_key=True)
    state: Mapped[str] = mapped_column(String(20))


pytestmark = pytest.mark.stores(transactions=True)


@pytest.fixture
def orders(store: Any) -> Iterator[None]:
    Base.metadata.create_all(store.engine)
    yield
    Base.metadata.drop_all(store.engine)


@pytest.fixture
def app(store: Any, orders: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    with eager_app("orm", store, monkeypatch) as app:
        yield app


def stored(store: Any) -> dict[str, str]:
    with Session(store.engine) as session:
        return {o.id: o.state for o in session.scalars(select(Order))}


def test_orm_writes_commit_with_the_completion_and_a_failed_attempt_leaves_none(
    app: Celery, store: Any
) -> None:
    fail = {"after": True}

    @app.task(base=FencedTask, bind=True, shared=False)
    def ship(self: Any, order: str) -> str:
        with self.fence.session() as session:
            session.add(Order(id=order, state="shipped"))
        if fail["after"]:
            raise RuntimeError("the attempt fails after its ORM write")
        return "shipped"

    assert ship.apply(("o-1",), task_id="ship-1").failed()
    assert stored(store) == {}  # flushed, never committed: rolled back with the run
    fail["after"] = False
    assert ship.apply(("o-1",), task_id="ship-1").get() == "shipped"
    assert stored(store) == {"o-1": "shipped"}
    events = [e.event for e in store.history("ship-1")]
    assert events == ["acquire", "release", "acquire", "write", "complete"], events
    assert ship.apply(("o-1",), task_id="ship-1").get() == "shipped"  # a duplicate: the stored result
    assert stored(store) == {"o-1": "shipped"} and len(store.history("ship-1")) == 5


def test_the_sessions_commit_and_rollback_are_refused_and_commit_nothing(app: Celery, store: Any) -> None:
    @app.task(base=FencedTask, bind=True, shared=False)
    def hand_made(self: Any, what: str) -> None:
        with self.fence.session() as session:
            session.add(Order(id=what, state="new"))
            getattr(session, what)()

    for what in ("commit", "rollback"):
        result = hand_made.apply((what,), task_id=f"hand-made-{what}")
        assert result.failed() and isinstance(result.result, UsageError), result.result
        assert f"session.{what}()" in str(result.result) and "flush" in str(result.result)
    assert stored(store) == {}


def test_a_failed_flush_in_a_later_block_undoes_that_block_only(app: Celery, store: Any) -> None:
    @app.task(base=FencedTask, bind=True, shared=False)
    def twice(self: Any) -> str:
        with self.fence.session() as session:
            session.add(Order(id="a", state="first"))
        with pytest.raises(IntegrityError), self.fence.session() as session:
            session.add(Order(id="b", state="undone"))
            session.add(Order(id="a", state="duplicate"))  # the primary key again: the flush fails
        with self.fence.session() as session:
            session.add(Order(id="c", state="third"))
        return "done"

    assert twice.apply(task_id="twice").get() == "done"
    assert stored(store) == {"a": "first", "c": "third"}


def test_a_superseded_runs_session_writes_nothing_and_raises_stale_token(
    app: Celery, store: Any, harness: Harness
) -> None:
    seen: list[StaleToken] = []

    @app.task(base=FencedTask, bind=True, shared=False)
    def late(self: Any) -> str:
        harness.expire_all(store)  # this run stalls past its lease; another owner takes the key over
        store.acquire(self.fence.key, "the-new-owner", 30.0)
        try:
            with self.fence.session() as session:
                session.add(Order(id="late", state="stale"))
        except StaleToken as refused:
            seen.append(refused)
            raise
        return "never"

    assert late.apply(task_id="superseded").failed()
    assert len(seen) == 1  # the body saw its write refused
    refused = [e for e in store.history("superseded") if e.event == "refused"]
    assert [(e.token, e.owner) for e in refused] == [(1, refused[0].owner)] and refused[0].owner
    assert stored(store) == {}


def _attempt(url: str, die: bool) -> None:
    store = open_store(url)
    fence = Fence(store, store.acquire("order:9", f"worker-{os.getpid()}", 30.0))
    with fence.session() as session:
        session.add(Order(id="order:9", state=f"paid by {fence.token}"))
    if die:  # the ORM write is flushed, the completion not yet sent: the worker dies here
        os.kill(os.getpid(), signal.SIGKILL)
    fence.commit("paid")
    store.close()


def test_a_worker_killed_between_its_orm_write_and_its_completion_leaves_no_write(
    store: Any, harness: Harness, orders: None
) -> None:
    assert exit_code_of(_attempt, store.url, True) == -signal.SIGKILL
    assert stored(store) == {}
    harness.expire_all(store)  # its lease expires; the next attempt takes over
    assert exit_code_of(_attempt, store.url, False) == 0
    token = store.get("order:9").token
    assert stored(store) == {"order:9": f"paid by {token}"} and store.get("order:9").done
