"""What a SQL store's connections are, as set on real connections: the SQLite pragmas, the PostgreSQL
session timeouts, and how many connections a store handle may open (docs/stores.md)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_fence.stores.sql import SQLStore
from tests.support.harnesses import HARNESSES

TTL = 30.0


@pytest.fixture
def lite(request: pytest.FixtureRequest) -> Iterator[SQLStore]:
    yield from HARNESSES["sqlite"].open(request)


@pytest.fixture
def pg(request: pytest.FixtureRequest) -> Iterator[SQLStore]:
    yield from HARNESSES["postgresql"].open(request)


def _settings(store: SQLStore, names: list[str]) -> dict[str, str]:
    store.acquire("k", "a", TTL)  # through the store's own path first: its connections exist
    out = {}
    for engine in (store.engine, store.autocommit_engine):
        with engine.connect() as conn:
            for name in names:
                show = f"PRAGMA {name}" if store.dialect == "sqlite" else f"SHOW {name}"
                value = str(conn.exec_driver_sql(show).scalar())
                assert out.setdefault(name, value) == value, f"{name} differs between the two engines"
    return out


def test_sqlite_connections_are_wal_synchronous_full_with_a_busy_timeout(lite: SQLStore) -> None:
    got = _settings(lite, ["journal_mode", "synchronous", "busy_timeout"])
    assert got == {"journal_mode": "wal", "synchronous": "2", "busy_timeout": "5000"}  # 2 is FULL


def test_postgresql_sessions_carry_the_documented_timeouts(pg: SQLStore) -> None:
    names = ["idle_in_transaction_session_timeout", "lock_timeout", "statement_timeout", "application_name"]
    assert _settings(pg, names) == {
        "idle_in_transaction_session_timeout": "5s",
        "lock_timeout": "5s",
        "statement_timeout": "10s",
        "application_name": "celery-fence",
    }
    with pg.autocommit_engine.connect() as conn:  # client-side: libpq's own parameters
        params = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
    wanted = {"tcp_user_timeout": "5000", "connect_timeout": "5", "keepalives": "1"}
    assert {name: params.get(name) for name in wanted} == wanted


def test_a_store_handle_opens_at_most_19_connections_two_engines(pg: SQLStore) -> None:
    pools = [pg.autocommit_engine.pool, pg.engine.pool]
    assert [(p.size(), p._max_overflow) for p in pools] == [(2, 8), (1, 8)]  # type: ignore[attr-defined]
    pg.acquire("k", "a", TTL)
    held, tx = pools
    assert held.checkedout() == 1  # type: ignore[attr-defined]  # kept for the hot statements
    assert held.checkedin() + tx.checkedin() + tx.checkedout() <= 2  # type: ignore[attr-defined]
