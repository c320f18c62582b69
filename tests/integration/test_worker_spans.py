"""OpenTelemetry on a real worker: a prefork worker of two processes, each instrumented by
opentelemetry-instrumentation-celery once forked and writing its spans to a file
(tests/integration/otel_spans.py); the fence connected its span receivers at the worker's start
(celery_fence.telemetry). Each run's span carries the fence's key, token and ending, a takeover, and the
events of a lost lease and a refused write (Redis store: it says how long a lease taken over had expired)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from .fenced_app import record, record_keyed
from .workers import marks, wait_for
from .world import Cluster, paused_run_taken_over

pytestmark = pytest.mark.integration


def run_spans(workdir: Path, task_id: str) -> list[dict[str, Any]]:
    """The finished ``run/...`` spans of ``task_id`` in the order they ended, each as its fence attributes
    and event names."""
    found = []
    for path in sorted(workdir.glob("spans.*.jsonl")):
        for line in path.read_text().splitlines():
            span = json.loads(line)
            attributes = span["attributes"]
            if span["name"].startswith("run/") and attributes.get("messaging.message.id") == task_id:
                fence = {k: v for k, v in attributes.items() if k.startswith("fence.")}
                events = [name for name, _ in span["events"] if name.startswith("fence.")]
                found.append((span["end"], {**fence, "events": events}))
    return [span for _, span in sorted(found, key=lambda pair: pair[0])]


def spans_ending(workdir: Path, task_id: str, *endings: str) -> list[dict[str, Any]]:
    """Wait until ``task_id`` has one finished span per ending in ``endings``; its spans, in that order."""

    def ended() -> list[dict[str, Any]] | None:
        spans = run_spans(workdir, task_id)
        if sorted(s.get("fence.ending", "") for s in spans) != sorted(endings):
            return None
        return sorted(spans, key=lambda s: endings.index(s["fence.ending"]))

    found: list[dict[str, Any]] = wait_for(ended, what=f"the spans of {task_id} ending {endings}")
    return found


@pytest.mark.parametrize("cluster", [{"store": "redis", "ttl": "2"}], indirect=True)
def test_a_workers_task_spans_carry_the_fence(cluster: Cluster) -> None:
    cluster.worker("otel", concurrency=2, extra=("-I", "tests.integration.otel_spans"))
    work = cluster.workdir

    done = record.apply_async(("one",))
    token = done.get(timeout=30)["token"]
    record.apply_async(("again",), task_id=done.id).get(timeout=30)  # the same id once it finished
    completed, duplicate = spans_ending(work, done.id, "completed", "duplicate")
    assert completed == {
        "fence.key": done.id, "fence.token": token, "fence.takeover": False, "fence.ending": "completed",
        "events": [],
    }  # fmt: skip
    assert duplicate == {
        "fence.key": done.id, "fence.token": token, "fence.duplicate.reason": "done",
        "fence.ending": "duplicate", "events": [],
    }  # fmt: skip

    # Another task id of a key a run holds: sent again (fence_on_busy="retry"), then finds the key done.
    holder = record_keyed.apply_async(("busy",), {"pause": 2.0})
    wait_for(lambda: marks(work, holder.id, "started"), what="the holder to start")
    waiting = record_keyed.apply_async(("busy",))
    assert waiting.get(timeout=30) == holder.get(timeout=30)

    def absorbed_at_last() -> list[dict[str, Any]] | None:
        spans = run_spans(work, waiting.id)
        return spans if spans and spans[-1].get("fence.ending") == "duplicate" else None

    spans = wait_for(absorbed_at_last, what="the waiting run's last span")
    *requeued, absorbed = spans  # it looked again as often as the holder's lease said (once, twice)
    assert requeued and all(
        span == {"fence.key": "item:busy", "fence.ending": "requeued", "events": []} for span in requeued
    ), requeued
    assert absorbed["fence.duplicate.reason"] == "done" and absorbed["fence.key"] == "item:busy"

    abandoned = str(uuid.uuid4())
    cluster.store.acquire(abandoned, "a worker that died", 1.0)  # its lease expires, unreleased
    wait_for(lambda: (cluster.store.get(abandoned).expires_in or 0) <= 0, what="the dead lease to expire")
    record.apply_async(("abandoned",), task_id=abandoned).get(timeout=30)
    (taken,) = spans_ending(work, abandoned, "completed")
    assert taken["fence.takeover"] is True and taken["fence.token"] == cluster.store.get(abandoned).token
    assert taken["fence.takeover.expired_for"] >= 0

    paused = paused_run_taken_over(cluster)  # stopped past its lease, taken over, resumed and refused
    stale, winner = spans_ending(work, paused, "refused", "completed")
    assert stale["fence.takeover"] is False and stale["events"] == ["fence.lease_lost", "fence.write_refused"]
    assert winner["fence.takeover"] is True and winner["fence.token"] > stale["fence.token"]
