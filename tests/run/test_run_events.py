"""What a worker's run sends where monitoring (Flower, ``celery events``) and callers see it, through
Celery's in-process worker: ``task-fence-duplicate`` when ``fence_on_busy="ignore"`` turns a run away (claim
C17), ``task-fence-lost`` when the renewer finds the lease lost (claim C19), and nothing at all but its
refusal from a run refused while a copy of its own task id holds the key. Each test fails when the line (or
the decide table's row) it is named for is changed (docs/reliability.md, "Mutation testing")."""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.signals import before_task_publish

from celery_fence import FencedTask, LeaseHeld
from celery_fence._runtime import Renewer, runtime_for
from celery_fence.testing import wait_for
from tests.support.harnesses import Harness
from tests.support.inprocess import memory_app, running_worker

TTL = 30.0


pytestmark = pytest.mark.stores("memory", "sqlite")


class Sent:
    """Stands in for the app's event dispatcher: keeps what the runs send, by kind."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, **_: Any) -> Sent:
        return self

    def __enter__(self) -> Sent:
        return self

    def __exit__(self, *_: Any) -> None:
        return None

    def send(self, kind: str, **fields: Any) -> None:
        self.events.append((kind, fields))

    def of(self, kind: str, task_id: str) -> list[dict[str, Any]]:
        return [fields for k, fields in self.events if k == kind and fields.get("uuid") == task_id]


class Clock:
    """The renewer's monotonic clock, moved on by the test: no waiting for a renew interval."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sent() -> Sent:
    return Sent()


@pytest.fixture
def entered() -> list[str]:
    """The tags of the runs that entered the body, in order."""
    return []


@pytest.fixture
def gates() -> dict[str, threading.Event]:
    """A run tagged ``tag`` waits in its body until the test sets ``gates[tag]``."""
    return collections.defaultdict(threading.Event)


@pytest.fixture
def app(
    store: Any, sent: Sent, clock: Clock, gates: dict[str, threading.Event], entered: list[str]
) -> Iterator[Celery]:
    app = memory_app("events", fence_store_url=store.url, fence_lease_ttl=TTL, fence_recover=False)
    app.events.default_dispatcher = sent  # type: ignore[method-assign]

    @app.task(base=FencedTask, bind=True, fence_key="k:{n}", name="events.keyed", shared=False)
    def keyed(self: Any, n: int, tag: str = "", wait: bool = False) -> str:
        entered.append(tag)
        if wait:
            gates[tag].wait(30)
        self.fence.check()
        return f"done by {tag}"

    runtime = runtime_for(app)
    runtime._store = store
    runtime._renewer = Renewer(store, runtime.config.policy.interval, clock=clock)
    with running_worker(app, pool="threads", concurrency=2):
        yield app
    for gate in gates.values():
        gate.set()
    runtime._store = None  # the harness closes the store itself
    runtime.close()


def test_on_busy_ignore_sends_task_fence_duplicate_naming_the_holder(
    app: Celery, store: Any, sent: Sent, monkeypatch: pytest.MonkeyPatch
) -> None:
    keyed = app.tasks["events.keyed"]
    monkeypatch.setattr(keyed, "fence_on_busy", "ignore")
    store.acquire("k:1", "someone-else", TTL)
    result = keyed.apply_async((1,), task_id=str(uuid.uuid4()))
    with pytest.raises(LeaseHeld):
        result.get(timeout=30)
    (event,) = sent.of("task-fence-duplicate", result.id)
    assert (event["key"], event["token"]) == ("k:1", 0)
    assert "someone-else" in event["reason"]  # the holder, as the stored LeaseHeld names it


def test_a_lost_lease_sends_task_fence_lost_with_its_token(
    app: Celery,
    store: Any,
    harness: Harness,
    clock: Clock,
    gates: dict[str, threading.Event],
    sent: Sent,
) -> None:
    keyed, task_id = app.tasks["events.keyed"], str(uuid.uuid4())
    result = keyed.apply_async((2,), {"tag": "A", "wait": True}, task_id=task_id)
    wait_for(lambda: store.get("k:2") is not None, what="the run to hold k:2")
    token = store.get("k:2").token
    harness.expire_all(store)
    store.acquire("k:2", "the-taker", TTL)  # taken over: the run's next renew is refused
    clock.offset += TTL / 3
    runtime_for(app).renewer.tick()
    (event,) = sent.of("task-fence-lost", task_id)
    assert (event["key"], event["token"]) == ("k:2", token) and event["reason"]
    gates["A"].set()  # check() raises LeaseLost: refused, the taker holds the key
    wait_for(lambda: sent.of("task-fence-refused", task_id), what="the lost run to be refused")
    assert len(sent.of("task-fence-lost", task_id)) == 1 and result.id == task_id  # said once


def test_a_run_refused_while_a_copy_of_its_task_id_holds_the_key_ends_quietly(
    app: Celery,
    store: Any,
    harness: Harness,
    gates: dict[str, threading.Event],
    sent: Sent,
    entered: list[str],
) -> None:
    """The copy delivers the task id's result: the refused run stores nothing and sends nothing again."""
    keyed, task_id = app.tasks["events.keyed"], str(uuid.uuid4())
    result = keyed.apply_async((3,), {"tag": "A", "wait": True}, task_id=task_id)
    wait_for(lambda: "A" in entered, what="A in its body")
    harness.expire_all(store)  # A stalls past its lease; the broker's copy (same id) takes the key over
    keyed.apply_async((3,), {"tag": "B", "wait": True}, task_id=task_id)
    wait_for(lambda: "B" in entered, what="the copy in its body")
    sent_again: list[str] = []

    def on_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
        sent_again.append((headers or {}).get("id", ""))

    before_task_publish.connect(on_publish, weak=False)
    try:
        gates["A"].set()  # A returns: its completion is refused (StaleToken), the copy holds the key
        wait_for(lambda: sent.of("task-fence-refused", task_id), what="A's refusal")
        time.sleep(0.2)  # what a wrong ending would store or send, it does at once
        assert result.state == "PENDING" and task_id not in sent_again
    finally:
        before_task_publish.disconnect(on_publish)
    gates["B"].set()
    assert result.get(timeout=30) == "done by B" and entered == ["A", "B"]
