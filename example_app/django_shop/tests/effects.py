"""What an order's processing left in the shop's tables, read by the tests after each run."""

from __future__ import annotations

from typing import Any

from orders.models import Notification, Order, Payment, Shipment, Stock


def effects(order: Order) -> dict[str, Any]:
    order.refresh_from_db()
    return {
        "status": order.status,
        "payments": Payment.objects.filter(order=order).count(),
        "shipments": Shipment.objects.filter(order=order).count(),
        "notified": Notification.objects.filter(order=order).count(),
        "stock": Stock.objects.get(sku=order.sku).qty,
    }


DONE = {"status": "shipped", "payments": 1, "shipments": 1, "notified": 1, "stock": 9}
UNTOUCHED = {"status": "new", "payments": 0, "shipments": 0, "notified": 0, "stock": 10}
