"""SQLite's write lock: how long a connection waits for it, and what giving up says.

Each SQLite connection's busy timeout is its store's ``SessionLimits.lock``, or the caller's bound
(:func:`~celery_fence.stores.waits.lock_wait`) when that is shorter. It is set before each use of the
connection (a pool checkout, and each hot statement on the held connection), only when it changes: a
``PRAGMA`` in the process, no I/O. Readers never wait for it (WAL): only writes and ``BEGIN IMMEDIATE`` do.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from sqlalchemy.engine import make_url

from ..urls import mask_url
from ..waits import current_lock_wait

__all__ = ["apply_busy_timeout", "is_locked", "locked_message", "remember_busy_limit"]

_LIMIT = "fence_busy_limit"  # keys of the pool entry's ``info``: the store's limit, in seconds
_SET = "fence_busy_ms"  # the busy timeout the connection has now, in milliseconds
_SQLITE_BUSY = 5  # the primary result code; the extended ones (BUSY_RECOVERY...) keep it in the low byte


def remember_busy_limit(dbapi_conn: sqlite3.Connection, info: dict[Any, Any], limit: float) -> None:
    """On connect: the connection waits ``limit`` seconds for the write lock until told otherwise."""
    info[_LIMIT] = limit
    _set(dbapi_conn, info, int(limit * 1000))


def apply_busy_timeout(dbapi_conn: sqlite3.Connection, info: dict[Any, Any]) -> None:
    """Before a use: the store's limit, or the current thread's shorter bound."""
    limit = info.get(_LIMIT)
    if limit is None:  # not a connection of ours
        return
    bound = current_lock_wait()
    ms = int((limit if bound is None else min(limit, bound)) * 1000)
    if info.get(_SET) != ms:
        _set(dbapi_conn, info, ms)


def _set(dbapi_conn: sqlite3.Connection, info: dict[Any, Any], ms: int) -> None:
    dbapi_conn.execute(f"PRAGMA busy_timeout={ms}")
    info[_SET] = ms


def is_locked(orig: BaseException | None) -> bool:
    """Whether SQLite gave up waiting for a lock (``SQLITE_BUSY`` and its extended codes)."""
    if not isinstance(orig, sqlite3.OperationalError):
        return False
    code = getattr(orig, "sqlite_errorcode", None)
    return (code & 0xFF) == _SQLITE_BUSY if code is not None else "database is locked" in str(orig)


def locked_message(url: str) -> str:
    """Names the cause and where to look, for a ``StoreUnavailable``."""
    try:
        path = make_url(url).database or "the database file"
    except Exception:  # a URL SQLAlchemy parsed to connect parses again; never fail a message
        path = "the database file"
    return (
        f"fence store {mask_url(url)}: the SQLite database is locked by another process's open transaction "
        "(a stopped or slow worker?): gave up waiting for its write lock, nothing was written. Find the "
        f"process holding {path} open (fuser {path}) and let it finish, resume it (kill -CONT) or stop it; "
        "then run this again (a worker retries by itself)"
    )
