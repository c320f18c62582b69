"""A Celery app for the startup check's real-worker tests: its fenced tasks are the ones ``FENCE_IT_TASKS``
names (comma-separated keys of ``TASKS``), its extra settings ``FENCE_IT_CONF`` (JSON, typos welcome); the
broker, backend, store and ttl come from the same ``FENCE_IT_*`` variables as ``fenced_app``'s."""

from __future__ import annotations

import json
import os
from typing import Any

from celery import Celery

from celery_fence import FencedTask

env = os.environ.get
app = Celery("startup_app", broker=env("FENCE_IT_BROKER", "memory://"), backend=env("FENCE_IT_BACKEND"))
app.conf.update(
    fence_store_url=env("FENCE_IT_STORE", "memory://"),
    fence_lease_ttl=float(env("FENCE_IT_TTL", "2")),
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    broker_connection_retry_on_startup=True,
)
app.conf.update(json.loads(env("FENCE_IT_CONF", "{}")))

# Each a fenced task with these options (Celery makes them attributes of the task's class).
TASKS: dict[str, dict[str, Any]] = {
    "plain": {},
    "typo": {"fence_ttl": 120},  # fence_lease_ttl misspelt
    "app_setting": {"fence_renew_interval": 1.0},  # an app setting, with no per-task form
    "acks_late": {"acks_late": True},
    "acks_early": {"acks_late": False},
    "bad_key": {"fence_key": "item:{itme}"},  # the argument is item
}


def _body(self: Any, item: Any) -> Any:
    return item


for _name in env("FENCE_IT_TASKS", "plain").split(","):
    app.task(base=FencedTask, bind=True, name=f"startup.{_name}", **TASKS[_name])(_body)
