"""How the SQL store's statements reach its database: its connections, each checked before a statement is
sent on it, and the one place their errors are caught.

:class:`Connections` owns both engines (made in ``engine``: one for explicit transactions, one in
autocommit where a statement is a round trip), the schema check on first use, and what a forked child must
drop. The hot statements (acquire, complete, renew, release) skip SQLAlchemy's ``Connection``, which costs
more client CPU than the statement itself, and so does a pool checkout (docs/performance.md): compiled once
per store to the driver's own parameter style (psycopg: ``%(name)s``, sqlite3: ``?`` in ``positiontup``
order), they run on the DBAPI cursor of one connection held out of the autocommit pool
(:class:`DriverStatements`); a thread that finds it in use takes another from the pool for that statement.

Before a statement is sent on a connection, pooled or held, it is checked: a statement that fails in flight
cannot be told apart from one that ran and lost its reply, so it cannot simply be sent again. A connection
the server ended while it sat idle has the server's goodbye, or EOF, waiting on its socket; one that is fine
has nothing to read, and one ``poll`` tells them apart in about a microsecond, where a ping costs a round
trip. One on a read-only server (a standby) is replaced too. On SQLite the connection's busy timeout is the
store's ``SessionLimits.lock``, or this thread's shorter bound (:data:`~celery_fence.stores.waits.LOCK_WAIT`),
set only when it changes (a ``PRAGMA``, no I/O), and a transaction begins ``IMMEDIATE`` (a deferred one that
reads then writes fails with "database is locked").

Every driver error, raw on the cursor or wrapped by SQLAlchemy (:func:`translate_errors`), is caught here
and becomes the celery-fence error that ``errors`` says it is.
"""

from __future__ import annotations

import select
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, PoolProxiedConnection, TextClause, event
from sqlalchemy.engine.interfaces import DBAPICursor, Dialect
from sqlalchemy.exc import DBAPIError, InvalidatePoolError, SQLAlchemyError, StatementError

from ..._process import forget_in_child
from ...errors import FenceError, StoreUnavailable
from ..waits import LOCK_WAIT
from .engine import SessionLimits, create_store_engine
from .errors import driver_error, not_sent, read_only, safe_url
from .queries import Queries, queries_for
from .schema import migrate, schema_current

__all__ = ["Connections", "compiled", "translate_errors"]

_HOT = ("acquire", "complete", "renew", "release")
_BUSY_MS = "fence_busy_ms"  # key of a pool entry's ``info``: the busy timeout its connection has now


class Connections:
    """Everything between the SQL store and its database; the store only says which statement to run."""

    def __init__(self, url: str, limits: SessionLimits) -> None:
        self.url = url
        self.engine = _guarded_engine(url, limits)  # explicit transactions
        self.autocommit_engine = _guarded_engine(url, limits, autocommit=True)
        self.dialect = self.engine.dialect.name
        self.queries: Queries = queries_for(self.dialect)
        self._hot = DriverStatements(url, self.autocommit_engine, self.queries, limits.lock)
        self._schema_ready = False
        forget_in_child(self)

    def migrate(self) -> None:
        with translate_errors(self.url), self.engine.begin() as conn:
            migrate(conn)
        self._schema_ready = True

    def ready(self) -> None:
        """Create or upgrade the schema on first use."""
        if self._schema_ready:
            return
        # Checked on the autocommit engine: a process whose runs open no fenced transaction then holds
        # one connection, not one per engine.
        with translate_errors(self.url), self.autocommit_engine.connect() as conn:
            current = schema_current(conn)
        if not current:
            self.migrate()
        self._schema_ready = True

    @contextmanager
    def one(self) -> Iterator[Connection]:
        """An autocommit connection: each statement is its own transaction and one round trip."""
        self.ready()
        with translate_errors(self.url), self.autocommit_engine.connect() as conn:
            yield conn

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """One short explicit transaction, committed at the end of the block."""
        self.ready()
        with translate_errors(self.url), self.engine.begin() as conn:
            yield conn

    def hot(self, name: str, params: Mapping[str, Any]) -> Sequence[Any]:
        """The rows of hot statement ``name``: one autocommit round trip on the driver's cursor."""
        self.ready()
        return self._hot.rows(name, params)

    def close(self) -> None:
        self._hot.close()
        self.engine.dispose()
        self.autocommit_engine.dispose()

    def forget_after_fork(self) -> None:
        """In a forked child: new, empty pools, the parent's connections dropped without being closed
        (closing would end the parent's sessions); SQLAlchemy's recipe for ``fork``."""
        self._hot.forget_after_fork()
        self.engine.dispose(close=False)
        self.autocommit_engine.dispose(close=False)


@contextmanager
def translate_errors(url: str) -> Iterator[None]:
    """Around SQLAlchemy's statements: its exceptions and the driver's become celery-fence errors."""
    try:
        yield
    except FenceError:
        raise
    except DBAPIError as exc:
        raise driver_error(url, exc.orig or exc, exc.connection_invalidated) from exc
    except StatementError as exc:  # the driver could not even send a parameter: the value is the problem
        raise not_sent(url, exc.orig if exc.orig is not None else exc) from exc
    except SQLAlchemyError as exc:
        raise StoreUnavailable(f"fence store {safe_url(url)} failed: {exc}") from exc


# -- the hot statements, on a held connection --


def compiled(clause: TextClause, dialect: Dialect) -> tuple[str, tuple[str, ...] | None]:
    """The driver's SQL text, and the parameters' order for a positional style (``None``: by name)."""
    compiled = clause.compile(dialect=dialect)
    order = tuple(compiled.positiontup) if compiled.positional and compiled.positiontup else None
    return str(compiled), order


