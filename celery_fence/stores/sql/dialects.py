"""Which database and driver a SQL store URL names, refused before any engine exists: asyncpg (async only)
and a driver that is not installed."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigurationError
from ..drivers import require_driver

__all__ = ["check_sql_driver"]

_POSTGRES_DRIVERS = {"psycopg": "psycopg", "psycopg2": "psycopg2", "pg8000": "pg8000"}  # suffix: module


def check_sql_driver(parsed: Any) -> None:
    """``parsed`` is SQLAlchemy's URL. SQLite's driver is the standard library's."""
    backend, _, suffix = parsed.drivername.partition("+")
    if backend == "sqlite":
        return
    if suffix == "asyncpg":
        raise ConfigurationError("asyncpg is async-only; use 'postgresql+psycopg://' (Celery tasks are sync)")
    module = _POSTGRES_DRIVERS.get(suffix or "psycopg", suffix)
    require_driver("postgresql", module, "postgres" if module == "psycopg" else None)
