"""The Celery app of tests/django_app's real workers, set up as Celery's "First steps with Django" says:
``DJANGO_SETTINGS_MODULE`` (tests/django_app/settings.py), ``config_from_object("django.conf:settings",
namespace="CELERY")``. Its task writes an order with the ORM in ``self.fence.atomic()``, leaves a mark
file per attempt, and pauses in its first attempt, for the test to kill the worker there."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import django
from celery import Celery

from celery_fence import FencedTask

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django_app.settings")
django.setup()
app = Celery("django_proj")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.fence_lease_ttl = 2  # a killed attempt's lease expires soon: the test waits no longer than that

MARKS = Path(os.environ.get("FENCE_DJANGO_MARKS", "."))


@app.task(base=FencedTask, bind=True, name="django_proj.pay", fence_key="order:{order}")
def pay(self: Any, order: str, alias: str, pause: float) -> dict[str, Any]:
    from tests.django_app.orders.models import Order  # after django.setup(), as a tasks module of an app is

    with self.fence.atomic():
        Order.objects.using(alias).create(key=self.fence.key, what=f"{os.getpid()}:{self.fence.token}")
    first = not list(MARKS.glob(f"{self.request.id}.*.wrote"))
    (MARKS / f"{self.request.id}.{os.getpid()}.wrote").write_text(str(time.time()))
    if first:
        time.sleep(pause)  # the test kills the worker here: written, not committed
    return {"token": self.fence.token, "pid": os.getpid()}
