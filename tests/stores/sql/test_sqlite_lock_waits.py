"""SQLite's write lock held by another process: bounded waits, a renewer that is not held hostage, and an
error that names the cause. Two real processes on one database file; every wait is a poll with a deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_fence import StoreUnavailable
from celery_fence._runtime import Renewer
from celery_fence.lease import Lease, LeasePolicy
from celery_fence.stores.sql import SQLStore
from celery_fence.stores.sql.engine import SessionLimits
from celery_fence.stores.waits import lock_wait
from celery_fence.testing import wait_for
from tests.servers.sqlite_holder import holding_write_lock

CAUSE = "the SQLite database is locked by another process's open transaction (a stopped or slow worker?)"
LONG_BUSY = SessionLimits(lock=60.0)  # a store that would wait a minute for the lock on its own
POLL = 30.0  # a bound for polls only: every wait below ends in a second or two


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "fence.db")


@pytest.fixture
def store(path: str) -> Iterator[SQLStore]:
    store = SQLStore(f"sqlite:///{path}", LONG_BUSY)
    store.migrate()
    yield store
    store.close()


def _in_thread(call: Callable[[], Any]) -> dict[str, Any]:
    """Run ``call`` in a thread; poll until it ended (bounded), and return what it returned or raised."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except Exception as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(POLL)
    assert not thread.is_alive(), "held behind the other process's lock past the bound"
    return outcome


def _bounded(call: Callable[[], Any], seconds: float = 0.2) -> Callable[[], Any]:
    def bounded() -> Any:
        with lock_wait(seconds):
            return call()

    return bounded


def test_a_bounded_write_gives_up_and_names_the_cause(store: SQLStore, path: str) -> None:
    """Each way a write reaches SQLite: the held connection (renew), a pooled autocommit one (an admin
    release), a ``BEGIN IMMEDIATE`` transaction (prune). A timed-out write is transient: StoreUnavailable."""
    lease = store.acquire("k", "me", 30.0)
    writes = {
        "renew": lambda: store.renew([lease], 30.0),
        "force_release": lambda: store.force_release("k"),
        "prune": lambda: store.prune(0),
    }
    with holding_write_lock(path, stopped=True):
        for name, write in writes.items():
            error = _in_thread(_bounded(write)).get("error")
            assert isinstance(error, StoreUnavailable), name
            assert CAUSE in str(error) and path in str(error), name
        assert store.get("k").token == lease.token  # readers never wait in WAL mode
    assert store.renew([lease], 30.0) == []  # nothing was written; the lease is still current


def test_a_locked_database_names_the_cause_without_a_bound(path: str) -> None:
    store = SQLStore(f"sqlite:///{path}", SessionLimits(lock=0.2))
    store.migrate()
    with (
        holding_write_lock(path, stopped=True),
        pytest.raises(StoreUnavailable, match=r"locked by another process's open transaction"),
    ):
        store.acquire("k", "me", 30.0)
    store.close()


def test_a_bound_never_outlives_its_block(store: SQLStore, path: str) -> None:
    lease = store.acquire("k", "me", 30.0)
    with holding_write_lock(path) as holder:
        assert "error" in _in_thread(_bounded(lambda: store.renew([lease], 30.0)))
        holder.commit()
    store.renew([lease], 30.0)
    held = store.connections._hot._held  # the connection the hot statements run on
    assert held is not None
    assert held[0].dbapi_connection.execute("PRAGMA busy_timeout").fetchone() == (60_000,)


class Watched:
    """A lease tracked by a real renewer thread: when it was lost (and why), how often renewed."""

    def __init__(self, store: SQLStore, ttl: float) -> None:
        self.policy = LeasePolicy(ttl)
        self.renewer = Renewer(store, self.policy.interval)
        sent_at = time.monotonic()
        self.lease = store.acquire("k", "me", ttl)
        self.deadline = self.policy.deadline(sent_at)
        self.lost: list[tuple[float, str]] = []
        self.renewed = 0
        self.renewer.track(self.lease, self.policy, sent_at, self._on_lost, self._on_renewed)

    def _on_lost(self, _lease: Lease, why: str) -> None:
        self.lost.append((time.monotonic(), why))

    def _on_renewed(self, _lease: Lease) -> None:
        self.renewed += 1


def test_a_stopped_process_holding_the_lock_costs_a_lease_at_its_deadline_not_later(
    store: SQLStore, path: str
) -> None:
    """The store would wait a minute; the renewer's renew waits only until it could still land before
    the deadline, so the loss is reported then (not a minute later) and the thread is free again."""
    watched = Watched(store, ttl=2.0)
    try:
        with holding_write_lock(path, stopped=True):
            wait_for(lambda: watched.lost, timeout=POLL, what="the loss to be reported")
            at, why = watched.lost[0]
            assert why == "no successful renew before the local deadline"
            assert at >= watched.deadline  # only when the deadline truly passed
            assert watched.renewer.round_trips >= 1 and watched.renewed == 0
    finally:
        watched.renewer.stop()


def test_a_renewer_keeps_its_lease_across_another_processs_transaction(store: SQLStore, path: str) -> None:
    """A transaction shorter than what the ttl allows: the renew waits for the lock and lands once the
    other process commits; the lease is never reported lost."""
    watched = Watched(store, ttl=6.0)  # a renew every 2 s may wait about 3 s
    try:
        with holding_write_lock(path) as holder:
            wait_for(lambda: watched.renewer.round_trips >= 1, timeout=POLL, what="a renew to be sent")
            holder.commit()
            wait_for(lambda: watched.renewed >= 1, timeout=POLL, what="the renew to land")
        assert watched.lost == []
        state = store.get("k")
        assert state is not None and state.token == watched.lease.token and state.expires_in > 0
    finally:
        watched.renewer.stop()
