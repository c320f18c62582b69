"""The SQL store (PostgreSQL and SQLite on SQLAlchemy Core): ``store`` (the operations), ``queries`` (every
statement), ``schema`` (the ``fence_*`` tables), ``engine`` (engines, error mapping), ``driver`` (the hot
statements on a held connection), ``run`` (a run's transaction), ``recovery``, ``lock`` (SQLite's write
lock), ``rows`` and ``files`` (what the store declares before it connects)."""

from .store import SQLStore

__all__ = ["SQLStore"]
