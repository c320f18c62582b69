"""The small fenced app ``benchmarks/flower_screenshot.py`` runs, so Flower has each fence state to show.

Redis broker and results (``FLOWER_SHOT_REDIS``, DB 7 by default), a SQLite lease store in
``FLOWER_SHOT_DIR``, ttl 3 s, ``fence_on_busy="ignore"`` (so an absorbed duplicate stays in Flower as
FENCE-DUPLICATE). Every run writes ``<task id>.<pid>.started`` there, so the script knows which
process to pause.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from celery import Celery
from sqlalchemy import text

from celery_fence import FencedTask

DIR = Path(os.environ.get("FLOWER_SHOT_DIR", "/tmp"))
BROKER = os.environ.get("FLOWER_SHOT_REDIS", "redis://127.0.0.1:6379/7")
app = Celery("flower_app", broker=BROKER, backend=BROKER)
app.conf.update(
    fence_store_url=f"sqlite:///{DIR / 'fence.db'}",
    fence_lease_ttl=3.0,
    fence_on_busy="ignore",  # a second send of a key still held ends at once as FENCE-DUPLICATE
    task_default_queue="fence.flower",
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    worker_send_task_events=True,
    task_send_sent_event=True,
    broker_connection_retry_on_startup=True,
)
CREATE = text("CREATE TABLE IF NOT EXISTS invoices (invoice_id INTEGER, token INTEGER)")
INSERT = text("INSERT INTO invoices (invoice_id, token) VALUES (:id, :token)")


def _mark(task: Any) -> None:
    (DIR / f"{task.request.id}.{os.getpid()}.started").write_text(str(time.time()))


@app.task(base=FencedTask, bind=True, name="shop.charge", fence_key="invoice:{invoice_id}")
def charge(self: Any, invoice_id: int, work: float = 0.5) -> dict[str, Any]:
    """A fenced write: the row commits only if this run's token is still the key's current one."""
    _mark(self)
    time.sleep(work)  # the script pauses this process here for the refused run
    with self.fence.transaction() as conn:
        conn.execute(CREATE)
        conn.execute(INSERT, {"id": invoice_id, "token": self.fence.token})
    return {"invoice_id": invoice_id, "token": self.fence.token}


@app.task(
    base=FencedTask, bind=True, name="shop.refund", fence_key="invoice:{invoice_id}", fence_on_busy="retry"
)
def refund(self: Any, invoice_id: int) -> dict[str, Any]:
    """Waits for a held key (``fence_on_busy="retry"``, the default): RETRY while it looks, then SUCCESS."""
    _mark(self)
    return {"invoice_id": invoice_id, "refunded_with": self.fence.token}


@app.task(base=FencedTask, bind=True, name="shop.export")
def export(self: Any, seconds: float) -> str:
    """A run that never checks its lease: FENCE-LOST once an operator releases it, then its completion is
    refused with nobody holding the key, so it sends itself again (same id) and that copy ends SUCCESS."""
    _mark(self)
    time.sleep(seconds)
    return "exported"
