"""Real ``celery worker`` processes (prefork) of a Django project (tests/django_app/proj.py): a worker killed
between its ORM write in ``self.fence.atomic()`` and its completion leaves no write; the broker's second
delivery writes once. On SQLite and PostgreSQL, with Redis as the broker."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_fence.testing import wait_for
from tests.django_app.orders.models import Order

pytestmark = [pytest.mark.integration, pytest.mark.redis]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sender(redis_server_url: str) -> Celery:
    """The producer: an app on the workers' broker and result backend (Redis databases of the suite's)."""
    base = redis_server_url.rsplit("/", 1)[0]
    app = Celery("sender", set_as_current=False)
    app.conf.broker_url = f"{base}/{os.environ.get('FENCE_TEST_BROKER_DB', '14')}"
    app.conf.result_backend = f"{base}/{os.environ.get('FENCE_TEST_BACKEND_DB', '13')}"
    return app


def test_a_worker_killed_between_its_orm_write_and_its_completion_leaves_no_write(
    alias: str, sender: Celery, fence_worker: Any, fence_workdir: Path
) -> None:
    queue = f"django-{uuid.uuid4().hex[:8]}"  # other test runs may share the broker
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.django_app.settings",
        "FENCE_DJANGO_STORE": f"django://{alias}",
        "FENCE_DJANGO_BROKER": sender.conf.broker_url,
        "FENCE_DJANGO_BACKEND": sender.conf.result_backend,
        "FENCE_DJANGO_MARKS": str(fence_workdir),
    }
    fence_worker("tests.django_app.proj", name="django", queues=queue, pool="prefork", env=env, cwd=ROOT)
    order = uuid.uuid4().hex[:12]
    result = sender.send_task("django_proj.pay", args=(order, alias, 60.0), queue=queue)

    def first_write() -> list[Path]:
        return list(fence_workdir.glob(f"{result.id}.*.wrote"))

    (mark,) = wait_for(first_write, what="the first attempt's ORM write")
    assert Order.objects.using(alias).filter(key=f"order:{order}").count() == 0  # written, not committed
    os.kill(int(mark.name.split(".")[1]), signal.SIGKILL)  # the pool process: acks_late delivers it again
    outcome = result.get(timeout=60)
    assert len(first_write()) == 2  # both attempts wrote...
    rows = list(Order.objects.using(alias).filter(key=f"order:{order}").values_list("what", flat=True))
    assert rows == [f"{outcome['pid']}:{outcome['token']}"]  # ...the completed one's write alone stayed
