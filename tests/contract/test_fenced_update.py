"""fenced_update on a real PostgreSQL user table, with leases from every store (cross-store fencing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import BigInteger, Column, Integer, MetaData, String, Table, select

from celery_fence import InvalidArgument, StaleToken, fenced_update

from ..support.harnesses.sql import pg_schema_store

metadata = MetaData()
accounts = Table(
    "fence_test_accounts",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("owner", String(20)),
    Column("fence_token", BigInteger),
)


@pytest.fixture
def user_db(postgres_url: str) -> Iterator[Any]:
    with pg_schema_store(postgres_url) as sql:
        metadata.create_all(sql.engine)
        with sql.engine.begin() as conn:
            conn.execute(accounts.insert().values(id=1, owner="nobody", fence_token=None))
        yield sql.engine


def test_a_stale_token_cannot_write_after_a_newer_one(store: Any, expire: Any, user_db: Any) -> None:
    old = store.acquire("acct:1", "a", 30.0)
    expire()
    new = store.acquire("acct:1", "b", 30.0)
    with user_db.begin() as conn:
        fenced_update(conn, accounts, {"owner": "b"}, accounts.c.id == 1, new.token)
    with pytest.raises(StaleToken), user_db.begin() as conn:
        fenced_update(conn, accounts, {"owner": "a"}, accounts.c.id == 1, old.token)
    with user_db.connect() as conn:
        assert conn.execute(select(accounts.c.owner, accounts.c.fence_token)).one() == ("b", new.token)


def test_the_documented_gap_a_stale_write_before_the_new_holders_first(
    store: Any, expire: Any, user_db: Any
) -> None:
    """What only the same-database transaction closes: the resource has not seen the newer token yet."""
    old = store.acquire("acct:1", "a", 30.0)
    expire()
    store.acquire("acct:1", "b", 30.0)
    with user_db.begin() as conn:
        assert fenced_update(conn, accounts, {"owner": "a"}, accounts.c.id == 1, old.token) == 1


def test_a_table_without_fence_token_is_refused(user_db: Any) -> None:
    plain = Table("fence_test_plain", MetaData(), Column("id", Integer, primary_key=True))
    with pytest.raises(InvalidArgument, match="fence_token"), user_db.begin() as conn:
        fenced_update(conn, plain, {}, plain.c.id == 1, 1)


def test_a_where_that_matches_no_row_is_stale_token_and_writes_nothing(store: Any, user_db: Any) -> None:
    """recipes.md: fenced_update cannot tell a missing row from a newer token's row, so both refuse."""
    lease = store.acquire("acct:2", "a", 30.0)
    with pytest.raises(StaleToken), user_db.begin() as conn:
        fenced_update(conn, accounts, {"owner": "a"}, accounts.c.id == 2, lease.token)
    with user_db.connect() as conn:
        assert conn.execute(select(accounts.c.id, accounts.c.owner)).all() == [(1, "nobody")]
