"""The Django app's configuration: its label and name, and its system check (``checks``)."""

from __future__ import annotations

from django.apps import AppConfig
from django.core import checks

from .checks import check_fence_store

__all__ = ["FenceConfig"]


class FenceConfig(AppConfig):
    name = "celery_fence.contrib.django"
    label = "celery_fence"
    verbose_name = "Celery fence"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        checks.register(check_fence_store)  # no database tag: it reads settings, not the database
