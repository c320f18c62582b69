"""The SQL store's ``fence_*`` tables, for users who run their own Alembic migrations (docs/alembic.md).

- :data:`metadata`: the tables as SQLAlchemy ``MetaData``; add it to ``target_metadata`` so autogenerate
  neither drops the tables nor misses a drift in them.
- :func:`migrate`: create or upgrade the tables *and* what autogenerate cannot create (the audit trigger, its
  plpgsql function on PostgreSQL, the token sequence, the schema-version row); call it from a migration
  with ``op.get_bind()``. Idempotent, in the caller's transaction; the same code as ``celery fence migrate``.
- :func:`include_object`: an Alembic ``include_object`` hook that leaves every ``fence_*`` object out of
  autogenerate, for projects that would rather not list :data:`metadata`.
"""

from __future__ import annotations

from typing import Any

from .stores.sql.schema import SCHEMA_VERSION, metadata, migrate

__all__ = ["SCHEMA_VERSION", "include_object", "metadata", "migrate"]

PREFIX = "fence_"


def include_object(obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any) -> bool:
    """False for the ``fence_*`` tables and everything on them (columns, indexes, constraints), so
    autogenerate never creates, alters or drops them. A user table's ``fence_token`` column stays in."""
    table = name if type_ == "table" else getattr(getattr(obj, "table", None), "name", None)
    return not str(table or "").startswith(PREFIX)
