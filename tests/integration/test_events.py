"""What a real worker started with ``-E`` publishes: Celery's own task events for an ordinary fenced run and
no ``task-fence-*`` event of its own (issue 16.1), and a ``task-fence-takeover`` for a run that took a
silent holder's lease over."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import Cluster
from .fenced_app import record
from .workers import wait_for

pytestmark = pytest.mark.integration


class Events:
    """Every event on the cluster's broker, captured from before the first task is sent."""

    def __init__(self, app: Any) -> None:
        self.seen: list[dict[str, Any]] = []
        self._connection = app.connection_for_read()
        self._receiver = app.events.Receiver(self._connection, handlers={"*": self.seen.append})
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._capture, daemon=True)

    def _capture(self) -> None:
        for _ in self._receiver.consume(limit=None, timeout=None, wakeup=False):  # pragma: no branch
            self._ready.set()  # consume() yields once it is bound to the events exchange

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)

    def stop(self) -> None:
        self._receiver.should_stop = True
        self._thread.join(15)
        self._connection.release()

    def of(self, task_id: str) -> list[str]:
        return [e["type"] for e in list(self.seen) if e.get("uuid") == task_id]


@pytest.fixture
def events(cluster: Cluster) -> Iterator[Events]:
    captured = Events(cluster.app)
    captured.start()
    try:
        yield captured
    finally:
        captured.stop()


def test_an_ordinary_run_publishes_only_celerys_own_events(cluster: Cluster, events: Events) -> None:
    cluster.worker("a")  # started with -E, as Flower users run it
    result = record.apply_async(("ordinary",))
    result.get(timeout=30)
    wait_for(lambda: "task-succeeded" in events.of(result.id), 30, "task-succeeded")
    assert [kind for kind in events.of(result.id) if kind.startswith("task-fence-")] == []
    assert {"task-received", "task-started", "task-succeeded"} <= set(events.of(result.id))
    assert cluster.events(result.id)[-1][0] == "complete"


def test_a_takeover_publishes_one_task_fence_takeover(cluster: Cluster, events: Events) -> None:
    cluster.worker("a")
    task_id = str(uuid.uuid4())
    silent = cluster.store.acquire(task_id, "a holder that went silent", 1.0)
    wait_for(lambda: (cluster.store.get(task_id).expires_in or 0) <= 0, 30, "the silent lease to expire")
    result = record.apply_async(("taken over",), task_id=task_id)
    result.get(timeout=30)
    wait_for(lambda: "task-succeeded" in events.of(task_id), 30, "task-succeeded")
    ours = [e for e in events.seen if e.get("uuid") == task_id]
    fence_events = [e for e in ours if e["type"].startswith("task-fence-")]
    assert [e["type"] for e in fence_events] == ["task-fence-takeover"]
    assert fence_events[0]["key"] == task_id and fence_events[0]["token"] > silent.token
    assert "expired_for" in fence_events[0]  # seconds, or None where the store does not say (PostgreSQL)
