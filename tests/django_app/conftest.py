"""Django configured for tests/django_app: two databases, SQLite (``default``, a file) and PostgreSQL
(``pg``, a database of its own, created here and dropped at the end), each migrated with the
celery-fence app and the tests' ``orders`` app; a Celery app whose fenced tasks run in process on the
``django://<alias>`` store.

Django's settings (tests/django_app/settings.py) are configured when this module is imported
(``settings.configure``), not through ``DJANGO_SETTINGS_MODULE``: a worker process the other tests start
never sees Django (Celery installs its Django fix-up when that variable is set); the real workers of
tests/django_app are given it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import django
import pytest
from celery import Celery
from django.conf import settings
from django.core.management import call_command
from django.db import connections

from celery_fence.stores import open_store
from tests.django_app import settings as test_settings
from tests.support.inprocess import eager_app
from tests.support.required import require_server

if not settings.configured:
    settings.configure(**{key: getattr(test_settings, key) for key in dir(test_settings) if key.isupper()})
    django.setup()
PG_DATABASE, SQLITE_DIR = test_settings.PG_DATABASE, test_settings.SQLITE_DIR
_PG = urlsplit(os.environ.get("FENCE_TEST_PG_URL") or "postgresql://postgres@127.0.0.1:5432/postgres")

ALIASES = {"sqlite": "default", "postgresql": "pg"}


def _server_admin() -> Any:
    import psycopg

    libpq = _PG._replace(scheme="postgresql").geturl()
    return psycopg.connect(libpq, connect_timeout=2, autocommit=True)


@pytest.fixture(scope="session")
def migrated_sqlite() -> Iterator[str]:
    SQLITE_DIR.mkdir(parents=True, exist_ok=True)
    call_command("migrate", database="default", run_syncdb=True, verbosity=0)
    yield "default"
    connections["default"].close()
    shutil.rmtree(SQLITE_DIR, ignore_errors=True)
    with contextlib.suppress(OSError):  # the last pytest-xdist worker to finish removes the folder
        SQLITE_DIR.parent.rmdir()


@pytest.fixture(scope="session")
def migrated_postgres() -> Iterator[str]:
    import psycopg
    from psycopg import sql

    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(PG_DATABASE))
    try:
        with _server_admin() as conn:
            conn.execute(drop)  # a run killed before its teardown left it
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(PG_DATABASE)))
    except psycopg.Error as exc:
        require_server("PostgreSQL", False, f"{_PG.hostname}:{_PG.port}: {exc}")
    call_command("migrate", database="pg", run_syncdb=True, verbosity=0)
    yield "pg"
    connections["pg"].close()
    with contextlib.suppress(psycopg.Error), _server_admin() as conn:
        conn.execute(drop)


@pytest.fixture(params=[pytest.param("sqlite"), pytest.param("postgresql", marks=pytest.mark.postgres)])
def alias(request: pytest.FixtureRequest) -> str:
    """The Django database alias a test runs on, migrated: SQLite's and PostgreSQL's."""
    fixture = "migrated_sqlite" if request.param == "sqlite" else "migrated_postgres"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def store(alias: str) -> Iterator[Any]:
    """The ``django://<alias>`` store."""
    store = open_store(f"django://{alias}")
    yield store
    store.close()


@pytest.fixture
def app(store: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    """A Celery app whose fenced tasks run in process (``task.apply()``) on ``store``."""
    with eager_app("django-run", store, monkeypatch) as app:
        yield app
