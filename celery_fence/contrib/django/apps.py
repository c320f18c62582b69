"""The Django app's configuration: its label and name."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["FenceConfig"]


class FenceConfig(AppConfig):
    name = "celery_fence.contrib.django"
    label = "celery_fence"
    verbose_name = "Celery fence"
    default_auto_field = "django.db.models.BigAutoField"
