"""Every check of a SQL store URL, all without I/O: the form, the driver (asyncpg is async only; a driver
must be installed), the directory of a SQLite file (SQLite creates a missing file, but not its directory,
and then says only "unable to open database file"), and PostgreSQL's multi-host form.

libpq takes several servers in one URL and connects to the first that answers and suits
``target_session_attrs``; in SQLAlchemy's form the servers are repeated ``host`` query parameters:
``postgresql+psycopg://user:pw@/db?host=h1:5432&host=h2:5432&target_session_attrs=read-write``. The store
writes on every call, and reads what it must trust after a lost reply (docs/guarantees.md#the-guarantees):
a list of servers that may connect to a standby (which answers reads from its own, possibly older, copy) is
refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from ...errors import ConfigurationError
from ..drivers import require_driver
from ..urls import mask_url

__all__ = [
    "check_sql_driver",
    "check_sql_store_url",
    "check_sql_url",
    "check_sqlite_directory",
    "sqlite_file",
]

# What libpq calls a server that takes writes: a multi-host URL must ask for one of these.
_WRITABLE = ("read-write", "primary")
_POSTGRES_DRIVERS = {"psycopg": "psycopg", "psycopg2": "psycopg2", "pg8000": "pg8000"}  # suffix: module


def check_sql_store_url(url: str) -> None:
    """What no SQL engine can work with, refused without a round trip."""
    check_sql_driver(check_sql_url(url))
    check_sqlite_directory(url)


def check_sql_url(url: str) -> Any:
    """The parsed ``url``, or ``ConfigurationError`` for what no engine can work with (no I/O)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # a bad port is a ValueError; the cause would repeat the password
        raise ConfigurationError(
            f"malformed fence store URL {mask_url(url)!r}: use dialect[+driver]://[user[:password]@]host"
            "[:port]/database (the port a number)"
        ) from None
    if parsed.get_backend_name() == "sqlite" and (
        parsed.database in (None, "", ":memory:") or "mode=memory" in str(parsed)
    ):
        raise ConfigurationError(
            "an in-memory SQLite database is private to one connection; use 'memory://' for an "
            "in-process store or 'sqlite:///path/to/fence.db' for a file"
        )
    if parsed.get_backend_name() == "postgresql":
        _check_hosts(url, parsed)
    return parsed


def _check_hosts(url: str, parsed: Any) -> None:
    """The servers are the ``host`` query parameters when there are any (they win over a host before the
    ``/``, as SQLAlchemy passes them: ``user@localhost/db?host=/run/postgresql`` is one server)."""
    hosts = parsed.query.get("host", ())
    hosts = [name for entry in ((hosts,) if isinstance(hosts, str) else hosts) for name in entry.split(",")]
    if len(hosts) <= 1:  # libpq's own form, host=h1,h2, counts as two
        return
    if parsed.query.get("target_session_attrs") not in _WRITABLE:
        raise ConfigurationError(
            f"fence store URL {mask_url(url)!r} lists {len(hosts)} servers without "
            "'target_session_attrs=read-write': libpq could connect to a standby, whose reads may be "
            "behind the primary and whose writes fail; add '&target_session_attrs=read-write'"
        )


def check_sql_driver(parsed: Any) -> None:
    """``parsed`` is SQLAlchemy's URL. SQLite's driver is the standard library's."""
    backend, _, suffix = parsed.drivername.partition("+")
    if backend == "sqlite":
        return
    if suffix == "asyncpg":
        raise ConfigurationError("asyncpg is async-only; use 'postgresql+psycopg://' (Celery tasks are sync)")
    module = _POSTGRES_DRIVERS.get(suffix or "psycopg", suffix)
    require_driver("postgresql", module, "postgres" if module == "psycopg" else None)


def sqlite_file(url: str) -> Path | None:
    """The file a ``sqlite://`` URL names; ``None`` for PostgreSQL, a ``file:`` URI, or a URL the store
    refuses itself (malformed)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):  # a bad port is a ValueError
        return None
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database.startswith("file:"):
        return None
    return Path(database)


def check_sqlite_directory(url: str) -> None:
    """A run would take "unable to open database file" for an outage and wait it out: refuse at once."""
    path = sqlite_file(url)
    if path is None or path.parent.is_dir():
        return
    raise ConfigurationError(
        f"fence_store_url {mask_url(url)!r}: the directory {path.parent.resolve()} does not exist, so "
        f"SQLite cannot create {path.name} in it; create the directory, or point fence_store_url at one "
        f"that exists (a relative path is relative to the worker's current directory, {Path.cwd()})"
    )
