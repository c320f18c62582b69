"""How the SQL store's engines are made: the database's session settings, the pools, and what a
connection is set to when it opens (each use of one is guarded in ``driver``).

A store has two engines on the same database and session settings: one for explicit transactions, and one
in autocommit for the single statements (no ``BEGIN``/``COMMIT`` around them, and no reset ``ROLLBACK``
when a connection goes back to the pool: with no transaction there is nothing to reset).

PostgreSQL sessions carry timeouts so that a paused holder cannot block a takeover for ever
(``idle_in_transaction_session_timeout``, ``lock_timeout``, ``statement_timeout``) and a dead link fails fast
(``tcp_user_timeout``, keepalives). SQLite runs in WAL mode, with ``synchronous=FULL`` and the store's
``busy_timeout`` (``SessionLimits.lock``).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import NoSuchModuleError

from ...errors import ConfigurationError
from ..urls import mask_url
from .url import check_sql_url

__all__ = ["SessionLimits", "create_store_engine"]


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
    return create_engine(
        url, connect_args=connect_args, pool_size=pool_size, max_overflow=8, **_pool_options(autocommit)
    )


def _sqlite_engine(url: Any, limits: SessionLimits, autocommit: bool) -> Engine:
    connect_args = {"timeout": limits.lock, "check_same_thread": False}
    engine = create_engine(url, connect_args=connect_args, **_pool_options(autocommit))

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, record: Any) -> None:
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves (SQLAlchemy's documented pattern)
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA synchronous=FULL")  # a lost commit could rewind the token counter

    return engine
