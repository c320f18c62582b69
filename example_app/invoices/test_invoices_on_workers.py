"""The invoices app on real workers, under real faults: a killed run and a paused run each pay once.

The workers and this process share the app's broker and result backend (its Redis, as in production: point
INVOICES_BROKER_URL and INVOICES_RESULT_BACKEND at a server for tests) and a SQLite store of the test's own.
Each test has queues of its own, so tests never see each other's messages.
"""

import uuid

import pytest

from celery_fence.testing import assert_history_clean, committed, kill_mid_run, paused, redeliver, wait_for

from invoices import charge

pytestmark = pytest.mark.parametrize("fence_store_url", ["sqlite"], indirect=True)


@pytest.fixture
def queue():
    return f"invoices-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def start(fence_worker, fence_store, queue):
    """Start a worker of the invoices app on queue ``<queue>-<name>``."""
    # A 10 s lease: on SQLite, shorter ones make the worker warn (one write lock for the whole database,
    # docs/stores.md); on PostgreSQL or Redis, 2 or 3 s make the tests faster.
    env = {"INVOICES_STORE_URL": fence_store.url, "INVOICES_LEASE_TTL": "10"}

    def worker(name, pause=1, **options):  # seconds between the steps: where the fault lands
        env_ = {**env, "INVOICES_PAUSE": str(pause)}
        return fence_worker("invoices", name, queues=f"{queue}-{name}", env=env_, **options)

    return worker


def events(store, key):
    return [event.event for event in store.history(key)]


def test_a_killed_run_is_taken_over_and_pays_once(start, queue, fence_store, payments):
    a = start("a", concurrency=2)  # a second process: the pool holds the dead one's slot a while
    run = charge.apply_async((1,), queue=f"{queue}-a")
    pid = kill_mid_run(a, run.id, after=committed(fence_store, "invoice:1", "total"))
    assert pid != a.pid  # the pool's child, not the worker
    assert run.get(timeout=60) == 100  # the broker gave the message back, and its copy finished
    # The worker released the dead process's lease; the copy resumed after 'total' (one step record each).
    assert events(fence_store, "invoice:1") == ["acquire", "step", "release", "acquire", "step", "complete"]
    assert payments() == [1]
    assert "raise fence_lease_ttl" not in a.log_text()
    assert_history_clean(fence_store)


def test_a_paused_run_is_fenced_out_by_its_copy(start, queue, fence_store, payments):
    """Stop the run past its lease after 'total'; the broker's copy takes over on worker b and pays; the
    stopped run wakes up and its payment is refused."""
    a, _ = start("a", pause=5), start("b")  # a renews (every ttl/3) before its pause ends
    key = "invoice:2"
    run = charge.apply_async((2,), queue=f"{queue}-a")
    with paused(a, run.id, fence_store, key, after=committed(fence_store, key, "total")):
        redeliver(charge, (2,), None, run.id, queue=f"{queue}-b")
        wait_for(lambda: fence_store.get(key).done, 60, "the copy to pay the invoice")
    wait_for(lambda: "refused" in events(fence_store, key), 60, "the stopped run's payment to be refused")
    assert run.get(timeout=10) == 200  # the copy's result
    assert payments() == [2]
    assert_history_clean(fence_store)
