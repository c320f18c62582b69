"""The SQL store (PostgreSQL and SQLite on SQLAlchemy Core): ``store`` (the operations), ``queries`` (every
statement), ``statements`` (the guard, the refusal and the parameters that the store and a run's
transaction share), ``schema`` (the ``fence_*`` tables), ``engine`` (engines, error mapping), ``driver``
(the hot statements on a held connection), ``run`` (a run's transaction), ``recovery``, ``lock``
(SQLite's write lock), ``rows``, and ``url`` (every check of a store URL, before it connects)."""

from .store import SQLStore

__all__ = ["SQLStore"]