class DriverStatements:
    """The hot statements of one store, each run as one autocommit round trip."""

    def __init__(self, url: str, engine: Engine, queries: Queries, lock_limit: float) -> None:
        self.url, self.engine = url, engine
        self._compiled = {name: compiled(getattr(queries, name), engine.dialect) for name in _HOT}
        self._held: tuple[PoolProxiedConnection, DBAPICursor] | None = None
        self._held_lock = threading.Lock()
        self._lock_limit = lock_limit if engine.dialect.name == "sqlite" else None

    def rows(self, name: str, params: Mapping[str, Any]) -> Sequence[Any]:
        """Run statement ``name`` and return its rows (tuples)."""
        sql, order = self._compiled[name]
        args = params if order is None else tuple(params[n] for n in order)
        if self._held_lock.acquire(blocking=False):
            try:
                conn, cursor = self._held_connection()
                return self._execute(conn, cursor, sql, args)
            finally:
                self._held_lock.release()
        conn = self._connect()  # the held one is busy in another thread
        try:
            cursor = conn.cursor()
            try:
                return self._execute(conn, cursor, sql, args)
            finally:
                cursor.close()
        finally:
            conn.close()  # back to the pool (autocommit: nothing to reset)

    def forget_after_fork(self) -> None:
        """In a forked child: the held connection, and its lock's state, are the parent's; dropped, not
        closed."""
        self._held, self._held_lock = None, threading.Lock()

    def close(self) -> None:
        """Give the held connection back to the pool (before the engine is disposed)."""
        with self._held_lock:
            if self._held is not None:
                self._held[0].close()
                self._held = None

    def _held_connection(self) -> tuple[PoolProxiedConnection, DBAPICursor]:
        """The held connection and its cursor (one cursor serves every statement: it costs to create),
        checked as the pool checks one it hands out."""
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
            if self._lock_limit is not None:  # the held connection is checked out once: bound it here
                _bound_busy_timeout(conn.dbapi_connection, conn.info, self._lock_limit)
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


# -- each use of a pooled connection --


def _guarded_engine(url: str, limits: SessionLimits, autocommit: bool = False) -> Engine:
    """The store's engine (``engine``), each use of its connections guarded as the module docstring says."""
    engine = create_store_engine(url, limits, autocommit)
    if engine.dialect.name != "sqlite":
        event.listen(engine, "checkout", _drop_if_ended)
        if not autocommit:
            event.listen(engine, "connect", _no_driver_prepared)
        event.listen(engine, "handle_error", _read_only_is_a_disconnect)
        return engine

    @event.listens_for(engine, "checkout")
    def _bound_lock_wait(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        _bound_busy_timeout(dbapi_conn, record.info, limits.lock)

    if not autocommit:

        @event.listens_for(engine, "begin")
        def _begin_immediate(conn: Any) -> None:
            if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
                conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _drop_if_ended(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
    """On checkout, replace a connection that the server ended while it sat in the pool, and every
    connection pooled before it (they were most likely ended together); likewise one on a read-only server:
    its reads may be behind the primary's, its writes fail."""
    if _ended_while_idle(dbapi_conn):
        raise InvalidatePoolError("the server ended a pooled connection while it was idle")
    if _on_read_only_server(dbapi_conn):
        raise InvalidatePoolError("a pooled connection's server is read-only (a standby?)")


def _no_driver_prepared(dbapi_conn: Any, _record: Any) -> None:
    """The run transactions' connections: psycopg prepares none of its own statements on them, or a
    ``ROLLBACK`` would make it send ``DEALLOCATE ALL`` and drop the store's too (:mod:`.one_trip`)."""
    dbapi_conn.prepare_threshold = None


def _read_only_is_a_disconnect(context: Any) -> None:
    if read_only(context.original_exception):
        context.is_disconnect = True  # SQLAlchemy then invalidates the connection and its pool


def _unusable(dbapi_conn: Any) -> bool:
    """What the pool's checkout replaces (``_drop_if_ended``), for the held connection."""
    return _ended_while_idle(dbapi_conn) or _on_read_only_server(dbapi_conn)


def _ended_while_idle(dbapi_conn: Any) -> bool:
    """Whether the server ended this idle connection: data or EOF waits on its socket. A connection without
    a socket (SQLite) has no server to end it."""
    fileno = getattr(dbapi_conn, "fileno", None)
    if fileno is None:
        return False
    try:
        poller = select.poll()
        poller.register(fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except Exception:  # the driver already knows it is closed
        return True


def _on_read_only_server(dbapi_conn: Any) -> bool:
    """Whether the server says it takes no writes: a standby (``in_hot_standby``), or a server fenced off
    for a failover (``default_transaction_read_only``). PostgreSQL 14+ reports both to the client at
    connect and on every change, so this costs no round trip; older servers report neither."""
    info = getattr(dbapi_conn, "info", None)
    status = getattr(info, "parameter_status", None)
    if status is None:
        return False
    return "on" in (status("in_hot_standby"), status("default_transaction_read_only"))


def _bound_busy_timeout(dbapi_conn: Any, info: dict[Any, Any], limit: float) -> None:
    """Before a use of a SQLite connection: the store's limit, or this thread's shorter bound."""
    bound = LOCK_WAIT.get()
    ms = int((limit if bound is None else min(limit, bound)) * 1000)
    if info.get(_BUSY_MS) != ms:
        dbapi_conn.execute(f"PRAGMA busy_timeout={ms}")
        info[_BUSY_MS] = ms
