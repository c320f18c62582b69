"""Django's settings as Celery reads them (``config_from_object("django.conf:settings",
namespace="CELERY")``): ``CELERY_FENCE_STORE_URL`` names the ``django://`` store, the worker's start-up check
names a misspelt ``CELERY_FENCE_*`` setting; and what the ``django://`` URL refuses before connecting."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_fence import ConfigurationError, FencedTask
from celery_fence.stores import capabilities_for, open_store, store_class
from celery_fence.stores.django.store import settings_url
from celery_fence.worker.startup import check_worker_at_start


def _body(self: Any, item: Any) -> Any:
    return item


def test_the_celery_namespace_reads_the_store_url_and_names_a_misspelt_setting(
    migrated_sqlite: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = Celery("proj", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True)
    app.task(base=FencedTask, bind=True, name="t", shared=False, fence_key="item:{item}")(_body)
    app.finalize()
    assert app.conf.get("fence_store_url") == "django://default"
    assert app.conf.get("fence_lease_ttl") == 60
    with caplog.at_level(logging.WARNING, logger="celery_fence"):
        check_worker_at_start(sender=SimpleNamespace(app=app, pool_cls=None), fenced=FencedTask)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        "celery-fence: unknown setting CELERY_FENCE_LEASE_TTLL (did you mean CELERY_FENCE_LEASE_TTL?): "
        "celery-fence ignores it"
    ]


def test_the_django_store_is_the_sql_store_on_the_aliases_database(migrated_sqlite: str) -> None:
    store = open_store("django://default")
    try:
        assert store.url == "django://default"
        assert store.capabilities.transactions and store.capabilities.django_alias == "default"
        lease = store.acquire("settings-key", "w", 30.0)
        store.complete(lease, "done")  # a completion without a run's transaction: the store's own engine
        assert store.get("settings-key").result == "done"
    finally:
        store.close()
    assert capabilities_for("django://pg").name == "PostgreSQL (Django's 'pg' database)"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("django://", "django://<alias>"),
        ("django://default/extra", "django://<alias>"),
        ("django://nosuch", "has no 'nosuch' database (it has: default, pg)"),
    ],
)
def test_a_django_url_that_cannot_work_is_refused_before_connecting(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says.replace("(", r"\(").replace(")", r"\)")):
        store_class(url)


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}, "in-memory SQLite"),
        ({"ENGINE": "django.db.backends.sqlite3", "NAME": "file:memorydb_default?mode=memory"}, "in-memory"),
        ({"ENGINE": "django.db.backends.mysql", "NAME": "shop"}, "runs on django.db.backends.postgresql"),
    ],
)
def test_a_database_the_store_cannot_use_is_refused(settings: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        settings_url("other", settings)


def test_a_postgresql_database_becomes_a_psycopg_url_with_its_libpq_options() -> None:
    settings = {
        "ENGINE": "django.db.backends.postgresql", "NAME": "shop", "USER": "app", "PASSWORD": "s3cr@t",
        "HOST": "db", "PORT": "6432", "OPTIONS": {"sslmode": "require", "server_side_binding": True},
    }
    assert settings_url("default", settings) == "postgresql+psycopg://app:s3cr%40t@db:6432/shop?sslmode=require"
