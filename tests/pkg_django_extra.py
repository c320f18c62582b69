"""Run by ``tox -e pkg`` in a venv holding the wheel with its ``django`` extra alone: the Django app, its
migrations and the ``django://`` store (by its entry point) import, psycopg or not."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

import django
from django.conf import settings

apps = ["admin", "auth", "contenttypes", "sessions", "messages"]
settings.configure(INSTALLED_APPS=[*(f"django.contrib.{app}" for app in apps), "celery_fence.contrib.django"])
django.setup()  # the app's models and admin pages load with it
for module in (
    "celery_fence.contrib.django.apps",
    "celery_fence.contrib.django.admin",
    "celery_fence.contrib.django.migrations.0001_initial",
    "celery_fence.contrib.django.migrations.0002_leases_and_history",
):
    importlib.import_module(module)
(entry,) = [e for e in entry_points(group="celery_fence.stores") if e.name == "django"]
print("Django", django.__version__, "store", entry.load().__name__)
