"""The order pipeline of example_app as one fenced task on the Django ORM: the stock, the payment, the
shipment and the order's status commit together with the run's completion, or not at all; the customer is
notified after that commit, and never for a run that did not commit."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import F

from celery_fence import FencedTask

from .models import Notification, Order, Payment, Shipment, Stock
from shopsite.celery import app


@app.task(base=FencedTask, bind=True, fence_key="order:{order_id}")
def process_order(self: Any, order_id: int) -> dict[str, Any]:
    with self.fence.atomic():
        order = Order.objects.select_for_update().get(pk=order_id)
        Stock.objects.filter(sku=order.sku).update(qty=F("qty") - 1)
        payment = Payment.objects.create(order=order, cents=order.cents)
        Shipment.objects.create(order=order)
        order.status = "shipped"
        order.save(update_fields=["status"])
        transaction.on_commit(lambda: Notification.objects.create(order_id=order_id))
        after_writes(order_id)  # a hook for the tests: nothing in production
    return {"order": order_id, "payment": payment.pk, "token": self.fence.token}


def after_writes(order_id: int) -> None:
    """Called between the run's writes and its completion; the tests make it fail or take the lease."""
