"""The invoices app's own tasks in Celery's in-process worker: no broker, no server, a SQLite store of the
test's own. ``fence_app`` (conftest.py) hands the plugin the app."""

import pytest

from celery_fence.testing import Fault, assert_history_clean

from invoices import charge

pytestmark = pytest.mark.parametrize("fence_store_url", ["sqlite"], indirect=True)


def test_an_invoice_is_paid_once_however_often_it_is_sent(fence_in_process_worker, fence_store, payments):
    first, again = charge.delay(7), charge.delay(7)  # two messages, two task ids, one key
    assert first.get(timeout=10) == again.get(timeout=10) == 700
    assert payments() == [7]
    assert_history_clean(fence_store)


def test_a_redelivered_message_is_paid_once(fence_in_process_worker, fence_store, payments):
    first = charge.delay(8)
    copy = charge.apply_async((8,), task_id=first.id)  # the broker's second delivery: the same task id
    assert first.get(timeout=10) == copy.get(timeout=10) == 800
    assert payments() == [8]
    assert_history_clean(fence_store)


@pytest.mark.parametrize("fence_store_faults", [[Fault("lost", method="complete")]])
def test_a_completion_whose_reply_was_lost_still_pays_once(fence_in_process_worker, fence_store, payments):
    # The store committed the completion and its reply never came back: the run finds out, and ends well.
    assert charge.delay(9).get(timeout=10) == 900
    assert payments() == [9]
    assert_history_clean(fence_store)
