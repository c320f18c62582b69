"""The run record recovery re-sends: the message's options and route, not only the call."""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.app.task import Context
from kombu import Exchange, Queue

from celery_fence import codec
from celery_fence._delivery import resend_options, run_info

app = Celery("runinfo", broker="memory://", set_as_current=False)
app.conf.task_queues = [Queue("billing", Exchange("jobs", type="direct"), routing_key="bill.high")]
AFTER = {"task": "shop.after", "args": [], "kwargs": {}, "options": {}, "subtask_type": None}


@app.task(bind=True)
def charge(self: Any, invoice: int) -> None:
    """The task whose run is recorded."""


def _request(**fields: Any) -> Context:
    return Context(id="t-1", root_id="r-1", parent_id="p-1", **fields)


def test_the_chain_links_ids_headers_and_route_are_recorded_and_sent_again() -> None:
    request = _request(
        chain=[AFTER],
        callbacks=[AFTER],
        errbacks=[AFTER],
        group="g-1",
        group_index=2,
        headers={"tenant": "acme"},
        delivery_info={"exchange": "jobs", "routing_key": "bill.high", "priority": 7},
        expires="2030-01-01T00:00:00+00:00",
        retries=1,
    )
    run = codec.loads(run_info(charge, request, (7,), {"x": 1}).text)
    sent = resend_options(run)
    assert sent["args"] == [7] and sent["kwargs"] == {"x": 1} and sent["task_id"] == "t-1"
    assert (sent["chain"], sent["link"], sent["link_error"]) == ([AFTER], [AFTER], [AFTER])
    ids = (sent["root_id"], sent["parent_id"], sent["group_id"], sent["group_index"])
    assert ids == ("r-1", "p-1", "g-1", 2)
    assert sent["headers"] == {"tenant": "acme"}
    assert (sent["exchange"], sent["routing_key"], sent["priority"]) == ("jobs", "bill.high", 7)
    assert sent["queue"] == "billing"  # the queue bound by that key, not a queue named "bill.high"
    assert (sent["expires"], sent["retries"]) == ("2030-01-01T00:00:00+00:00", 1)


def test_the_default_exchange_routes_by_queue_name() -> None:
    request = _request(delivery_info={"exchange": "", "routing_key": "plain"})
    assert resend_options(codec.loads(run_info(charge, request, (), {}).text))["queue"] == "plain"


def test_an_unknown_binding_sends_to_the_exchange_and_key_without_guessing_a_queue() -> None:
    request = _request(delivery_info={"exchange": "elsewhere", "routing_key": "k"})
    sent = resend_options(codec.loads(run_info(charge, request, (), {}).text))
    assert "queue" not in sent and (sent["exchange"], sent["routing_key"]) == ("elsewhere", "k")


def test_a_fence_key_header_joins_the_recorded_headers() -> None:
    request = _request(headers={"tenant": "acme"}, fence_key="invoice:7")
    sent = resend_options(codec.loads(run_info(charge, request, (), {}).text))
    assert sent["headers"] == {"tenant": "acme", "fence_key": "invoice:7"}


def test_a_record_from_before_the_options_were_kept_goes_to_its_queue() -> None:
    sent = resend_options({"task": "t", "id": "i", "args": [], "kwargs": {}, "queue": "q1"})
    assert sent == {"args": [], "kwargs": {}, "task_id": "i", "queue": "q1"}


def test_arguments_json_cannot_carry_leave_the_run_unrecorded_with_the_reason() -> None:
    run = codec.loads(run_info(charge, _request(), (object(),), {}).text)
    assert (run["task"], run["args"], run["options"]) == ("tests.unit.test_runinfo.charge", None, None)
    assert "JSON" in run["dropped"]
