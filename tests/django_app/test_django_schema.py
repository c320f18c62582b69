"""The ``fence_*`` schema ``manage.py migrate`` makes (the Django app's migration) is the one
``celery fence migrate`` makes: the same tables, columns, keys, indexes, triggers and version row, read back
from each database, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, create_engine, inspect, text

from celery_fence.stores.django.store import database_url
from celery_fence.stores.sql import SQLStore
from celery_fence.stores.sql.schema import metadata

TABLES = sorted(metadata.tables)


def describe(conn: Connection, schema: str | None = None) -> dict[str, Any]:
    """What a database holds of the fence schema, read back (``schema``: PostgreSQL's, else the default)."""
    found = inspect(conn)
    tables = {
        table: {
            "columns": [
                (c["name"], str(c["type"]), c["nullable"], c.get("default"))
                for c in found.get_columns(table, schema=schema)
            ],
            "primary key": found.get_pk_constraint(table, schema=schema)["constrained_columns"],
            "indexes": sorted(
                (i["name"], tuple(i["column_names"]), bool(i["unique"]))
                for i in found.get_indexes(table, schema=schema)
            ),
        }
        for table in TABLES
    }
    where = "" if schema is None else f"{schema}."
    meta = conn.execute(text(f"SELECT name, value FROM {where}fence_meta ORDER BY name")).all()
    described = {"tables": tables, "triggers": triggers(conn, schema), "meta": [tuple(r) for r in meta]}
    return unqualified(described, schema) if schema else described


def unqualified(found: Any, schema: str) -> Any:
    """``found`` with the schema's name taken out of the names PostgreSQL qualifies (a default's sequence)."""
    if isinstance(found, str):
        return found.replace(f'"{schema}".', "").replace(f"{schema}.", "")
    if isinstance(found, dict):
        return {key: unqualified(value, schema) for key, value in found.items()}
    if isinstance(found, (list, tuple)):
        return type(found)(unqualified(value, schema) for value in found)
    return found


def triggers(conn: Connection, schema: str | None) -> list[tuple[str, ...]]:
    if conn.dialect.name == "sqlite":
        rows = conn.execute(text("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' ORDER BY name"))
        return [tuple(r) for r in rows]
    query = text(
        "SELECT trigger_name, event_manipulation, action_timing, action_condition, action_statement"
        " FROM information_schema.triggers WHERE event_object_schema = :s ORDER BY 1, 2"
    )
    rows = conn.execute(query, {"s": schema}).all()
    functions = conn.execute(
        text("SELECT proname FROM pg_proc JOIN pg_namespace n ON n.oid = pronamespace WHERE nspname = :s"
             " AND proname LIKE 'fence%' ORDER BY 1"),
        {"s": schema},
    ).all()
    sequences = conn.execute(
        text("SELECT sequencename, max_value FROM pg_sequences WHERE schemaname = :s"
             " AND sequencename LIKE 'fence%' ORDER BY 1"),
        {"s": schema},
    ).all()
    return [tuple(r) for r in rows] + [("function", r[0]) for r in functions] + [
        ("sequence", r[0], str(r[1])) for r in sequences
    ]


@pytest.fixture
def fresh_schema(migrated_postgres: str) -> Iterator[tuple[str, str]]:
    """The Django database's URL, and a schema of it that ``celery fence migrate`` made."""
    url = database_url(migrated_postgres)
    admin = create_engine(url)
    with admin.begin() as conn:
        conn.execute(text("DROP SCHEMA IF EXISTS fence_fresh CASCADE"))
        conn.execute(text("CREATE SCHEMA fence_fresh"))
    store = SQLStore(f"{url}?options=-csearch_path%3Dfence_fresh")
    store.migrate()  # what `celery fence migrate` runs
    store.close()
    yield url, "fence_fresh"
    with admin.begin() as conn:
        conn.execute(text("DROP SCHEMA fence_fresh CASCADE"))
    admin.dispose()


def test_the_django_migration_makes_the_schema_celery_fence_migrate_makes_on_sqlite(
    migrated_sqlite: str, tmp_path: Path
) -> None:
    store = SQLStore(f"sqlite:///{tmp_path / 'fresh.db'}")
    store.migrate()
    store.close()
    made_by_django, made_by_migrate = create_engine(database_url(migrated_sqlite)), store.engine
    with made_by_django.connect() as django_conn, made_by_migrate.connect() as fence_conn:
        by_django = describe(django_conn)
        assert by_django == describe(fence_conn)
    made_by_django.dispose()
    assert set(by_django["tables"]) == {
        "fence_counter", "fence_history", "fence_leases", "fence_meta", "fence_steps"
    }
    assert len(by_django["triggers"]) == 5


@pytest.mark.postgres
def test_the_django_migration_makes_the_schema_celery_fence_migrate_makes_on_postgresql(
    fresh_schema: tuple[str, str],
) -> None:
    url, fresh = fresh_schema
    engine = create_engine(url)
    with engine.connect() as conn:
        by_django, by_migrate = describe(conn, "public"), describe(conn, fresh)
    engine.dispose()
    assert by_django == by_migrate
    # the triggers (audit: INSERT and UPDATE; rewind), 3 functions (theirs, fence_unchanged), 3 sequences
    # (the tokens', the ids')
    assert len(by_django["triggers"]) == 3 + 3 + 3
