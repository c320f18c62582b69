"""The Django app's migrations: each schema change is the code ``celery fence migrate`` runs."""

from __future__ import annotations

from typing import Any

from ....stores.django.borrowed import BorrowedConnection
from ....stores.sql.schema import migrate


def migrate_fence_tables(apps: Any, schema_editor: Any) -> None:
    """``stores.sql.schema.migrate`` on the migration's own connection and transaction (idempotent)."""
    with BorrowedConnection(schema_editor.connection.alias).connect() as conn:
        migrate(conn)
