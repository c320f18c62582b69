"""Fenced tasks in Celery's in-process worker: pytest-celery's celery_app plus celery-fence's plugin.

No Docker and no server: Celery's memory broker and result backend, a fence store of the test's own.
"""

import threading
from collections import Counter

import pytest

from celery_fence import FencedTask
from celery_fence.signals import lease_duplicate
from celery_fence.testing import Fault, assert_history_clean, wait_for

pytestmark = pytest.mark.parametrize("fence_store_url", ["memory", "sqlite"], indirect=True)


@pytest.fixture
def celery_config(fence_celery_config):
    # Function scope (pytest-celery's is session-wide): the fence store is this test's own.
    return {**fence_celery_config, "result_extended": True}


@pytest.fixture
def payments():
    return Counter()


@pytest.fixture
def charge(celery_app, fence_in_process_worker, payments):
    gate = threading.Event()

    @celery_app.task(base=FencedTask, bind=True, fence_key="invoice:{invoice_id}")
    def charge(self, invoice_id, wait=False):
        if wait:
            gate.wait(10)  # hold the lease until the test opens the gate
        total = self.fence.step("total", lambda: invoice_id * 100)
        self.fence.step("pay", payments.update, [invoice_id])  # the effect: once per key
        return total

    charge.gate = gate
    fence_in_process_worker.reload()  # the worker started before this task existed
    return charge


@pytest.fixture
def absorbed():
    keys = []

    def record(sender, key, **info):
        keys.append(key)

    lease_duplicate.connect(record)
    yield keys
    lease_duplicate.disconnect(record)


def test_an_invoice_is_charged_once_however_often_it_is_sent(charge, payments, fence_store):
    assert charge.delay(7).get(timeout=10) == 700
    again = charge.delay(7)  # another message, another task id, the same key
    assert again.get(timeout=10) == 700  # the stored result: the body did not run again
    assert payments == {7: 1}
    assert [e.event for e in fence_store.history("invoice:7")] == ["acquire", "step", "step", "complete"]
    assert_history_clean(fence_store)


def test_a_redelivered_copy_of_a_running_charge_is_absorbed(charge, payments, absorbed, fence_store):
    holder = charge.delay(8, wait=True)
    copy = charge.apply_async((8,), {"wait": True}, task_id=holder.id)  # the broker's second delivery
    wait_for(lambda: absorbed == ["invoice:8"], 10, "the copy to meet the running holder")
    charge.gate.set()
    assert holder.get(timeout=10) == copy.get(timeout=10) == 800
    assert payments == {8: 1}
    assert_history_clean(fence_store)


@pytest.mark.parametrize("fence_store_faults", [[Fault("lost", method="acquire")]])
def test_an_acquire_whose_reply_was_lost_still_charges_once(charge, payments, fence_store):
    # The store took the lease and the reply never came back; the run asks again and goes on.
    assert charge.delay(9).get(timeout=10) == 900
    assert payments == {9: 1}
    assert_history_clean(fence_store)
