"""PostgreSQL: the statements a run's transaction sends with its BEGIN and with its COMMIT are prepared on
the server, once per connection and in the same round trip as their first use; a simple query is parsed and
planned each time, and that was most of the server's CPU of a fenced commit (docs/performance.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, text

from celery_fence import StaleToken
from celery_fence.stores.sql import SQLStore
from tests.support.harnesses import HARNESSES

TTL = 30.0


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> Iterator[SQLStore]:
    yield from HARNESSES["postgresql"].open(request)


def commit(store: SQLStore, key: str) -> None:
    store.begin_commit(key, "w", TTL, {"id": key}).complete({"key": key})


def prepared(store: SQLStore) -> list[str]:
    """The celery-fence statements prepared on the store's one pooled connection (a session's own)."""
    assert store.engine.pool.checkedout() == 0
    with store.engine.connect() as conn:
        rows = conn.exec_driver_sql("SELECT name FROM pg_prepared_statements WHERE starts_with(name, 'fence_')")
        names = sorted(row[0] for row in rows)
    assert store.engine.pool.size() >= store.engine.pool.checkedin() == 1  # the same connection every time
    return names


def test_a_fenced_commits_statements_are_prepared_once_per_connection(pg: SQLStore) -> None:
    commit(pg, "first")
    after_one = prepared(pg)
    assert [name.split("_")[1] for name in after_one] == ["claim", "open"]
    for n in range(3):
        commit(pg, f"next-{n}")
    assert prepared(pg) == after_one
    assert all(pg.get(key).done for key in ("first", "next-0", "next-1", "next-2"))  # type: ignore[union-attr]


def test_a_transaction_that_failed_after_its_prepare_prepares_the_next_under_a_new_name(pg: SQLStore) -> None:
    """A PREPARE outlives its transaction: a claim refused in the round trip that prepared it left the
    statement on the connection, so preparing it again under the same name would fail every later claim."""
    tx = pg.begin_commit("taken", "w", TTL, {"id": "t-1"})
    pg.claim("taken", "other", "theirs", {"id": "t-2"})  # a copy claims it first, on a connection of its own
    with pytest.raises(StaleToken):
        tx.complete("mine")
    commit(pg, "after")
    claims = [name for name in prepared(pg) if name.startswith("fence_claim_")]
    assert [name.rsplit("_", 1)[1] for name in claims] == ["0", "1"]
    assert pg.get("after").result == {"key": "after"}  # type: ignore[union-attr]
    assert pg.get("taken").result == "theirs"  # type: ignore[union-attr]


def test_a_connection_that_takes_no_prepared_statements_gets_the_plain_text(pg: SQLStore) -> None:
    """psycopg's ``prepare_threshold=None`` (e.g. behind PgBouncer's transaction pooling) is honoured."""

    def no_prepared_statements(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.prepare_threshold = None

    event.listen(pg.engine, "connect", no_prepared_statements)
    pg.engine.dispose()
    commit(pg, "plain")
    assert prepared(pg) == []
    assert pg.get("plain").done  # type: ignore[union-attr]
    with pg.engine.connect() as conn:
        assert conn.execute(text("SELECT done FROM fence_leases WHERE key = 'plain'")).scalar() is True
