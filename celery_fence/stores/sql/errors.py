"""What the SQL store's drivers (psycopg, sqlite3) raise means, as a celery-fence error: decided here and
nowhere else.

A driver error is read for what it says (its SQLSTATE, its PEP 249 class, whether the connection was lost)
the same way whichever path it came by: wrapped by SQLAlchemy, or raw from the driver's own cursor. Both are
caught where statements are sent (``driver``) and handed here; the caller's own statements in a fenced
transaction keep their errors, except what waiting heals (:func:`user_statement_errors`).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from ...errors import ConfigurationError, FenceError, InvalidArgument, StoreUnavailable, TokenRewound
from ..base import out_of_tokens
from ..urls import mask_url
from .schema import RANGE_EXHAUSTED

__all__ = [
    "RowLocked",
    "driver_error",
    "not_sent",
    "read_only",
    "safe_url",
    "user_statement_errors",
]

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


class Unchanged(FenceError):
    """A completion or a fenced commit's claim changed no row, and failed its transaction on purpose
    (PostgreSQL's ``fence_unchanged()``, FE002): nothing of it committed. The caller reads the key to say
    why (a newer token, or the key finished by another run)."""


def driver_error(url: str, orig: BaseException, lost: bool) -> FenceError:
    """What driver exception ``orig`` means to a caller; ``lost``: the connection is gone with it (the
    statement's outcome is unknown unless the server said otherwise)."""
    message = str(orig).splitlines()[0] if str(orig) else type(orig).__name__
    code = getattr(orig, "sqlstate", None)
    if code == "FE002":
        return Unchanged(message)
    if code == "55P03":
        return RowLocked(f"fence store {safe_url(url)}: a row is locked: {message}")
    if _is_locked(orig):  # SQLite's busy timeout ran out: another process holds the write lock
        return StoreUnavailable(_locked_message(url))
    refused = _connection_refused_for_good(str(orig))
    if refused is not None:
        return ConfigurationError(f"fence store {safe_url(url)}: {refused}")
    if code == "42501":  # insufficient privilege: no wait heals it (typically the tables are not made yet)
        return ConfigurationError(
            f"fence store {safe_url(url)}: {message}: this database role may not create or "
            "use the fence_* tables; create them with 'celery -A yourapp fence migrate' (or your own "
            "migrations, docs/alembic.md) as a role that may, and grant this one their use"
        )
    return _refusal(url, orig, message, code, lost)


# What a PostgreSQL server answers at connect (libpq reports it with no SQLSTATE) that no wait can heal:
# the fix is in fence_store_url or on the server. A server in another language says it in that language,
# and its refusal stays StoreUnavailable.
_NAME_ONE = "create it, or name one that does in fence_store_url"
_REFUSED_FOR_GOOD = (
    (r'database "([^"]*)" does not exist', "the database {0!r} does not exist: " + _NAME_ONE),
    (r'role "([^"]*)" does not exist', "the role {0!r} does not exist: " + _NAME_ONE),
    (
        r'password authentication failed for user "([^"]*)"',
        "the server refused the password of {0!r}: correct it in fence_store_url",
    ),
    (r"no pg_hba\.conf entry for host", "the server's pg_hba.conf does not let this host and role in"),
)


def _connection_refused_for_good(text: str) -> str | None:
    for pattern, says in _REFUSED_FOR_GOOD:
        found = re.search(pattern, text)
        if found is not None:
            return says.format(*found.groups())
    return None


def not_sent(url: str, exc: BaseException) -> FenceError:
    """An exception that is not the driver's refusal: it could not even send a parameter."""
    if isinstance(exc, (ValueError, OverflowError)):  # UnicodeError is a ValueError: the value is the problem
        return InvalidArgument(f"the store cannot take this value: {exc}")
    return StoreUnavailable(f"fence store {safe_url(url)} failed: {exc}")


def _refusal(url: str, orig: BaseException, message: str, code: str | None, lost: bool) -> FenceError:
    if code == "FE001" or "fence token counter rewound" in str(orig):
        return TokenRewound(f"{message}: run 'celery fence advance' on {safe_url(url)}")
    if code == "2200H" or RANGE_EXHAUSTED in str(orig):  # the token sequence reached its MAXVALUE
        return out_of_tokens()
    if _is_a(orig, "IntegrityError"):
        return InvalidArgument(f"the store refused a duplicate: {message}")
    # Class 22 is "data exception" (a value out of range, NUL in text...): waiting cannot heal it.
    if (code or "").startswith("22") or _is_a(orig, "DataError") or isinstance(orig, OverflowError):
        return InvalidArgument(f"the store refused a value: {message}")
    if lost or code in _PG_UNAVAILABLE or isinstance(orig, sqlite3.OperationalError):
        return StoreUnavailable(f"fence store {safe_url(url)} unavailable: {message}")
    return StoreUnavailable(f"fence store {safe_url(url)} failed: {message}")


def _is_a(orig: BaseException, pep249_class: str) -> bool:
    """Whether ``orig`` is the driver's ``pep249_class`` (every DB-API driver names its classes alike)."""
    return any(cls.__name__ == pep249_class for cls in type(orig).__mro__)


def safe_url(url: str) -> str:
    """``url`` with its password hidden, for messages."""
    return mask_url(url)


# -- SQLite's write lock --

_SQLITE_BUSY = 5  # the primary result code; the extended ones (BUSY_RECOVERY...) keep it in the low byte


def _is_locked(orig: BaseException | None) -> bool:
    """Whether SQLite gave up waiting for a lock (``SQLITE_BUSY`` and its extended codes)."""
    if not isinstance(orig, sqlite3.OperationalError):
        return False
    code = getattr(orig, "sqlite_errorcode", None)
    return (code & 0xFF) == _SQLITE_BUSY if code is not None else "database is locked" in str(orig)


def _locked_message(url: str) -> str:
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
