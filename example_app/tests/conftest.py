"""A user's conftest: the app configured for the tests, a store and a queue per test.

celery-fence's plugin (loaded by its entry point: no ``pytest_plugins`` line) gives the ``fence_*``
fixtures. The workers are real ``celery -A example_app.app worker`` processes on the embedded default
(filesystem broker, SQLite result backend) under one folder for the session; each test gets a store of its
own (SQLite in its folder, or a PostgreSQL schema) and a queue of its own, so tests never see each other.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ProgrammingError, SQLAlchemyError

from celery_fence import Store

if TYPE_CHECKING:
    from celery_fence.testing import Worker, WorkerFactory

APP = "example_app.app"
RECOVER = ("--fence-recover", "--fence-recover-interval", "1")  # re-send runs the broker lost
PG_SERVER_URL = os.environ.get("FENCE_TEST_PG_URL") or "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
PG_DATABASE = "celery_fence_test"


# The embedded default (filesystem broker, SQLite result backend) under one folder for the session. The
# workers get it as their environment; this process gets it while it imports example_app (whose settings
# read the environment once, at import), and not for longer: Celery reads CELERY_BROKER_URL from the
# environment before its own configuration, so leaving it set would move other apps' tests to this broker.
STATE = Path(tempfile.mkdtemp(prefix="shop-tests-"))
atexit.register(shutil.rmtree, STATE, ignore_errors=True)  # the workers are stopped by then
EMBEDDED = {
    "FENCE_DEMO_DIR": str(STATE),
    "CELERY_BROKER_URL": "filesystem://",
    "CELERY_RESULT_BACKEND": f"db+sqlite:///{STATE / 'results.db'}",
}


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


with environ(EMBEDDED):
    importlib.import_module("example_app.app")  # what the tests import: configured from EMBEDDED
    from example_app import settings as _shop_settings
    from example_app import shop as shop_tables

if _shop_settings.STATE != STATE:
    raise RuntimeError(f"example_app was imported before this conftest could set FENCE_DEMO_DIR={STATE}")


@pytest.fixture
def fence_store_url(request: pytest.FixtureRequest, fence_workdir: Path) -> Iterator[str]:
    """The plugin's fixture, overridden: the workers are other processes, so a SQLite file in the test's
    folder by default; ``"memory"`` for one process; ``"postgresql"`` (indirect parametrization) for a
    PostgreSQL schema of its own, in the URL so the workers use it too, dropped afterwards."""
    name = getattr(request, "param", "sqlite")
    if name == "postgresql":
        yield from pg_schema_url()
    else:
        yield {"memory": "memory://", "sqlite": f"sqlite:///{fence_workdir / 'fence.db'}"}[name]


def pg_schema_url() -> Iterator[str]:
    """The URL of a PostgreSQL schema of its own, dropped afterwards. Skipped without a server; in CI
    (``CI`` set) a missing server fails the test instead."""
    server = make_url(PG_SERVER_URL)
    database = server.set(database=PG_DATABASE)
    schema = f"shop_test_{uuid.uuid4().hex[:10]}"
    try:
        _create_database(server)
        admin = create_engine(database, connect_args={"connect_timeout": 2})
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except (SQLAlchemyError, ImportError) as exc:
        message = f"PostgreSQL is not available at {server.render_as_string()}: {exc}"
        if os.environ.get("CI", "").strip().lower() not in ("", "0", "false"):
            pytest.fail(f"{message} (CI is set, so a missing server is an error)", pytrace=False)
        pytest.skip(message)
    try:
        yield f"{database.render_as_string(hide_password=False)}?options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def _create_database(server: Any) -> None:
    engine = create_engine(server, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 2})
    try:
        with engine.connect() as conn:
            query = text("SELECT 1 FROM pg_database WHERE datname = :name")
            if conn.execute(query, {"name": PG_DATABASE}).first() is None:
                with contextlib.suppress(ProgrammingError):  # lost a race with another run: fine
                    conn.execute(text(f'CREATE DATABASE "{PG_DATABASE}"'))
    finally:
        engine.dispose()


@dataclass
class Shop:
    """One test's shop: its store (seen directly, never through a proxy), its queue, its workers."""

    store: Store
    engine: Engine
    env: dict[str, str]
    queue: str
    start_worker: WorkerFactory

    def worker(
        self, name: str, queue: str | None = None, env: dict[str, str] | None = None, **options: Any
    ) -> Worker:
        """A worker on this shop's queue (or ``queue``) with this shop's environment (plus ``env``)."""
        env = {**self.env, **(env or {})}
        return self.start_worker(APP, name, queues=queue or self.queue, env=env, **options)

    def effects(self, order: int) -> dict[str, int]:
        """How many times each step ran for ``order``, and how many payments, shipments and e-mails."""
        data = shop_tables.counts(self.engine)
        steps = Counter(step for order_id, step in data["steps"] if order_id == order)
        outside = {name: data[name].count(order) for name in ("payments", "shipments", "outbox")}
        return {**steps, **outside}

    def events(self, key: str) -> list[str]:
        return [event.event for event in self.store.history(key)]


@pytest.fixture
def shop(fence_store: Store, fence_store_url: str, fence_worker: WorkerFactory) -> Iterator[Shop]:
    """The shop on this test's store (the workers are stopped before a PostgreSQL schema is dropped)."""
    engine = create_engine(fence_store_url)
    shop_tables.create(engine)
    env = {**EMBEDDED, "FENCE_STORE_URL": fence_store_url, "FENCE_LEASE_TTL": "2", "SHOP_STEP_PAUSE": "1"}
    try:
        yield Shop(fence_store, engine, env, f"shop-{uuid.uuid4().hex[:8]}", fence_worker)
    finally:
        engine.dispose()
