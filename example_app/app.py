"""The Celery app: one fenced pipeline task per order."""

from __future__ import annotations

import time
from typing import Any

from celery import Celery
from sqlalchemy import Engine, create_engine

from celery_fence import FencedTask

from . import settings, shop

settings.make_dirs()
app = Celery("example_app", broker=settings.BROKER_URL, backend=settings.RESULT_BACKEND)
app.conf.update(
    broker_transport=settings.BROKER_TRANSPORT,
    broker_transport_options=settings.broker_options(),
    fence_store_url=settings.STORE_URL,
    fence_lease_ttl=settings.LEASE_TTL,
    fence_max_recoveries=5,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    result_extended=True,
    broker_connection_retry_on_startup=True,
)


def shop_engine() -> Engine:
    """The shop's tables live in the store's database, so each step commits with its checkpoint."""
    return create_engine(settings.STORE_URL.replace("postgresql://", "postgresql+psycopg://", 1))


@app.task(base=FencedTask, bind=True, fence_key="order:{order_id}")
def process_order(self: Any, order_id: int) -> dict[str, Any]:
    fence = self.fence
    reserved = fence.atomic_step("reserve", shop.reserve_stock, order_id, fence.token)
    time.sleep(settings.STEP_PAUSE)
    payment = fence.atomic_step("charge", shop.charge_card, order_id, fence.token)
    time.sleep(settings.STEP_PAUSE)
    shipment = fence.atomic_step("ship", shop.ship, order_id, fence.token)
    time.sleep(settings.STEP_PAUSE)
    engine = shop_engine()
    try:  # an outside effect: at least once, made once by the provider's idempotency key
        message = fence.step("notify", shop.notify_customer, engine, order_id, f"{fence.key}:notify")
    finally:
        engine.dispose()
    return {
        "order": order_id,
        "reserved": reserved,
        "payment": payment,
        "shipment": shipment,
        "message": message,
        "token": fence.token,
    }
