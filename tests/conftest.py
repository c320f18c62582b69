"""Shared server-availability helpers, and pytester (tests/unit/test_pytest_plugin.py runs pytest on a
user's project).

A test that needs a server it cannot reach is skipped on a developer's machine and fails in CI
(``CI`` set to anything but empty, ``0`` or ``false``), so a missing service never passes quietly.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests.support.required import in_ci, require_server  # noqa: F401  (tests may import them from here)

# pytest accepts it only in the top-level conftest; the second: the session's private servers
pytest_plugins = ["pytester", "tests.servers.fixtures", "tests.support.harness_marks"]


def _own_databases_per_xdist_worker() -> None:
    """Under pytest-xdist (``make test`` runs three workers), each worker tests against Redis databases and a
    PostgreSQL database of its own: the integration tests' workers share their broker's databases (kombu
    restores unacknowledged messages per database), and the chaos tests kill every store connection of one.
    Worker ``gwN`` moves each Redis database number down by 3N and suffixes the PostgreSQL database."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    shift = 3 * int(worker[2:])
    databases = {"FENCE_TEST_REDIS_DB": 15, "FENCE_TEST_BROKER_DB": 14, "FENCE_TEST_BACKEND_DB": 13}
    for name, default in databases.items():
        number = int(os.environ.get(name, default)) - shift
        if number < 0:
            raise pytest.UsageError(f"pytest-xdist worker {worker}: no Redis database left for {name}")
        os.environ[name] = str(number)
    database = os.environ.get("FENCE_TEST_PG_DATABASE", "celery_fence_test")
    os.environ["FENCE_TEST_PG_DATABASE"] = f"{database}_{worker}"


_own_databases_per_xdist_worker()
PG_SERVER_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
# The soak sets its own, so its faults (every celery-fence session of the database terminated) stay there.
PG_TEST_DATABASE = os.environ.get("FENCE_TEST_PG_DATABASE", "celery_fence_test")
REDIS_HOST = "127.0.0.1"
REDIS_PORT = 6379
# Parallel checkouts (several worktrees testing at once) give each its own databases through these.
REDIS_TEST_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/{os.environ.get('FENCE_TEST_REDIS_DB', '15')}"
CONNECT_TIMEOUT = 2


def _with_database(url: str, database: str, *, scheme: str | None = None) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(scheme=scheme or parts.scheme, path=f"/{database}"))


def _sqlalchemy_scheme(scheme: str) -> str:
    """Keep an explicit driver (``postgresql+psycopg``); give a bare scheme psycopg's."""
    return scheme if "+" in scheme else "postgresql+psycopg"


@pytest.fixture(scope="session")
def postgres_url(request: pytest.FixtureRequest) -> str:
    """SQLAlchemy URL of a ``celery_fence_test`` database, created on first use.

    ``FENCE_TEST_PG_PRIVATE=1`` (``make soak``) starts a private server for the session instead, so the
    soak's hundred pool processes neither hit the shared server's ``max_connections`` nor other suites.
    """
    server_url = os.environ.get("FENCE_TEST_PG_URL") or PG_SERVER_URL
    if os.environ.get("FENCE_TEST_PG_PRIVATE"):
        from tests.servers.postgres import private_postgres

        started = private_postgres()
        server_url = started.__enter__().url()
        request.addfinalizer(lambda: started.__exit__(None, None, None))
    scheme = urlsplit(server_url).scheme
    libpq_url = urlunsplit(urlsplit(server_url)._replace(scheme="postgresql"))
    try:
        import psycopg
        from psycopg import sql
    except ImportError as exc:
        require_server("PostgreSQL", False, f"psycopg is not installed ({exc})")
        raise
    try:
        with psycopg.connect(libpq_url, connect_timeout=CONNECT_TIMEOUT, autocommit=True) as conn:
            query = "SELECT 1 FROM pg_database WHERE datname = %s"
            if conn.execute(query, (PG_TEST_DATABASE,)).fetchone() is None:
                create = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(PG_TEST_DATABASE))
                with contextlib.suppress(psycopg.errors.DuplicateDatabase):  # lost a race: fine
                    conn.execute(create)
    except psycopg.Error as exc:
        require_server("PostgreSQL", False, f"{libpq_url}: {exc}")
    return _with_database(server_url, PG_TEST_DATABASE, scheme=_sqlalchemy_scheme(scheme))


@pytest.fixture(scope="session")
def redis_server_url() -> str:
    """URL of database 15 on the local Redis, after a ping."""
    try:
        import redis
    except ImportError as exc:
        require_server("Redis", False, f"redis-py is not installed ({exc})")
        raise
    client = redis.Redis(
        host=REDIS_HOST,
        port=REDIS_PORT,
        socket_connect_timeout=CONNECT_TIMEOUT,
        socket_timeout=CONNECT_TIMEOUT,
    )
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        require_server("Redis", False, f"{REDIS_HOST}:{REDIS_PORT}: {exc}")
    finally:
        client.close()
    return REDIS_TEST_URL


@pytest.fixture(scope="session")
def etcd_binary() -> str:
    """Path of an ``etcd`` executable: ``ETCD_BIN``, then ``PATH``, then ``/usr/bin/etcd``."""
    candidate = os.environ.get("ETCD_BIN") or shutil.which("etcd") or "/usr/bin/etcd"
    path = Path(candidate)
    found = path.is_file() and os.access(path, os.X_OK)
    reason = f"no executable at {candidate}; install etcd-server or set ETCD_BIN"
    require_server("etcd", found, reason)
    return str(path)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Iterator[None]:
    """Each phase's report on its item (``item.rep_call``): a fixture's teardown then knows whether the test
    failed (the real-worker world prints its workers' logs when it did)."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
