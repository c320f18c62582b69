"""The Django system check of the fence store (``manage.py check``, and every ``runserver`` and
``migrate``): the ORM writes of a fenced task commit with its run only if ``CELERY_FENCE_STORE_URL`` is a
``django://`` store on the database those writes go to."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning
from django.db import router

from ...errors import ConfigurationError
from ...stores import capabilities_for
from ...stores.urls import mask_url

__all__ = ["check_fence_store"]

_SHOWN = 10  # models named in the warning; the rest are counted
_FIX = "set CELERY_FENCE_STORE_URL = 'django://default' (the alias of the database your ORM writes go to)"


def check_fence_store(app_configs: Any = None, **_: Any) -> list[CheckMessage]:
    url = getattr(settings, "CELERY_FENCE_STORE_URL", None)
    if url is None:
        return [Warning(
            "CELERY_FENCE_STORE_URL is not set: the fence store is not on Django's database, and the ORM "
            "writes of a fenced task cannot commit with its run (self.fence.atomic())",
            hint=_FIX, id="celery_fence.W001",
        )]  # fmt: skip
    try:
        alias = capabilities_for(url).django_alias
    except ConfigurationError as exc:
        return [Error(f"CELERY_FENCE_STORE_URL: {exc}", id="celery_fence.E001")]
    if alias is None:
        return [Warning(
            f"CELERY_FENCE_STORE_URL is {mask_url(url)}, not a store on a Django database: the ORM writes of "
            "a fenced task are not fenced (self.fence.atomic() needs a django:// store)",
            hint=_FIX, id="celery_fence.W002",
        )]  # fmt: skip
    elsewhere = sorted(
        f"{model._meta.label} ({written_to!r})"
        for model in apps.get_models()
        if model._meta.app_label != "celery_fence" and (written_to := router.db_for_write(model)) != alias
    )
    if elsewhere:
        more = len(elsewhere) - _SHOWN
        shown = ", ".join(elsewhere[:_SHOWN]) + (f" and {more} more" if more > 0 else "")
        return [Warning(
            f"the fence store is on the {alias!r} database, and the writes of {shown} go to another: "
            "those writes would not be fenced",
            hint="route the fenced tasks' models to the fence store's database, or ignore this for models no "
            "fenced task writes (SILENCED_SYSTEM_CHECKS = ['celery_fence.W003'])",
            id="celery_fence.W003",
        )]  # fmt: skip
    return []
