"""The shop on a real prefork worker (the shop's Redis broker, its test database): a pool process killed
between the pipeline's writes and its completion leaves none of them; the broker delivers the order again,
and it is processed once. The kill lands at the fault kit's failpoint ``before-complete``: the run has made
its writes in ``self.fence.atomic()`` and is about to complete."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path
from typing import Any

from django.db import connection

from celery_fence.testing import wait_for
from tests.effects import DONE, UNTOUCHED, effects

from orders import tasks
from orders.models import Order

SHOP = Path(__file__).resolve().parents[1]


def test_a_worker_killed_between_the_writes_and_the_completion_leaves_none_and_the_order_ships_once(
    order: Order, fence_worker: Any, fence_workdir: Path
) -> None:
    points = fence_workdir / "failpoints"
    points.mkdir()
    block = points / "before-complete.block"
    block.touch()  # the first run stops after its writes, before its completion
    env = {
        "SHOP_DATABASE": connection.settings_dict["NAME"],  # pytest-django's test database
        "SHOP_FENCE_LEASE_TTL": "3",  # the killed run's lease expires soon: the next delivery takes over
        "CELERY_FENCE_FAILPOINTS": str(points),
    }
    queue = f"shop-{uuid.uuid4().hex[:8]}"
    fence_worker("shopsite", name="shop", queues=queue, pool="prefork", concurrency=1, env=env, cwd=SHOP)
    result = tasks.process_order.apply_async((order.pk,), queue=queue)

    def reached() -> list[Path]:
        return list(points.glob("before-complete.*.reached"))

    (first,) = wait_for(reached, timeout=60, what="the first run's writes")
    assert effects(order) == UNTOUCHED  # written in the run's transaction, not committed
    os.kill(int(first.name.split(".")[1]), signal.SIGKILL)  # the pool process: the broker delivers again
    block.unlink()  # the next run completes
    assert result.get(timeout=60)["order"] == order.pk
    assert effects(order) == DONE  # once: one payment, one shipment, one notification, one widget less
