"""The SQL store (PostgreSQL and SQLite on SQLAlchemy Core): ``store`` (the operations), ``queries`` (every
statement's text), ``statements`` (what the statements take and give back: the guard, the refusal and the
parameters that the store and a run's transaction share), ``driver`` (how a statement reaches the
database: the connections, each checked before use, and where driver errors are caught), ``engine`` (how an
engine is made), ``errors`` (what a driver error means), ``schema`` (the ``fence_*`` tables), ``run`` (a
run's transaction), ``session`` (the ORM session on it), ``recovery``, and ``url`` (every check of a
store URL, before it connects)."""

from .store import SQLStore

__all__ = ["SQLStore"]
