"""SQLAlchemy on Django's own connection: an engine whose connections are the DB-API connection Django
holds for an alias in the calling thread, so the fence statements (the guard, the completion, a step)
and a ``self.fence.transaction()`` block's statements run in the transaction Django opened.

Django alone begins, commits, rolls back and closes that connection: the engine's dialect is one whose
``begin``, ``commit``, ``rollback`` and ``close`` do nothing, and whose per-connection set-up (SQLite's
``regexp`` function, psycopg's notice handler) is left out, so nothing of Django's connection is changed.
The engine has no pool (``NullPool``): each ``connect()`` hands out the calling thread's connection.
"""

from __future__ import annotations

from typing import Any

from django.db import connections
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
from sqlalchemy.pool import NullPool

__all__ = ["BorrowedConnection"]

_SCHEME = "celery_fence_django"  # the registry's name of the dialects below: <scheme>+<driver>://


class _Borrowed:
    """What makes a dialect leave the connection's transaction and life to Django."""

    def on_connect(self) -> None:
        return None  # no per-connection set-up: the connection is Django's

    def do_begin(self, dbapi_connection: Any) -> None:
        pass

    def do_commit(self, dbapi_connection: Any) -> None:
        pass

    def do_rollback(self, dbapi_connection: Any) -> None:
        pass

    def do_close(self, dbapi_connection: Any) -> None:
        pass


class BorrowedPostgres(_Borrowed, PGDialect_psycopg):
    supports_statement_cache = True  # what SQLAlchemy asks of every dialect class: nothing here changes SQL


class BorrowedSQLite(_Borrowed, SQLiteDialect_pysqlite):  # type: ignore[misc]
    supports_statement_cache = True


registry.register(f"{_SCHEME}.psycopg", __name__, "BorrowedPostgres")
registry.register(f"{_SCHEME}.pysqlite", __name__, "BorrowedSQLite")
_DRIVERS = {"postgresql": "psycopg", "sqlite": "pysqlite"}  # Django's vendor: the dialect's driver


class BorrowedConnection:
    """SQLAlchemy connections on Django's connection for ``alias`` (see the module docstring)."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        vendor = connections[alias].vendor
        self.engine: Engine = create_engine(
            f"{_SCHEME}+{_DRIVERS[vendor]}://",
            creator=self._django_connection,
            poolclass=NullPool,
            pool_reset_on_return=None,
            **({"use_native_hstore": False} if vendor == "postgresql" else {}),  # no hstore set-up either
        )

    def connect(self) -> Connection:
        """A SQLAlchemy ``Connection`` on the calling thread's Django connection (opened if need be)."""
        return self.engine.connect()

    def _django_connection(self) -> Any:
        django = connections[self.alias]
        django.ensure_connection()
        return django.connection
