"""``fence_mode="commit"`` on the SQL stores: the writes of a handle's ``block()`` roll back when its claim
is refused. Two handles on one key each write a row; the first claims, the second is refused and its row is
gone. On SQLite (one write lock, held from the read) the second waits at its read until the first
committed, and is refused there, before it could write."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from celery_fence import AlreadyDone, LeaseHeld, StaleToken
from celery_fence.stores.capabilities import capabilities_of
from celery_fence.verify import verify

pytestmark = pytest.mark.stores(transactions=True)

TTL = 30.0
TABLE = "fence_test_commit_rows"


@pytest.fixture
def table(store: Any) -> Iterator[None]:
    store.migrate()
    with store.engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {TABLE} (id VARCHAR(40) PRIMARY KEY)"))
    yield
    with store.engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {TABLE}"))


def rows(store: Any) -> list[str]:
    with store.engine.connect() as conn:
        return [row[0] for row in conn.execute(text(f"SELECT id FROM {TABLE}"))]


def insert(handle: Any, row: str) -> None:
    with handle.block() as conn:
        conn.execute(text(f"INSERT INTO {TABLE} (id) VALUES (:id)"), {"id": row})


def test_the_writes_of_a_refused_claim_roll_back_with_it(store: Any, table: None) -> None:
    first = store.begin_commit("k", "first", TTL)
    if capabilities_of(store).write_lock_wait is not None:  # SQLite: the second waits at its read
        refused = open_beside(store, first)
        assert isinstance(refused, AlreadyDone) and refused.result == "first's", refused
    else:
        second = store.begin_commit("k", "second", TTL)
        insert(second, "second")
        insert(first, "first")
        first.complete("first's")
        with pytest.raises(StaleToken) as info:
            second.complete("second's")
        assert info.value.recorded and not second.open
        last = store.history("k")[-1]
        assert (last.event, last.token, last.owner, last.detail) == ("refused", 0, "second", "commit")
    assert rows(store) == ["first"]
    state = store.get("k")
    assert (state.owner, state.result, state.done) == ("first", "first's", True)
    assert [e.event for e in store.history("k") if e.event == "commit"] == ["commit"]
    assert verify(store.history()) == []


def test_a_handle_closed_without_its_claim_leaves_no_write_and_no_key(store: Any, table: None) -> None:
    handle = store.begin_commit("k", "gone", TTL)
    insert(handle, "gone")
    handle.close()
    assert rows(store) == [] and store.get("k") is None and store.history("k") == []


def open_beside(store: Any, first: Any) -> BaseException | None:
    """A second handle opened in a thread while ``first`` is open (it waits for the write lock); ``first``
    writes and claims; what the second's open raised (``None``: it opened, wrote, and rolled back)."""
    seen: list[BaseException | None] = []

    def second() -> None:
        try:
            handle = store.begin_commit("k", "second", TTL)
        except (AlreadyDone, LeaseHeld) as exc:
            seen.append(exc)
            return
        insert(handle, "second")
        seen.append(None)
        handle.close()

    thread = threading.Thread(target=second)
    thread.start()
    insert(first, "first")
    first.complete("first's")
    thread.join(60)
    assert not thread.is_alive() and len(seen) == 1, seen
    return seen[0]
