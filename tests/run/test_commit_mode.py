"""``fence_mode="commit"`` on the SQL stores: no lease; the completion claims the key inside the run's
transaction, sent with its ``COMMIT``. A finished key runs nothing; a failed attempt leaves no write; of
copies that ran at once exactly one commits, and the others return its result with nothing of theirs
committed; every claim and refusal is in the history. Round trips are counted on the wire on PostgreSQL."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from celery_fence import FailedBefore, FencedTask, StoreUnavailable, UsageError
from celery_fence.stores.sql.statements import LeaseStatements
from celery_fence.verify import verify
from tests.support.inprocess import eager_app
from tests.support.round_trips import RoundTrips

pytestmark = pytest.mark.stores(transactions=True)

TABLE = "fence_test_commit_orders"


@pytest.fixture
def orders(store: Any) -> Iterator[None]:
    store.migrate()  # not by the first run: a migrate waits for every open transaction on fence_leases
    with store.engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {TABLE} (id VARCHAR(80) PRIMARY KEY, by_run VARCHAR(80))"))
    yield
    with store.engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {TABLE}"))


@pytest.fixture
def app(store: Any, orders: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    with eager_app("commit-mode", store, monkeypatch) as app:
        yield app


def rows(store: Any) -> dict[str, str]:
    with store.engine.connect() as conn:
        return dict(conn.execute(text(f"SELECT id, by_run FROM {TABLE}")).all())


def write(conn: Any, order: str, run: str) -> None:
    conn.execute(text(f"INSERT INTO {TABLE} (id, by_run) VALUES (:id, :run)"), {"id": order, "run": run})


def test_the_write_commits_with_the_claim_and_a_duplicate_runs_nothing(app: Celery, store: Any) -> None:
    bodies: list[str] = []

    @app.task(base=FencedTask, bind=True, shared=False, fence_key="order:{order}", fence_mode="commit")
    def ship(self: Any, order: str) -> str:
        bodies.append(self.request.id)
        assert self.fence.token == 0  # no lease: the claim draws the token
        with self.fence.transaction() as conn:
            write(conn, order, self.request.id)
        return f"shipped by {self.request.id}"

    before = store.acquire("another-key", "w", 30.0).token
    assert ship.apply(("o-1",), task_id="first").get() == "shipped by first"
    assert ship.apply(("o-1",), task_id="second").get() == "shipped by first"  # the stored result
    assert bodies == ["first"] and rows(store) == {"o-1": "first"}
    history = store.history("order:o-1")
    assert [e.event for e in history] == ["commit"] and history[0].token > before
    state = store.get("order:o-1")
    assert state.done and state.expires_in is None and state.result == "shipped by first"
    assert verify(store.history()) == []


def test_a_failed_run_leaves_no_write_and_its_task_id_ends_there_another_task_id_commits_once(
    app: Celery, store: Any
) -> None:
    """A FAILURE marks the key ended for its task id (a copy of it running beside it can no longer claim
    the key: one ending per task id), and a copy of it sent later runs nothing and ends with that FAILURE
    (apply() has no result backend to wait for); the key stays free for another task id."""
    fail = {"after": True}

    @app.task(base=FencedTask, bind=True, shared=False, fence_key="order:o-2", fence_mode="commit")
    def ship(self: Any) -> str:
        with self.fence.transaction() as conn:
            write(conn, f"o-2-{self.request.id}", self.request.id)
        if fail["after"]:
            raise RuntimeError("the attempt fails after its write")
        return "shipped"

    result = ship.apply(task_id="ship-2")
    assert result.failed() and isinstance(result.result, RuntimeError)
    state = store.get("order:o-2")
    assert rows(store) == {} and not state.done and state.dead and "ended FAILURE" in state.dead
    fail["after"] = False
    late = ship.apply(task_id="ship-2")  # a late copy of the failed task id: no SUCCESS, no body
    assert late.failed() and isinstance(late.result, FailedBefore), late.result
    assert late.result.reason == state.dead and rows(store) == {}
    assert ship.apply(task_id="ship-2b").get() == "shipped"  # another task id: the key is free for it
    assert rows(store) == {"o-2-ship-2b": "ship-2b"}
    events = [(e.event, e.detail) for e in store.history("order:o-2")]
    assert [event for event, _ in events] == ["gave-up", "commit"], events
    assert verify(store.history()) == []


def test_a_retry_leaves_no_write_and_the_retried_attempt_commits_once(app: Celery, store: Any) -> None:
    attempts: list[int] = []

    @app.task(base=FencedTask, bind=True, shared=False, fence_mode="commit", max_retries=3)
    def ship(self: Any) -> str:
        attempts.append(self.request.retries)
        with self.fence.transaction() as conn:
            write(conn, f"o-3-{self.request.retries}", self.request.id)
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        return "shipped"

    assert ship.apply(task_id="ship-3").get() == "shipped"
    assert attempts == [0, 1] and rows(store) == {"o-3-1": "ship-3"}


@pytest.mark.stores("postgresql")
def test_two_copies_that_run_at_once_commit_once_and_the_loser_returns_the_winners_result(
    app: Celery, store: Any
) -> None:
    """Both copies pass the read and write their row before either claims (a barrier in the body): the
    second claim waits for the first's transaction on the key's unique index, then changes no row, and
    rolls back with its write."""
    both_wrote = threading.Barrier(2, timeout=30)
    claim_first = threading.Event()

    @app.task(base=FencedTask, bind=True, shared=False, fence_key="order:{order}", fence_mode="commit")
    def ship(self: Any, order: str) -> str:
        with self.fence.transaction() as conn:
            conn.execute(text(f"INSERT INTO {TABLE} (id, by_run) VALUES (:id, :run)"),
                         {"id": f"{order}-{self.request.id}", "run": self.request.id})
        both_wrote.wait()
        if self.request.id == "loser":
            claim_first.wait(30)  # the winner's claim is sent first: the order of the outcome is known
        return f"shipped by {self.request.id}"

    results: dict[str, Any] = {}

    def copy(task_id: str) -> None:
        results[task_id] = ship.apply(("o-4",), task_id=task_id)
        if task_id == "winner":
            claim_first.set()

    threads = [threading.Thread(target=copy, args=(t,)) for t in ("winner", "loser")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results["winner"].get() == "shipped by winner"
    assert results["loser"].get() == "shipped by winner"  # another task id finished the key: its result
    assert rows(store) == {"o-4-winner": "winner"}  # the loser's write rolled back with its claim
    events = [(e.event, e.detail) for e in store.history("order:o-4")]
    assert events == [("commit", None), ("refused", "commit")], events
    assert verify(store.history()) == []


def test_copies_of_one_key_run_the_body_once_when_they_queue_at_the_read(app: Celery, store: Any) -> None:
    """Many copies in threads: each commits or finds the key finished; one write, one result."""
    bodies: list[str] = []

    @app.task(base=FencedTask, bind=True, shared=False, fence_key="k", fence_mode="commit")
    def ship(self: Any) -> str:
        with self.fence.transaction() as conn:
            write(conn, f"o-5-{self.request.id}", self.request.id)
        bodies.append(self.request.id)
        return self.request.id

    results: list[Any] = []
    threads = [
        threading.Thread(target=lambda i=i: results.append(ship.apply(task_id=f"copy-{i}"))) for i in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    committed = rows(store)
    assert len(committed) == 1, committed
    (winner,) = committed.values()
    assert {r.get() for r in results} == {winner}
    assert [e.event for e in store.history("k") if e.event == "commit"] == ["commit"]
    assert verify(store.history()) == []


def test_a_body_that_catches_its_only_blocks_failure_still_claims_the_key(app: Celery, store: Any) -> None:
    with store.engine.begin() as conn:
        write(conn, "taken", "someone")

    @app.task(base=FencedTask, bind=True, shared=False, fence_mode="commit")
    def ship(self: Any) -> str:
        with pytest.raises(IntegrityError), self.fence.transaction() as conn:
            write(conn, "taken", self.request.id)
        return "handled"

    assert ship.apply(task_id="ship-6").get() == "handled"
    assert store.get("ship-6").done and rows(store) == {"taken": "someone"}


def test_steps_are_refused_in_commit_mode(app: Celery, store: Any) -> None:
    @app.task(base=FencedTask, bind=True, shared=False, fence_mode="commit")
    def stepped(self: Any) -> str:
        return str(self.fence.step("charge", lambda: "charged"))

    result = stepped.apply(task_id="stepped")
    assert result.failed() and isinstance(result.result, UsageError)
    assert "fence_mode='lease'" in str(result.result) and not store.get("stepped").done


@pytest.mark.stores("postgresql")
def test_a_commit_mode_run_takes_three_round_trips_and_a_lease_mode_run_four(app: Celery, store: Any) -> None:
    """Counted on the wire: BEGIN with the read, the task's INSERT, the claim with COMMIT; the lease mode
    adds its acquire (BEGIN goes with its guard, the completion with COMMIT)."""

    def task(mode: str) -> Any:
        @app.task(base=FencedTask, bind=True, shared=False, name=f"wire.{mode}", fence_mode=mode)
        def one_write(self: Any, i: int) -> int:
            with self.fence.transaction() as conn:
                write(conn, f"{mode}-{i}", self.request.id)
            return i

        return one_write

    store.migrate()
    wire = RoundTrips(store.engine, store.autocommit_engine)
    try:
        for mode, expected in (("commit", 3), ("lease", 4)):
            one_write = task(mode)
            for i in range(6):  # connections made, settings resolved, statements prepared (psycopg: 5th run)
                one_write.apply((i,))
            counts = [wire.count(one_write.apply, (i,)) for i in range(10, 20)]
            assert counts == [expected] * 10, (mode, counts)
    finally:
        wire.close()


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
def test_a_claim_whose_reply_is_lost_is_read_back_by_its_owner(
    app: Celery, store: Any, monkeypatch: pytest.MonkeyPatch, committed: bool
) -> None:
    """The claim and its COMMIT were sent and the connection broke: the run reads the key. Its own claim
    (the row names its owner: it has no token to compare) is SUCCESS with its result; no claim is an unknown
    outcome, which apply() reports (a worker sends the run again), never a FAILURE of the body's."""
    real_last = LeaseStatements.last

    def lost_reply(self: Any, conn: Any, tx: Any, name: str, params: Any) -> Any:
        if name == "claim" and committed:
            real_last(self, conn, tx, name, params)
        raise StoreUnavailable("the connection broke while the reply was due")

    monkeypatch.setattr(LeaseStatements, "last", lost_reply)

    @app.task(base=FencedTask, bind=True, shared=False, fence_mode="commit")
    def ship(self: Any) -> str:
        with self.fence.transaction() as conn:
            write(conn, "o-7", self.request.id)
        return "shipped"

    result = ship.apply(task_id="ship-7")
    if committed:
        assert result.get() == "shipped" and rows(store) == {"o-7": "ship-7"}
    else:
        assert result.failed() and isinstance(result.result, StoreUnavailable), result.result
        assert "may have committed" in str(result.result)
        assert rows(store) == {} and store.get("ship-7") is None


