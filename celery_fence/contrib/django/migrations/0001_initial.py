"""The ``fence_*`` tables, made by the code ``celery fence migrate`` runs (``stores.sql.schema.migrate``)
on the migration's own connection and transaction: one schema, whichever way it was created. Reversing
leaves the tables (their history is the audit trail): drop them by hand if you mean to."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

from . import migrate_fence_tables


class Migration(migrations.Migration):
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [
        migrations.RunPython(migrate_fence_tables, migrations.RunPython.noop, elidable=False)
    ]
