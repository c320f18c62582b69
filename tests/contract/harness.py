"""One harness per store: how the contract suite opens it, makes time pass, and cleans up.

The suite itself ships in the package (``celery_fence.testing.contract``, run by test_store_suite.py), as
a third party's store runs it. Adding a store to the suite means adding a harness here and naming it in
``HARNESSES``; the tests are never copied.
"""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import text

from celery_fence import open_store
from celery_fence.stores.front import checked
from celery_fence.stores.memory import MemoryStore
from celery_fence.stores.sql import SQLStore
from celery_fence.testing import FakeClock
from celery_fence.testing import StoreHarness as Harness


def _memory(request: pytest.FixtureRequest) -> Iterator[Any]:
    yield checked(MemoryStore(clock=FakeClock()))  # behind the front, as open_store puts it


def _memory_expire(store: MemoryStore) -> None:
    assert isinstance(store.clock, FakeClock)
    store.clock.advance(10_000)


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


HARNESSES: dict[str, Harness] = {
    "memory": Harness("memory", _memory, _memory_expire, multiprocess=False),
    "sqlite": Harness("sqlite", _sqlite, _sql_expire),
    "postgresql": Harness("postgresql", _postgres, _sql_expire),
}

if os.environ.get("FENCE_TEST_PG_HA"):  # a primary and a standby: make contract-pg-ha, not make test
    HARNESSES["postgresql-ha"] = importlib.import_module(f"{__package__}.harness_pgha").HARNESS

# Other stores bring their harness in a module of their own: tests/contract/harness_<store>.py defining
# HARNESS (a Harness); a module that is not there yet simply adds nothing.
for _name in ("redis", "etcd", "etcd_cluster", "redis_cluster"):
    try:
        _module = importlib.import_module(f"{__package__}.harness_{_name}")
    except ModuleNotFoundError as _exc:
        if _exc.name != f"{__package__}.harness_{_name}":
            raise
    else:
        HARNESSES[_name] = _module.HARNESS


def harness_params(names: Iterable[str] | None = None) -> list[Any]:
    """``names`` (every harness by default) as fixture params, each with its harness's marks."""
    return [pytest.param(name, marks=HARNESSES[name].marks) for name in sorted(names or HARNESSES)]
