"""How a caller's result ends when two runs meet on one key (docs/guarantees.md#how-a-run-ends), through
Celery's in-process worker (threads pool: runs overlap) on every store that serves several processes.

- A task id that lost its key to another task id ends ready: the winner's result once the key is done,
  else a FenceError naming the winner; never PENDING for ever, also with
  ``fence_on_busy="ignore"``.
- Two copies of one task id meet under a custom ``fence_key``: the copy is absorbed whatever
  ``fence_on_busy`` says, and the caller never sees a failure; it
  looks at the key again soon, without spending ``max_retries``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from celery import Celery
from celery.signals import before_task_publish

from celery_fence import FencedTask, LeaseHeld
from celery_fence._runtime import runtime_for
from celery_fence.signals import lease_duplicate
from celery_fence.testing import wait_for
from tests.support.harnesses import Harness
from tests.support.inprocess import Gates, memory_app, running_worker

pytestmark = pytest.mark.stores("memory", "sqlite", "postgresql", "redis")


@pytest.fixture
def gates() -> Gates:
    return Gates()


@pytest.fixture
def app(store: Any, gates: Gates) -> Iterator[Celery]:
    app = memory_app("endings", fence_store_url=store.url, fence_lease_ttl=30.0)  # no renew within a test

    @app.task(base=FencedTask, bind=True, fence_key="k:{n}", name="endings.keyed", shared=False)
    def keyed(self: Any, n: int, tag: str, wait: bool = False) -> str:
        if wait:
            gates.wait(tag)
        return f"done by {tag}"

    runtime = runtime_for(app)
    runtime._store = store
    with running_worker(app, pool="threads", concurrency=3):
        yield app
    for tag in list(gates.entered):
        gates.open(tag)
    runtime._store = None  # the harness closes the store itself
    runtime.close()


def test_a_task_id_that_lost_its_key_ends_with_the_winners_result(
    app: Celery, store: Any, harness: Harness, gates: Gates
) -> None:
    keyed = app.tasks["endings.keyed"]
    a = keyed.delay(1, "A", wait=True)
    wait_for(lambda: "A" in gates.entered, what="A in its body")
    harness.expire_all(store)  # A stalls past its lease...
    b = keyed.delay(1, "B")  # ...another task id takes the key over and finishes it
    assert b.get(timeout=30) == "done by B"
    gates.open("A")
    assert a.get(timeout=30) == "done by B"  # A's completion was refused: the winner's result
    events = [e.event for e in store.history("k:1")]
    assert events.count("complete") == 1 and "refused" in events and "takeover" in events


def test_a_task_id_whose_key_is_held_by_another_ends_ready_naming_it(
    app: Celery, store: Any, harness: Harness, gates: Gates
) -> None:
    keyed = app.tasks["endings.keyed"]
    a = keyed.delay(2, "A", wait=True)
    wait_for(lambda: "A" in gates.entered, what="A in its body")
    harness.expire_all(store)
    b = keyed.delay(2, "B", wait=True)  # takes the key over, and is still running
    wait_for(lambda: "B" in gates.entered, what="B in its body")
    gates.open("A")
    with pytest.raises(LeaseHeld, match=b.id):  # FAILURE, naming the winner: never PENDING
        a.get(timeout=30)
    keyed.fence_on_busy = "ignore"
    c = keyed.delay(2, "C")  # a third task id meets B's live lease: ignored, but ready
    with pytest.raises(LeaseHeld, match=b.id):
        c.get(timeout=30)
    gates.open("B")
    assert b.get(timeout=30) == "done by B"


def test_a_copy_of_the_same_task_id_is_absorbed_whatever_the_key_and_policy(
    app: Celery, store: Any, gates: Gates
) -> None:
    keyed = app.tasks["endings.keyed"]
    keyed.fence_on_busy = "fail"  # a copy must never reach the policy, which would store FAILURE
    task_id = str(uuid.uuid4())  # the memory result backend is shared by every app in the process
    first = keyed.apply_async((3, "X"), {"wait": True}, task_id=task_id)
    wait_for(lambda: "X" in gates.entered, what="the first copy in its body")
    absorbed: list[str] = []

    def on_duplicate(sender: Any = None, reason: str = "", **_: Any) -> None:
        absorbed.append(reason)

    lease_duplicate.connect(on_duplicate, weak=False)
    try:
        keyed.apply_async((3, "X"), {"wait": True}, task_id=task_id)  # the broker's copy, same id
        wait_for(lambda: absorbed == ["held"], what="the copy to be absorbed")
    finally:
        lease_duplicate.disconnect(on_duplicate)
    assert first.state != "FAILURE"
    gates.open("X")
    assert first.get(timeout=30) == "done by X" and first.state == "SUCCESS"
    assert [e.event for e in store.history("k:3")] == ["acquire", "complete"]


def test_a_copy_of_a_running_task_id_looks_again_soon_without_spending_retries(
    app: Celery, store: Any, gates: Gates
) -> None:
    """The copy is sent again after one renew interval (10 s of a 30 s ttl), not the holder's whole
    remaining ttl, and with its retries unspent: with max_retries=0 it is still sent again, not dropped."""
    keyed = app.tasks["endings.keyed"]
    keyed.max_retries = 0
    task_id = str(uuid.uuid4())
    published: list[dict[str, Any]] = []

    def on_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
        if (headers or {}).get("id") == task_id:
            published.append({**(headers or {}), "at": time.time()})

    before_task_publish.connect(on_publish, weak=False)
    try:
        first = keyed.apply_async((4, "Y"), {"wait": True}, task_id=task_id)
        wait_for(lambda: "Y" in gates.entered, what="the first copy in its body")
        keyed.apply_async((4, "Y"), {"wait": True}, task_id=task_id)  # the broker's copy, same id
        wait_for(lambda: len(published) == 3, what="the copy to be sent again")
    finally:
        before_task_publish.disconnect(on_publish)
        keyed.max_retries = 3
        gates.open("Y")
    again = published[2]
    assert again["retries"] == 0 and again["fence_looks"] == 1
    countdown = datetime.fromisoformat(again["eta"]).timestamp() - again["at"]
    assert 9.0 < countdown <= 10.0  # one renew interval; the holder's lease had about 30 s to run
    assert first.get(timeout=30) == "done by Y"
