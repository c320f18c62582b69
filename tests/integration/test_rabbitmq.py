"""RabbitMQ's own redeliveries on real workers.

A task that runs past RabbitMQ's ``consumer_timeout`` gets its channel closed, and its unacked message goes
back to the queue **while the first run is still going**. The node here is private, with a consumer timeout
of 2 s checked every 0.2 s (RabbitMQ 3.10 sets it for the whole node only; 3.12+ also per queue).
"""

from __future__ import annotations

import uuid

import pytest

from .fenced_app import record
from .workers import marks, wait_for
from .world import Cluster, on_rabbitmq

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("cluster", [on_rabbitmq(consumer_timeout="2000")], indirect=True)
def test_a_redelivery_after_the_consumer_timeout_is_absorbed(cluster: Cluster) -> None:
    """The body runs 8 s, the consumer timeout is 2 s: RabbitMQ closes the channel and delivers the message
    again mid-run (to the other worker). One effect, one completion, and the task's result is the first
    run's. Celery (5.7) treats the closed channel as an unrecoverable error: the first run's worker logs it
    CRITICAL, lets its running task finish (warm shutdown) and exits."""
    cluster.worker("a", concurrency=2)
    cluster.worker("b", concurrency=2)
    task_id = str(uuid.uuid4())
    result = record.apply_async(("slow",), {"pause": 8.0}, task_id=task_id)
    ((pid, _),) = wait_for(lambda: marks(cluster.workdir, task_id, "started"), what="the first run")
    holder = next(w for w in cluster.workers if pid in w.children())
    received = f"record[{task_id}] received"
    wait_for(lambda: sum(w.log_text().count(received) for w in cluster.workers) >= 2, 30, "a redelivery")
    assert not marks(cluster.workdir, task_id, "wrote"), "redelivered only after the first run: no fault"
    first = result.get(timeout=60)
    assert first["item"] == "slow" and first["pid"] == pid  # the first run's result
    assert len(marks(cluster.workdir, task_id, "started")) == 1  # the copy never ran the body
    assert cluster.effects(task_id) == [(task_id, first["token"], task_id, pid)]
    events = cluster.events(task_id)
    assert [e for e, _ in events].count("complete") == 1
    assert events[0] == ("acquire", first["token"])
    timed_out = [
        w for w in cluster.workers if "PRECONDITION_FAILED - delivery acknowledgement" in w.log_text()
    ]
    assert timed_out == [holder], "the consumer timeout never fired, or not on the first run's channel"
    wait_for(lambda: holder.proc.poll() is not None, 30, "the timed-out worker to exit")
