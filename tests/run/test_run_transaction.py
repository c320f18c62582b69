"""The run's transaction on the SQL stores
(docs/guarantees.md#the-rule-of-transaction-its-writes-commit-with-the-completion): ``transaction()`` blocks
join one transaction that commits with the run's completion; steps taken after it join it too; a hand-made
commit is a usage error; the renewer never waits behind a run's own open transaction."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import text

from celery_fence import FencedTask, LeaseHeld, StoreUnavailable, UsageError
from celery_fence._runtime import Renewer
from celery_fence.fence import Fence
from celery_fence.lease import LeasePolicy
from tests.support.harnesses import Harness
from tests.support.inprocess import eager_app

EFFECTS = "fence_test_tx_effects"


pytestmark = pytest.mark.stores(transactions=True)


@pytest.fixture
def app(store: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    with store.engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {EFFECTS} (key TEXT, what TEXT)"))
    with eager_app("run-tx", store, monkeypatch) as app:
        yield app
    with store.engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {EFFECTS}"))


def effects(store: Any, key: str) -> list[str]:
    with store.engine.connect() as conn:
        rows = conn.execute(text(f"SELECT what FROM {EFFECTS} WHERE key = :k ORDER BY what"), {"k": key})
        return [r.what for r in rows]


def write(conn: Any, key: str, what: str) -> None:
    conn.execute(text(f"INSERT INTO {EFFECTS} VALUES (:k, :w)"), {"k": key, "w": what})


def test_a_hand_made_commit_is_a_usage_error_and_commits_nothing(app: Celery, store: Any) -> None:
    @app.task(base=FencedTask, bind=True, shared=False)
    def commits(self: Any) -> None:
        with self.fence.transaction() as conn:
            write(conn, self.fence.key, "a")
            conn.commit()

    result = commits.apply(task_id="hand-made")
    assert result.failed() and isinstance(result.result, UsageError)
    assert "atomic_step" in str(result.result)  # the message names the fix
    assert effects(store, "hand-made") == []
    state = store.get("hand-made")
    assert state is not None and not state.done and state.expires_in is None  # released: may run again


def test_blocks_steps_and_the_completion_commit_together(app: Celery, store: Any) -> None:
    fail = {"after": True}

    @app.task(base=FencedTask, bind=True, shared=False)
    def pipeline(self: Any) -> str:
        with self.fence.transaction() as conn:
            write(conn, self.fence.key, "1-first")
        with pytest.raises(ZeroDivisionError), self.fence.transaction() as conn:
            write(conn, self.fence.key, "2-undone")  # this block alone is undone
            _ = 1 / 0
        self.fence.step("total", lambda: 42)  # joins the run's transaction
        self.fence.atomic_step("ledger", lambda conn: write(conn, self.fence.key, "3-atomic"))
        if fail["after"]:
            raise RuntimeError("the attempt fails after all of it")
        return "done"

    first = pipeline.apply(task_id="joined")
    assert first.failed()
    assert effects(store, "joined") == [] and store.steps("joined") == {}  # all rolled back together
    fail["after"] = False
    assert pipeline.apply(task_id="joined").get() == "done"
    assert effects(store, "joined") == ["1-first", "3-atomic"]
    assert store.steps("joined") == {"total": 42, "ledger": None}
    events = [e.event for e in store.history("joined")]
    assert events == ["acquire", "release", "acquire", "write", "step", "step", "complete"], events


@pytest.mark.stores("postgresql")
def test_the_renewer_never_waits_behind_its_own_runs_transaction(
    store: Any, harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One renew of leases A and B does not wait out A's open transaction. A's run holds its lease row
    locked: A is alive by that lock, pinned, and left out of the renew; B's renew goes
    through while A's transaction stays open (PostgreSQL: row locks; SQLite has one writer for the whole
    database, so there B's renew waits for A's commit: see docs/stores.md)."""
    monkeypatch.setattr(Renewer, "_ensure_thread", lambda self: None)  # ticks only when the test says
    policy = LeasePolicy(30.0)
    renewer = Renewer(store, policy.interval, clock=lambda: 1_000_000.0)
    a, b = store.acquire("A", "w", 30.0), store.acquire("B", "w", 30.0)
    for lease in (a, b):
        renewer.track(lease, policy, 0.0, lambda *_: None)  # sent long ago: due
    fence = Fence(store, a, renewer, 30.0)
    renewed = threading.Event()
    with fence.transaction() as conn:
        conn.execute(text("SELECT 1"))
        thread = threading.Thread(target=lambda: (renewer.tick(), renewed.set()), daemon=True)
        thread.start()
        assert renewed.wait(30), "the renew of B waited behind A's transaction"
        assert renewer.deadline(a) is None  # pinned: alive by its lock
    fence.commit("a's result")
    thread.join(5)
    assert renewer.round_trips == 1 and renewer.deadline(b) == policy.deadline(1_000_000.0)  # B renewed
    state = store.get("A")
    assert state is not None and state.done


@pytest.mark.stores("postgresql")
def test_a_session_timeout_in_the_callers_statements_is_the_store_unavailable(store: Any) -> None:
    """A statement cancelled by the session's ``statement_timeout`` inside ``transaction()`` is
    ``StoreUnavailable``, not SQLAlchemy's raw ``OperationalError`` (which fails the task): nothing
    committed and waiting can heal it, so the run runs again."""
    lease = store.acquire("slow", "w", 30.0)
    fence = Fence(store, lease, None, 30.0)
    with pytest.raises(StoreUnavailable, match="nothing of it was committed"), fence.transaction() as conn:
        conn.execute(text("SET LOCAL statement_timeout = 50"))
        conn.execute(text("SELECT pg_sleep(5)"))
    fence.abort()
    assert [e.event for e in store.history("slow")] == ["acquire"]  # no write: it never committed


@pytest.mark.stores("postgresql")
def test_a_paused_holders_transaction_blocks_a_takeover_for_one_ttl_at_most(store: Any) -> None:
    """The run's transaction holds the lease row locked until its
    completion; a holder that stops after writing (here: simply goes idle) is ended by the server once it
    sat idle for the lease ttl (``idle_in_transaction_session_timeout``, set to the ttl in the run's
    transaction), its writes roll back, and the next acquire takes over."""
    lease = store.acquire("paused", "a", 1.0)
    fence = Fence(store, lease, None, 1.0)
    with fence.transaction() as conn:
        conn.execute(text("SELECT 1"))  # the guard locked the row; the holder now goes quiet
    taken: list[Any] = []

    def take_over() -> bool:
        try:
            taken.append(store.acquire("paused", "b", 30.0))
        except LeaseHeld:  # answered at once while the row is locked, or while the lease lives
            return False
        return True

    deadline = time.monotonic() + 30  # a bound for the poll, not a measurement
    while not take_over():
        assert time.monotonic() < deadline, "the paused holder's transaction was never ended"
        time.sleep(0.05)
    with pytest.raises(StoreUnavailable):  # the server ended its session: nothing of it commits
        fence.commit("a's result")
    events = [(e.event, e.owner) for e in store.history("paused")]
    assert events == [("acquire", "a"), ("takeover", "b")], events  # no "write" of a's ever committed
