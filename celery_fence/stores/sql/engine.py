"""Engines for the SQL store (its errors become celery-fence errors in ``errors``).

A store has two engines on the same database and session settings: one for explicit transactions, and one
in autocommit for the single statements (no ``BEGIN``/``COMMIT`` around them, and no reset ``ROLLBACK``
when a connection goes back to the pool: with no transaction there is nothing to reset).

PostgreSQL sessions carry timeouts so that a paused holder cannot block a takeover for ever
(``idle_in_transaction_session_timeout``, ``lock_timeout``, ``statement_timeout``) and a dead link fails fast
(``tcp_user_timeout``, keepalives), and a pooled connection that the server ended while it sat idle is
replaced before a statement is sent on it (``_drop_if_ended``). SQLite runs in WAL mode with
``busy_timeout`` (shortened per thread by ``waits.lock_wait``: ``lock``) and opens its transactions
with ``BEGIN IMMEDIATE`` (a deferred transaction that reads then writes fails with "database is locked").
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import (
    InvalidatePoolError,
    NoSuchModuleError,
)

from ...errors import ConfigurationError
from ..liveness import idle_socket_is_readable
from ..urls import mask_url
from .errors import read_only
from .lock import apply_busy_timeout, remember_busy_limit
from .url import check_sql_url

__all__ = [
    "SessionLimits",
    "create_store_engine",
    "ended_while_idle",
    "on_read_only_server",
]


@dataclass(frozen=True)
class SessionLimits:
    """Server-side limits of the store's sessions, in seconds."""

    idle_in_transaction: float = 5.0
    lock: float = 5.0
    statement: float = 10.0
    tcp_user: float = 5.0
    connect: float = 5.0


def create_store_engine(url: str, limits: SessionLimits, autocommit: bool = False) -> Engine:
    """An engine for explicit transactions, or (``autocommit``) for one statement per transaction."""
    parsed = check_sql_url(url)
    try:
        if parsed.get_backend_name() == "sqlite":
            return _sqlite_engine(parsed, limits, autocommit)
        if parsed.drivername in {"postgresql", "postgres"}:
            parsed = parsed.set(drivername="postgresql+psycopg")
        return _postgres_engine(parsed, limits, autocommit)
    except (NoSuchModuleError, ImportError) as exc:
        raise ConfigurationError(
            f"cannot load the driver for {mask_url(url)!r} ({exc}): pip install 'celery-fence[postgres]'"
        ) from exc


def _pool_options(autocommit: bool) -> dict[str, Any]:
    return {"isolation_level": "AUTOCOMMIT", "pool_reset_on_return": None} if autocommit else {}


def _postgres_engine(url: Any, limits: SessionLimits, autocommit: bool) -> Engine:
    ms = {k: int(v * 1000) for k, v in vars(limits).items()}
    options = (
        f"-c idle_in_transaction_session_timeout={ms['idle_in_transaction']}"
        f" -c lock_timeout={ms['lock']} -c statement_timeout={ms['statement']}"
    )
    if "options" in url.query:  # keep the user's own (e.g. a search_path): ours come first, theirs win
        options = f"{options} {url.query['options']}"
        url = url.difference_update_query(["options"])
    connect_args = {
        "options": options,
        "application_name": "celery-fence",
        "connect_timeout": max(1, int(limits.connect)),
        "tcp_user_timeout": ms["tcp_user"],
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 2,
    }
    # The single statements are the hot path (a run's thread and the renewer); transactions are rarer.
    pool_size = 2 if autocommit else 1
    engine = create_engine(
        url, connect_args=connect_args, pool_size=pool_size, max_overflow=8, **_pool_options(autocommit)
    )
    event.listen(engine, "checkout", _drop_if_ended)
    event.listen(engine, "handle_error", _read_only_is_a_disconnect)
    return engine


def ended_while_idle(dbapi_conn: Any) -> bool:
    """Whether the server ended this idle connection (see ``liveness``). A connection without a socket
    (SQLite) has no server to end it."""
    fileno = getattr(dbapi_conn, "fileno", None)
    if fileno is None:
        return False
    try:
        return idle_socket_is_readable(fileno())
    except Exception:  # the driver already knows it is closed
        return True


def on_read_only_server(dbapi_conn: Any) -> bool:
    """Whether the server says it takes no writes: a standby (``in_hot_standby``), or a server fenced off
    for a failover (``default_transaction_read_only``). PostgreSQL 14+ reports both to the client at
    connect and on every change, so this costs no round trip; older servers report neither."""
    info = getattr(dbapi_conn, "info", None)
    status = getattr(info, "parameter_status", None)
    if status is None:
        return False
    return "on" in (status("in_hot_standby"), status("default_transaction_read_only"))


def _drop_if_ended(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
    """On checkout, replace a connection that the server ended while it sat in the pool, and every
    connection pooled before it (they were most likely ended together), before a statement is sent on it:
    a statement that failed there could not be told apart from one that ran and lost its reply. Likewise
    one on a read-only server: its reads may be behind the primary's, its writes fail."""
    if ended_while_idle(dbapi_conn):
        raise InvalidatePoolError("the server ended a pooled connection while it was idle")
    if on_read_only_server(dbapi_conn):
        raise InvalidatePoolError("a pooled connection's server is read-only (a standby?)")


def _sqlite_engine(url: Any, limits: SessionLimits, autocommit: bool) -> Engine:
    connect_args = {"timeout": limits.lock, "check_same_thread": False}
    engine = create_engine(url, connect_args=connect_args, **_pool_options(autocommit))

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (SQLAlchemy's documented pattern)
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        remember_busy_limit(dbapi_conn, record.info, limits.lock)
        dbapi_conn.execute("PRAGMA synchronous=FULL")  # a lost commit could rewind the token counter

    @event.listens_for(engine, "checkout")
    def _bound_lock_wait(dbapi_conn: sqlite3.Connection, record: Any, _proxy: Any) -> None:
        apply_busy_timeout(dbapi_conn, record.info)  # this thread's lock_wait(), if shorter

    if not autocommit:

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            if conn.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
                conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def _read_only_is_a_disconnect(context: Any) -> None:
    if read_only(context.original_exception):
        context.is_disconnect = True  # SQLAlchemy then invalidates the connection and its pool
