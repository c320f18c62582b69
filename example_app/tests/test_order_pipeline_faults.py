"""The order pipeline under real faults, on real workers: each order is paid, shipped and mailed once.

``process_order(order_id)`` runs reserve -> charge -> ship -> notify with ``fence_key="order:{order_id}"``
and a pause between steps (``SHOP_STEP_PAUSE``): the window the faults land in. Lease ttl: 2 s.
"""

from __future__ import annotations

import pytest

from celery_fence.testing import (
    ProxyFactory,
    assert_history_clean,
    committed,
    kill_mid_run,
    paused,
    redeliver,
    wait_for,
)
from example_app.app import process_order

from .conftest import RECOVER, Shop

pytestmark = pytest.mark.integration

ONCE = {"reserve": 1, "charge": 1, "ship": 1, "payments": 1, "shipments": 1, "outbox": 1}


def test_a_paused_run_is_fenced_out_by_its_redelivered_copy(shop: Shop) -> None:
    """Pause a run past its lease after 'reserve'; the broker's copy takes over elsewhere and finishes;
    the paused run wakes up and its next write ('charge') is refused: one payment."""
    a = shop.worker("a", queue=f"{shop.queue}-a")
    shop.worker("b", queue=f"{shop.queue}-b")
    key, store = "order:1", shop.store
    run = process_order.apply_async((1,), queue=f"{shop.queue}-a")
    with paused(a, run.id, store, key, after=committed(store, key, "reserve")):
        redeliver(process_order, (1,), None, run.id, queue=f"{shop.queue}-b")
        wait_for(lambda: store.get(key).done, 30, "the redelivered copy to finish the order")
    wait_for(lambda: "refused" in shop.events(key), 30, "the paused run to be refused")
    issued = [e for e in store.history(key) if e.event in ("acquire", "takeover")]
    assert [e.event for e in issued] == ["acquire", "takeover"]
    first, taken_over = issued
    refused = [e for e in store.history(key) if e.event == "refused"]
    assert [e.token for e in refused] == [first.token]  # only the stale run was refused
    assert shop.effects(1) == ONCE
    assert run.get(timeout=10)["token"] == taken_over.token  # the paused run stored no result
    assert_history_clean(store)


def test_a_killed_run_is_recovered_and_resumes_after_its_last_step(shop: Shop) -> None:
    """SIGKILL the process running an order after 'reserve': the order still completes, and the run
    that takes over resumes at 'charge' (reserve is not done twice).

    The filesystem broker loses the killed run's message; recovery (``--fence-recover``) sends it again
    once the lease has expired. Two processes: the pool keeps the dead child's slot for
    ``worker_lost_wait`` (10 s) before it gives up on it.
    """
    worker = shop.worker("a", concurrency=2, args=RECOVER)
    key, store = "order:2", shop.store
    run = process_order.apply_async((2,), queue=shop.queue)
    pid = kill_mid_run(worker, run.id, after=committed(store, key, "reserve"))
    assert pid != worker.pid  # the pool's child, not the worker
    wait_for(lambda: store.get(key).done, 30, "the order to complete after the kill")
    assert "takeover" in shop.events(key)
    assert shop.effects(2) == ONCE
    assert_history_clean(store)


@pytest.mark.postgres
@pytest.mark.parametrize("fence_store_url", ["postgresql"], indirect=True)
def test_a_run_cut_off_from_its_store_loses_its_lease_and_is_refused(
    shop: Shop, fence_store_proxy: ProxyFactory
) -> None:
    """Cut worker a's store connection for longer than the ttl in the middle of an order: its lease is
    lost (it says so in its log), the order is taken over by worker b, and once the link is back, a's
    next write is refused. The order completes once.

    Worker a pauses 6 s between steps, so its renewer (not its next write) is the first to meet the cut.
    """
    key = "order:3"
    proxy = fence_store_proxy(shop.env["FENCE_STORE_URL"])
    a = shop.worker(
        "a",
        queue=f"{shop.queue}-a",
        env={"FENCE_STORE_URL": proxy.url_for(shop.env["FENCE_STORE_URL"]), "SHOP_STEP_PAUSE": "6"},
    )
    shop.worker("b", queue=f"{shop.queue}-b")
    run = process_order.apply_async((3,), queue=f"{shop.queue}-a")
    wait_for(committed(shop.store, key, "reserve"), 30, "worker a to commit 'reserve'")
    proxy.cut()
    wait_for(lambda: "fence lease lost" in a.log_text(), 30, "worker a to report its lease lost")
    wait_for(lambda: shop.store.get(key).expires_in <= 0, 30, "the lease to expire at the store")
    redeliver(process_order, (3,), None, run.id, queue=f"{shop.queue}-b")
    wait_for(lambda: "takeover" in shop.events(key), 30, "worker b to take over")
    proxy.restore()
    wait_for(lambda: shop.store.get(key).done, 30, "worker b to finish the order")
    wait_for(lambda: "refused" in shop.events(key), 30, "worker a's next write to be refused")
    wait_for(lambda: "fence refused" in a.log_text(), 30, "worker a to log it")  # after the store records it
    assert shop.effects(3) == ONCE
    assert_history_clean(shop.store)
