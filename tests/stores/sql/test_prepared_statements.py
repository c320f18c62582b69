"""PostgreSQL: the statements a run's transaction sends with its BEGIN and with its COMMIT are prepared on
the server, once per connection and in the same round trip as their first use; a simple query is parsed and
planned each time, and that was most of the server's CPU of a fenced commit (docs/performance.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text

from celery_fence import InvalidArgument, StaleToken, StoreUnavailable
from celery_fence.stores.sql import SQLStore
from celery_fence.stores.sql.one_trip import OneTrip, in_one_round_trip
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
        query = "SELECT name FROM pg_prepared_statements WHERE starts_with(name, 'fence_')"
        names = sorted(row[0] for row in conn.exec_driver_sql(query))
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


def _write(store: SQLStore, key: str, fail_second_block: bool = False) -> None:
    """A commit-mode run writing a row in one ``transaction()`` block, and with a second block that
    raises (its savepoint rolled back) if asked, then claiming the key."""
    tx = store.begin_commit(key, "w", TTL, {"id": key})
    with tx.block() as conn:
        conn.execute(text("INSERT INTO fence_test_rows (key) VALUES (:key)"), {"key": key})
    if fail_second_block:
        with pytest.raises(ZeroDivisionError), tx.block() as conn:
            conn.execute(text("INSERT INTO fence_test_rows (key) VALUES (:key)"), {"key": key + "-undone"})
            raise ZeroDivisionError
    tx.complete("done")


@pytest.fixture
def rows(pg: SQLStore) -> Iterator[None]:
    with pg.engine.begin() as conn:
        conn.execute(text("CREATE TABLE fence_test_rows (key text)"))
    yield
    with pg.engine.begin() as conn:
        conn.execute(text("DROP TABLE fence_test_rows"))


def test_a_savepoint_rolled_back_keeps_the_prepared_statements(pg: SQLStore, rows: None) -> None:
    """psycopg, holding prepared statements of its own (it prepares a statement run 5 times), answers a
    ``ROLLBACK`` (a savepoint's too) with ``DEALLOCATE ALL``: the store's claim then met no prepared
    statement and the run's work was lost (found by the simulation). The store's connections keep none."""
    for n in range(8):  # the same INSERT, again and again on the one connection
        _write(pg, f"k{n}")
    _write(pg, "after-a-failed-block", fail_second_block=True)
    _write(pg, "next")
    assert all(pg.get(key).done for key in ("after-a-failed-block", "next"))  # type: ignore[union-attr]
    with pg.engine.connect() as conn:
        written = conn.execute(text("SELECT key FROM fence_test_rows ORDER BY key")).scalars().all()
    assert written == sorted([*(f"k{n}" for n in range(8)), "after-a-failed-block", "next"])


def test_statements_deallocated_by_the_caller_are_prepared_again_by_the_next_run(
    pg: SQLStore, rows: None
) -> None:
    """The caller's ``DEALLOCATE ALL`` in a block: that run's claim finds no statement and nothing of the
    run commits (an unknown outcome, as a lost connection is); the next run prepares them again."""
    commit(pg, "first")
    tx = pg.begin_commit("dropped", "w", TTL, {"id": "dropped"})
    with tx.block() as conn:
        conn.execute(text("INSERT INTO fence_test_rows (key) VALUES ('dropped')"))
        conn.exec_driver_sql("DEALLOCATE ALL")
    with pytest.raises(StoreUnavailable):
        tx.complete("lost")
    assert pg.get("dropped") is None
    commit(pg, "again")
    assert pg.get("again").done  # type: ignore[union-attr]
    with pg.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM fence_test_rows")).scalar() == 0


ECHO = text("SELECT CAST(:value AS text) AS value, CAST(:number AS bigint) AS number")
AWKWARD_TEXT = ["it's", "back\\slash \\'", "ü € 𝄞", "", "'), (1); SELECT 1; --", "%(value)s $1 ?"]


@pytest.mark.parametrize("value", [*AWKWARD_TEXT, None])
def test_a_value_sent_with_begin_or_commit_reaches_the_server_as_it_was(
    pg: SQLStore, value: str | None
) -> None:
    """The first and last statements are sent through libpq, each value quoted by it: whatever the text,
    the prepared statement's parameter gets it unchanged."""
    echo = OneTrip.of("echo", ECHO, pg.engine.dialect)
    with pg.engine.connect() as conn:
        for number in (-(2**63), 0, 2**63 - 1):
            rows = in_one_round_trip(pg.url, conn, echo, {"value": value, "number": number}, begin=True)
            assert [(row.value, row.number) for row in rows] == [(value, number)]
            conn.rollback()


def test_a_nul_in_a_value_is_refused_before_anything_is_sent(pg: SQLStore) -> None:
    """PostgreSQL text holds no NUL: the value is refused by name, and the connection still works."""
    echo = OneTrip.of("echo", ECHO, pg.engine.dialect)
    with pg.engine.connect() as conn:
        with pytest.raises(InvalidArgument, match="NUL"):
            in_one_round_trip(pg.url, conn, echo, {"value": "a\x00b", "number": 1}, begin=True)
        conn.rollback()
        rows = in_one_round_trip(pg.url, conn, echo, {"value": "ok", "number": 1}, begin=True)
        assert rows[0].value == "ok"
        conn.rollback()
