"""The ``fence_*`` tables, made by the code ``celery fence migrate`` runs (``stores.sql.schema.migrate``)
on the migration's own connection and transaction: one schema, whichever way it was created. Reversing
leaves the tables (their history is the audit trail): drop them by hand if you mean to."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

from ....stores.django.borrowed import BorrowedConnection
from ....stores.sql.schema import migrate


def create_fence_tables(apps: Any, schema_editor: Any) -> None:
    with BorrowedConnection(schema_editor.connection.alias).connect() as conn:
        migrate(conn)


class Migration(migrations.Migration):
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [
        migrations.RunPython(create_fence_tables, migrations.RunPython.noop, elidable=False)
    ]
