"""What a real worker started with ``-E`` publishes: Celery's own task events for an ordinary fenced run and
no ``task-fence-*`` event of its own, and a ``task-fence-takeover`` for a run that took a
silent holder's lease over."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery.events.state import State

from .fenced_app import record, record_keyed
from .workers import marks, wait_for
from .world import Cluster

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

    def state(self) -> State:
        """What Flower keeps: every event so far through Celery's ``State``, in the order received."""
        state = State()
        for event in list(self.seen):
            state.event(dict(event))
        return state


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


def test_flower_keeps_a_requeued_runs_success_without_the_refusal_and_says_the_fence_sent_it_again(
    cluster: Cluster, events: Events
) -> None:
    """An operator's release under a running task: its write is refused, nobody took the
    key over, so the run sends itself again (same id) and the copy succeeds. Flower's row (Celery's
    ``State``) ends SUCCESS with no stale ``exception``, not as its own parent or child, ``retries`` 0 (the
    fence's re-send spends none), and says in its result that the fence sent it again."""
    cluster.worker("a")
    result = record.apply_async(("requeued",), {"pause": 3.0})
    wait_for(lambda: marks(cluster.workdir, result.id, "started"), 30, "the run to start")
    cluster.store.force_release(result.id)
    result.get(timeout=60)
    wait_for(lambda: "task-succeeded" in events.of(result.id), 30, "task-succeeded")
    assert "task-fence-refused" in events.of(result.id)  # the refusal was published while it lasted
    task = events.state().tasks[result.id]
    assert task.state == "SUCCESS"
    assert task.exception is None and task.traceback is None
    assert task.parent_id is None and [child.id for child in task.children] == []
    assert task.retries == 0
    assert task.result.endswith("  [fence: sent again by the fence once, no retry spent]"), task.result
    assert task.fence == "sent again by the fence once, no retry spent"


def test_flower_keeps_a_busy_keys_success_without_the_retry_exception(
    cluster: Cluster, events: Events
) -> None:
    """A second task id of a held key looks again (RETRY, ``LeaseHeld``) until the key is
    done; its row ends SUCCESS without that exception and says how often it looked."""
    cluster.worker("a", concurrency=2)
    holder = record_keyed.apply_async(("busy",), {"pause": 3.0})
    wait_for(lambda: marks(cluster.workdir, holder.id, "started"), 30, "the holder to start")
    waiter = record_keyed.apply_async(("busy",))
    waiter.get(timeout=60)
    wait_for(lambda: "task-succeeded" in events.of(waiter.id), 30, "task-succeeded")
    assert "task-retried" in events.of(waiter.id)
    task = events.state().tasks[waiter.id]
    assert task.state == "SUCCESS" and task.exception is None and task.traceback is None
    assert task.parent_id is None and [child.id for child in task.children] == []
    assert task.retries == 0
    assert "[fence: looked again at its held key" in task.result
