"""The SQL store's hot statements (acquire, complete, renew, release) on the pooled connection's own cursor.

Around a one-round-trip statement, SQLAlchemy's ``Connection`` costs more client CPU than the statement
itself, and so does a pool checkout and return (docs/performance.md). These four are compiled once per
store, to the driver's own parameter style (psycopg: ``%(name)s``, sqlite3: ``?`` in ``positiontup``
order), and sent on the DBAPI cursor of one connection that the store keeps checked out of the autocommit
engine's pool for them; a thread that finds it in use (a renew while a run completes) takes another from
the pool for that statement. The held connection is checked like a pooled one before each use (the server
may have ended it while idle), on SQLite given this thread's lock wait (``lock``), and dropped when the
driver says it is broken. A driver error becomes a celery-fence error at the store's one boundary
(``errors.driver_error``), as one wrapped by SQLAlchemy does.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, PoolProxiedConnection, TextClause
from sqlalchemy.engine.interfaces import DBAPICursor, Dialect

from ...errors import FenceError
from .engine import ended_while_idle, on_read_only_server
from .errors import driver_error, not_sent, read_only
from .lock import apply_busy_timeout
from .queries import Queries

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

    def __init__(self, url: str, engine: Engine, queries: Queries) -> None:
        self.url, self.engine = url, engine
        self._compiled = {name: _compile(getattr(queries, name), engine.dialect) for name in HOT}
        self._held: tuple[PoolProxiedConnection, DBAPICursor] | None = None
        self._held_lock = threading.Lock()
        self._sqlite = engine.dialect.name == "sqlite"

    def rows(self, name: str, params: Mapping[str, Any]) -> Sequence[Any]:
        """Run statement ``name`` and return its rows (tuples)."""
        compiled = self._compiled[name]
        args = params if compiled.order is None else tuple(params[n] for n in compiled.order)
        if self._held_lock.acquire(blocking=False):
            try:
                conn, cursor = self._held_connection()
                return self._execute(conn, cursor, compiled.sql, args)
            finally:
                self._held_lock.release()
        conn = self._connect()  # the held one is busy in another thread
        try:
            cursor = conn.cursor()
            try:
                return self._execute(conn, cursor, compiled.sql, args)
            finally:
                cursor.close()
        finally:
            conn.close()  # back to the pool (autocommit: nothing to reset)

    def forget_after_fork(self) -> None:
        """In a forked child (its store calls this): the held connection, and its lock's state, are the
        parent's; dropped, not closed."""
        self._held, self._held_lock = None, threading.Lock()

    def close(self) -> None:
        """Give the held connection back to the pool (before the engine is disposed)."""
        with self._held_lock:
            if self._held is not None:
                self._held[0].close()
                self._held = None

    def _held_connection(self) -> tuple[PoolProxiedConnection, DBAPICursor]:
        """The held connection and its cursor (one cursor serves every statement: it costs to create)."""
        held = self._held
        if held is not None and (not held[0].is_valid or _unusable(held[0].dbapi_connection)):
            if held[0].is_valid:
                held[0].invalidate()
            held[0].close()
            held = None
        if held is None:
            conn = self._connect()
            held = self._held = (conn, conn.cursor())
        return held

    def _connect(self) -> PoolProxiedConnection:
        """A connection from the pool (``raw_connection``: the driver's own error when it cannot connect)."""
        try:
            return self.engine.raw_connection()
        except self.engine.dialect.loaded_dbapi.Error as exc:
            raise driver_error(self.url, exc, lost=True) from exc

    def _execute(self, conn: PoolProxiedConnection, cursor: DBAPICursor, sql: str, args: Any) -> list[Any]:
        try:
            if self._sqlite:  # the held connection is checked out once: bound its lock wait per statement
                apply_busy_timeout(conn.dbapi_connection, conn.info)  # type: ignore[arg-type]
            cursor.execute(sql, args)
            return list(cursor.fetchall())
        except Exception as exc:  # anything the driver raised
            raise self._failed(conn, exc) from exc

    def _failed(self, conn: PoolProxiedConnection, exc: Exception) -> FenceError:
        dialect = self.engine.dialect
        if not isinstance(exc, dialect.loaded_dbapi.Error):
            return not_sent(self.url, exc)
        lost = dialect.is_disconnect(exc, conn.dbapi_connection, None) or read_only(exc)
        if lost:
            conn.invalidate(exc)  # the pool must not hand this connection out again
        return driver_error(self.url, exc, lost)


def _unusable(dbapi_conn: Any) -> bool:
    """What the pool's checkout replaces (``engine._drop_if_ended``), for the held connection."""
    return ended_while_idle(dbapi_conn) or on_read_only_server(dbapi_conn)
