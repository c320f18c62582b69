"""The SQL store's hot statements (acquire, complete, renew, release) on the pooled connection's own cursor.

Around a one-round-trip statement, SQLAlchemy's ``Connection`` costs more client CPU than the statement
itself (docs/performance.md). These four are compiled once per store, to the driver's own parameter style
(psycopg: ``%(name)s``, sqlite3: ``?`` in ``positiontup`` order), and sent on the DBAPI cursor of a
connection checked out of the autocommit engine's pool. The pool still owns the connections: it hands them
out, takes them back and drops one that the driver says is broken. A driver error is re-raised as the
``DBAPIError`` SQLAlchemy itself would raise, so ``translate_errors`` maps it like any other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, TextClause
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.exc import DBAPIError, StatementError

from .sql_queries import Queries

__all__ = ["HOT", "DriverStatements"]

HOT = ("acquire", "complete", "renew", "release")


@dataclass(frozen=True)
class _Compiled:
    sql: str
    order: tuple[str, ...] | None  # the parameters' order for a positional style; None: by name


def _compile(clause: TextClause, dialect: Dialect) -> _Compiled:
    compiled = clause.compile(dialect=dialect)
    order = tuple(compiled.positiontup) if compiled.positional and compiled.positiontup else None
    return _Compiled(str(compiled), order)


class DriverStatements:
    """The hot statements of one store, each run as one autocommit round trip."""

    def __init__(self, engine: Engine, queries: Queries) -> None:
        self.engine = engine
        self._compiled = {name: _compile(getattr(queries, name), engine.dialect) for name in HOT}

    def rows(self, name: str, params: Mapping[str, Any]) -> Sequence[Any]:
        """Run statement ``name`` and return its rows (tuples)."""
        compiled = self._compiled[name]
        args = params if compiled.order is None else tuple(params[n] for n in compiled.order)
        conn = self.engine.raw_connection()
        try:
            cursor = conn.cursor()
            try:
                cursor.execute(compiled.sql, args)
                return list(cursor.fetchall())
            finally:
                cursor.close()
        except Exception as exc:  # anything the driver raised: SQLAlchemy's own wrapping decides the type
            raise self._wrapped(conn, exc, compiled.sql, args) from exc
        finally:
            conn.close()  # back to the pool (autocommit: nothing to reset)

    def _wrapped(self, conn: Any, exc: Exception, sql: str, args: Any) -> StatementError:
        dialect = self.engine.dialect
        dbapi_error = dialect.loaded_dbapi.Error
        lost = isinstance(exc, dbapi_error) and dialect.is_disconnect(exc, conn.dbapi_connection, None)
        if lost:
            conn.invalidate(exc)  # the pool must not hand this connection out again
        return DBAPIError.instance(
            sql, args, exc, dbapi_error, connection_invalidated=lost, dialect=dialect
        )
