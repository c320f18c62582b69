"""The SQL stores' harnesses: SQLite in a file of the test's own, PostgreSQL on a schema of the test's own
(``pg_schema_store``, which the integration and simulation tests use for their tables too); time passes by
moving the stored expiry into the past (``sql_shift``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import text

from celery_fence import open_store
from celery_fence.stores.front import checked
from celery_fence.stores.sql import SQLStore
from celery_fence.testing import StoreHarness as Harness


def _sqlite(request: pytest.FixtureRequest) -> Iterator[Any]:
    path = request.getfixturevalue("tmp_path") / "fence.db"
    store = open_store(f"sqlite:///{path}")
    yield store
    store.close()


@contextmanager
def pg_schema_store(base_url: str) -> Iterator[SQLStore]:
    """A store on its own PostgreSQL schema (``fence_test_*``), dropped afterwards.

    The schema travels in the URL (``options=-csearch_path=...``), so other processes can open it too.
    """
    schema = f"fence_test_{uuid.uuid4().hex[:10]}"
    admin = SQLStore(base_url)
    with admin.engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    separator = "&" if "?" in base_url else "?"  # a multi-host URL has its servers in the query
    store = SQLStore(f"{base_url}{separator}options=-csearch_path%3D{schema}")
    try:
        yield store
    finally:
        store.close()
        admin.engine.dispose()  # a fault test may have killed its pooled connection
        with admin.engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.close()


def _postgres(request: pytest.FixtureRequest) -> Iterator[Any]:
    with pg_schema_store(request.getfixturevalue("postgres_url")) as store:
        yield checked(store)


def _sql_expire(store: SQLStore) -> None:
    sql_shift(store, 10_000)


def sql_shift(store: SQLStore, seconds: float) -> None:
    """Every live lease's stored expiry moves ``seconds`` into the past: that much store time passed."""
    with store.engine.begin() as conn:
        query = "UPDATE fence_leases SET expires_at = expires_at - :s WHERE expires_at IS NOT NULL"
        conn.execute(text(query), {"s": seconds})


SQLITE = Harness("sqlite", _sqlite, _sql_expire)
POSTGRESQL = Harness("postgresql", _postgres, _sql_expire)
