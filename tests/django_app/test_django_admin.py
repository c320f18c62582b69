"""The Django app's read-only admin pages (leases with their state by the database's clock, a key's
history), its system check (the fence store must be on the database the ORM writes go to), and its
migrations (nothing left for ``makemigrations`` to make)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.checks import run_checks
from django.core.management import call_command
from django.test import Client
from django.test.utils import override_settings

from celery_fence.stores import open_store


@pytest.fixture
def admin_client(migrated_sqlite: str) -> Client:
    name = f"admin-{uuid.uuid4().hex[:8]}"
    user = User.objects.create_superuser(name, f"{name}@example.com", "pw")
    client = Client()
    client.force_login(user)
    return client


def test_the_lease_pages_show_state_token_owner_and_expiry_and_change_nothing(admin_client: Client) -> None:
    store = open_store("django://default")
    held, done = f"held-{uuid.uuid4().hex[:8]}", f"done-{uuid.uuid4().hex[:8]}"
    store.acquire(held, "worker-a", 30.0)
    store.complete(store.acquire(done, "worker-b", 30.0), "its result")
    page = admin_client.get("/admin/celery_fence/lease/", {"q": held})
    assert page.status_code == 200
    text = page.content.decode()
    assert held in text and "worker-a" in text and "held" in text and " s</td>" in text
    assert "done" in admin_client.get("/admin/celery_fence/lease/", {"q": done}).content.decode()
    history = admin_client.get("/admin/celery_fence/historyevent/", {"key": done}).content.decode()
    assert history.count(done) >= 2 and "acquire" in history and "complete" in history
    assert admin_client.get("/admin/celery_fence/lease/add/").status_code == 403
    assert admin_client.post(f"/admin/celery_fence/lease/{held}/delete/").status_code == 403
    assert store.get(held).owner == "worker-a"  # untouched
    store.close()


def checks() -> list[tuple[str, str]]:
    return [(m.id, m.msg) for m in run_checks() if (m.id or "").startswith("celery_fence.")]


def test_the_system_check_is_quiet_when_the_store_is_on_the_orms_database(migrated_sqlite: str) -> None:
    assert checks() == []


@pytest.mark.parametrize(
    ("url", "check"),
    [
        (None, "celery_fence.W001"),
        ("postgresql://app:secret@db/shop", "celery_fence.W002"),
        ("django://nosuch", "celery_fence.E001"),
    ],
)
def test_the_system_check_names_a_store_the_orm_writes_do_not_go_to(
    url: Any, check: str, migrated_sqlite: str
) -> None:
    with override_settings(CELERY_FENCE_STORE_URL=url):
        found = checks()
    assert [i for i, _ in found] == [check]
    assert "secret" not in found[0][1]


class _OrdersElsewhere:
    def db_for_write(self, model: Any, **_: Any) -> str | None:
        return "pg" if model._meta.app_label == "orders" else None


def test_the_system_check_names_the_models_written_to_another_database(migrated_sqlite: str) -> None:
    with override_settings(DATABASE_ROUTERS=[_OrdersElsewhere()]):
        found = checks()
    assert found == [(
        "celery_fence.W003",
        "the fence store is on the 'default' database, and the writes of orders.Order ('pg') go to another: "
        "those writes would not be fenced",
    )]  # fmt: skip


def test_the_apps_migrations_are_complete(migrated_sqlite: str) -> None:
    call_command("makemigrations", "celery_fence", check=True, dry_run=True, verbosity=0)
