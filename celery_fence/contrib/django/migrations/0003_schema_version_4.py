"""Schema version 4 (``fence_unchanged()`` on PostgreSQL, the fenced commit's history event) for a database
that ``0001_initial`` made at an earlier version: the same upgrade ``celery fence migrate`` makes (every step
of ``stores.sql.schema.migrate`` is idempotent, so on a new database this changes nothing)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

from . import migrate_fence_tables


class Migration(migrations.Migration):
    dependencies: ClassVar[list[tuple[str, str]]] = [("celery_fence", "0002_leases_and_history")]
    operations: ClassVar[list[Any]] = [
        migrations.RunPython(migrate_fence_tables, migrations.RunPython.noop, elidable=False)
    ]
