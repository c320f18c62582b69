"""Engines for the SQL store, and the one place where driver errors become celery-fence errors.

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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import (
    DataError,
    DBAPIError,
    IntegrityError,
    InvalidatePoolError,
    NoSuchModuleError,
    SQLAlchemyError,
    StatementError,
)

from ...errors import ConfigurationError, FenceError, InvalidArgument, StoreUnavailable, TokenRewound
from ..liveness import idle_socket_is_readable
from ..urls import mask_url
from ..validation import out_of_tokens
from .lock import apply_busy_timeout, is_locked, locked_message, remember_busy_limit
from .schema import RANGE_EXHAUSTED
from .url import check_sql_url

__all__ = [
    "RowLocked",
    "SessionLimits",
    "check_sql_url",
    "create_store_engine",
    "ended_while_idle",
    "on_read_only_server",
    "read_only",
    "safe_url",
    "translate_errors",
    "user_statement_errors",
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


_PG_UNAVAILABLE = {
    "55P03",
    "57014",
    "57P01",
    "57P02",
    "57P03",
    "53300",
    "08000",
    "08003",
    "08006",
    "25P03",
    "25006",  # read_only_sql_transaction: a standby, or a server being fenced off (see read_only)
}
READ_ONLY = "25006"


def read_only(exc: BaseException) -> bool:
    """A write refused by a read-only server (before it did anything): a standby not yet promoted, or a
    primary made read-only for a failover. The connection is replaced like a lost one, so the next
    statement asks libpq for the read-write server of the URL again."""
    return getattr(exc, "sqlstate", None) == READ_ONLY


def _read_only_is_a_disconnect(context: Any) -> None:
    if read_only(context.original_exception):
        context.is_disconnect = True  # SQLAlchemy then invalidates the connection and its pool


@contextmanager
def translate_errors(url: str) -> Iterator[None]:
    """Translate SQLAlchemy and driver exceptions; nothing else may leak to callers."""
    try:
        yield
    except FenceError:
        raise
    except DBAPIError as exc:
        raise _translate_dbapi(url, exc) from exc
    except StatementError as exc:  # the driver could not even send a parameter: the value is the problem
        if isinstance(exc.orig, (ValueError, OverflowError)):  # UnicodeError is a ValueError
            raise InvalidArgument(f"the store cannot take this value: {exc.orig}") from exc
        raise StoreUnavailable(f"fence store {safe_url(url)} failed: {exc}") from exc
    except SQLAlchemyError as exc:
        raise StoreUnavailable(f"fence store {safe_url(url)} failed: {exc}") from exc


# The caller's statements in a fenced transaction fail for these without any fault of theirs: the
# session's own timeouts (statement, lock, idle in transaction), a deadlock or serialization failure, the
# server going away. Nothing was committed and running again can succeed, so they are StoreUnavailable.
_TRANSIENT_IN_TRANSACTION = {"57014", "55P03", "25P03", "40001", "40P01"} | _PG_UNAVAILABLE


@contextmanager
def user_statement_errors(url: str) -> Iterator[None]:
    """Around the caller's own statements in a fenced transaction: their errors stay theirs, except what
    waiting can heal (a lost connection, a session timeout, a deadlock), which is ``StoreUnavailable``."""
    try:
        yield
    except DBAPIError as exc:
        code = getattr(exc.orig, "sqlstate", None)
        if not exc.connection_invalidated and code not in _TRANSIENT_IN_TRANSACTION:
            raise
        first = str(exc.orig).splitlines()[0] if str(exc.orig) else type(exc.orig).__name__
        raise StoreUnavailable(
            f"fence store {safe_url(url)}: the run's transaction failed ({first}); nothing of it was "
            "committed, the run will run again"
        ) from exc


class RowLocked(StoreUnavailable):
    """A statement met a row lock it would not wait for (PostgreSQL 55P03): an acquire reads it as held."""


def _translate_dbapi(url: str, exc: DBAPIError) -> FenceError:
    message = str(exc.orig)
    code = getattr(exc.orig, "sqlstate", None)
    if code == "55P03":
        return RowLocked(f"fence store {safe_url(url)}: a row is locked: {message.splitlines()[0]}")
    if is_locked(exc.orig):  # SQLite's busy timeout ran out: another process holds the write lock
        return StoreUnavailable(locked_message(url))
    if code == "42501":  # insufficient privilege: no wait heals it (typically the tables are not made yet)
        return ConfigurationError(
            f"fence store {safe_url(url)}: {message.splitlines()[0]}: this database role may not create or "
            "use the fence_* tables; create them with 'celery -A yourapp fence migrate' (or your own "
            "migrations, docs/alembic.md) as a role that may, and grant this one their use"
        )
    return _translate_refusal(url, exc, message, code)


def _translate_refusal(url: str, exc: DBAPIError, message: str, code: str | None) -> FenceError:
    if code == "FE001" or "fence token counter rewound" in message:
        return TokenRewound(f"{message.splitlines()[0]}: run 'celery fence advance' on {safe_url(url)}")
    if code == "2200H" or RANGE_EXHAUSTED in message:  # the token sequence reached its MAXVALUE
        return out_of_tokens()
    if isinstance(exc, IntegrityError):
        return InvalidArgument(f"the store refused a duplicate: {message.splitlines()[0]}")
    # Class 22 is "data exception" (a value out of range, NUL in text...): waiting cannot heal it.
    if (code or "").startswith("22") or isinstance(exc, DataError) or isinstance(exc.orig, OverflowError):
        return InvalidArgument(f"the store refused a value: {message.splitlines()[0]}")
    if (
        exc.connection_invalidated
        or code in _PG_UNAVAILABLE
        or isinstance(exc.orig, sqlite3.OperationalError)
    ):
        return StoreUnavailable(f"fence store {safe_url(url)} unavailable: {message.splitlines()[0]}")
    return StoreUnavailable(f"fence store {safe_url(url)} failed: {message.splitlines()[0]}")


def safe_url(url: str) -> str:
    """``url`` with its password hidden, for messages."""
    return mask_url(url)
