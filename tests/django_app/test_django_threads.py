"""Runs on Celery's threads pool in this process, with the renewer's thread running: each run's transaction
is on the Django connection of its own pool thread, and the renewer (on the store's own connections) keeps
the leases alive while the bodies work, never touching a Django connection."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from celery_fence import FencedTask
from celery_fence._runtime import runtime_for
from tests.django_app.orders.models import Order
from tests.support.inprocess import memory_app, running_worker


def test_concurrent_runs_on_pool_threads_each_commit_their_orm_writes_once(store: Any, alias: str) -> None:
    app = memory_app("django-threads", fence_store_url=store.url, fence_lease_ttl=1.0)  # renewed meanwhile
    threads: dict[str, int] = {}

    @app.task(base=FencedTask, bind=True, fence_key="order:{n}", name="django_threads.pay", shared=False)
    def pay(self: Any, n: str) -> str:
        time.sleep(1.5)  # longer than the lease: only the renewer keeps it
        with self.fence.atomic():
            Order.objects.using(alias).create(key=self.fence.key, what="paid")
        threads[n] = threading.get_ident()
        return n

    runtime = runtime_for(app)
    runtime._store = store
    orders = [uuid.uuid4().hex[:10] for _ in range(4)]
    try:
        with running_worker(app, pool="threads", concurrency=4):
            results = [pay.delay(n) for n in orders]
            assert sorted(r.get(timeout=60) for r in results) == sorted(orders)
    finally:
        runtime._store = None  # the fixture closes the store
        runtime.close()
    for n in orders:
        written = Order.objects.using(alias).filter(key=f"order:{n}").values_list("what", flat=True)
        assert list(written) == ["paid"]
        events = [e.event for e in store.history(f"order:{n}")]
        assert events == ["acquire", "write", "complete"], events  # never lost, taken over or refused
    assert len(set(threads.values())) > 1  # the runs were on several pool threads
