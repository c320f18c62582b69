"""The read-only models of the admin pages (``models``): unmanaged, so this migration changes no table.
Made by ``makemigrations`` (Django 5.2)."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies: ClassVar[list[tuple[str, str]]] = [("celery_fence", "0001_initial")]

    operations: ClassVar[list[Any]] = [
        migrations.CreateModel(
            name="HistoryEvent",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("key", models.CharField(max_length=1024)),
                ("at", models.FloatField()),
                ("event", models.CharField(max_length=32)),
                ("token", models.BigIntegerField()),
                ("owner", models.CharField(max_length=512, null=True)),
                ("detail", models.TextField(null=True)),
            ],
            options={
                "verbose_name": "history event",
                "db_table": "fence_history",
                "ordering": ("id",),
                "managed": False,
            },
        ),
        migrations.CreateModel(
            name="Lease",
            fields=[
                ("key", models.CharField(max_length=1024, primary_key=True, serialize=False)),
                ("token", models.BigIntegerField()),
                ("owner", models.CharField(max_length=512, null=True)),
                ("expires_at", models.FloatField(null=True)),
                ("done", models.BooleanField(default=False)),
                ("result", models.TextField(null=True)),
                ("run", models.TextField(null=True)),
                ("recoveries", models.IntegerField(default=0)),
                ("recovery_sent", models.IntegerField(default=0)),
                ("dead", models.TextField(null=True)),
                ("finished_at", models.FloatField(null=True)),
                ("recovered_at", models.FloatField(null=True)),
                ("event", models.CharField(max_length=32)),
                ("detail", models.TextField(null=True)),
            ],
            options={
                "verbose_name": "lease",
                "db_table": "fence_leases",
                "ordering": ("key",),
                "managed": False,
            },
        ),
    ]
