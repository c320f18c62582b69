"""What the SQL store declares before it connects: its capabilities, and the checks of its URL (the file a
SQLite store lives in is checked before anything opens it: SQLite creates a missing file, but not its
directory, and then says only "unable to open database file")."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from ...errors import ConfigurationError
from ..capabilities import Capabilities
from ..urls import mask_url
from .dialects import check_sql_driver
from .engine import SessionLimits, check_sql_url

__all__ = ["check_sql_store_url", "check_sqlite_directory", "sql_capabilities", "sqlite_file"]


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


def sql_capabilities(url: str) -> Capabilities:
    """SQLite: one write lock for every writer, waited for up to its busy timeout; its file must exist
    before a read. Both: the run's transaction shares the database with the user's tables."""
    if check_sql_url(url).get_backend_name() != "sqlite":  # a malformed URL: ConfigurationError, masked
        return Capabilities(name="PostgreSQL", transactions=True, default_port=5432)
    lock_wait, path = SessionLimits().lock, sqlite_file(url)
    return Capabilities(name="SQLite", transactions=True, write_lock_wait=lock_wait, local_file=path)


def check_sql_store_url(url: str) -> None:
    """What no SQL engine can work with, refused without a round trip."""
    check_sql_driver(check_sql_url(url))
    check_sqlite_directory(url)
