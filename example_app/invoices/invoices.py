"""A user's own app: a fenced task made with ``@app.task``, on Redis and PostgreSQL in production.

docs/testing.md tests it as it is, in a project of its own: in-process (``test_invoices.py``) and on real
workers (``test_invoices_on_workers.py``). The settings come from the environment, with production's as
the defaults.
"""

import os
import time

from celery import Celery
from sqlalchemy import text

from celery_fence import FencedTask

app = Celery(
    "invoices",
    broker=os.environ.get("INVOICES_BROKER_URL", "redis://127.0.0.1:6379/0"),
    backend=os.environ.get("INVOICES_RESULT_BACKEND", "redis://127.0.0.1:6379/1"),
)
app.conf.update(
    fence_store_url=os.environ.get("INVOICES_STORE_URL", "postgresql://127.0.0.1/invoices"),
    fence_lease_ttl=float(os.environ.get("INVOICES_LEASE_TTL", "30")),
    task_acks_late=True,
    task_reject_on_worker_lost=True,
)
PAUSE = float(os.environ.get("INVOICES_PAUSE", "0"))  # between the two steps: where a test's fault lands


def record_payment(conn, invoice_id, token):
    """The effect: a row in the store's database, committed with the step's record (``atomic_step``)."""
    query = text("INSERT INTO payments (invoice_id, token) VALUES (:invoice_id, :token)")
    conn.execute(query, {"invoice_id": invoice_id, "token": token})
    return invoice_id * 100


@app.task(base=FencedTask, bind=True, fence_key="invoice:{invoice_id}")
def charge(self, invoice_id):
    total = self.fence.step("total", lambda: invoice_id * 100)
    time.sleep(PAUSE)
    self.fence.atomic_step("pay", record_payment, invoice_id, self.fence.token)
    return total