@pytest.mark.stores("postgresql")
def test_a_copy_that_fails_while_another_copy_of_its_task_id_runs_does_not_end_it_twice(
    app: Celery, store: Any
) -> None:
    """Two deliveries of one task id run at once (a broker's redelivery while the first still runs). The
    one whose body raises finds no row for the key (the other has not claimed yet): it marks the key ended
    by its task id and ends FAILURE; the other's claim is then refused, and it ends quietly (IGNORED), its
    write rolled back: one ending for the task id (the result backend, the canvas). Before the mark, the
    other ended SUCCESS after the FAILURE. The simulation's program of it: tests/simulation/findings.py."""
    both_in_body = threading.Barrier(2, timeout=30)
    failed = threading.Event()

    @app.task(base=FencedTask, bind=True, shared=False, fence_key="order:{order}", fence_mode="commit")
    def ship(self: Any, order: str, fail: bool) -> str:
        with self.fence.transaction() as conn:
            write(conn, f"{order}-{fail}", self.request.id)
        both_in_body.wait()
        if fail:
            raise RuntimeError("this copy fails")
        failed.wait(30)  # the failing copy has ended: then this one claims
        return "shipped"

    results: dict[bool, Any] = {}

    def copy(fail: bool) -> None:
        results[fail] = ship.apply(("o-8", fail), task_id="same-task-id")
        if fail:
            failed.set()

    threads = [threading.Thread(target=copy, args=(fail,)) for fail in (True, False)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert (results[True].state, results[False].state) == ("FAILURE", "IGNORED")
    assert rows(store) == {} and not store.get("order:o-8").done
    events = [(e.event, e.detail) for e in store.history("order:o-8")]
    assert [event for event, _ in events] == ["gave-up", "refused"], events
