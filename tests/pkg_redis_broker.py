"""Run by ``tox -e pkg`` in a venv holding the wheel with its ``redis`` extra only: a Redis broker works
(kombu's Redis transport imports, and connects to the broker the integration tests use)."""

from __future__ import annotations

import os

import kombu.transport.redis  # noqa: F401  (it failed on a dependency the redis extra did not bring)
from celery import Celery

url = f"redis://127.0.0.1:6379/{os.environ.get('FENCE_TEST_BROKER_DB', '14')}"
with Celery("pkg", broker=url).connection() as connection:
    connection.connect()
print(f"celery-fence[redis] alone: a Redis broker at {url} answers")
