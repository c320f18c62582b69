"""``celery worker --fence-metrics-port``: a prefork worker of two processes serves its counters, summed
over both, from its main process; scraped with plain urllib (Redis store: it reports takeovers)."""

from __future__ import annotations

import os
import re
import urllib.request
import uuid
from pathlib import Path

import pytest

from celery_fence.testing import free_port

from .fenced_app import record
from .workers import wait_for
from .world import Cluster, on_every_store, paused_run_taken_over

pytestmark = pytest.mark.integration

SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")
TASK = "tests.integration.fenced_app.record"


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        return str(answer.read().decode())


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    found = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and not line.startswith("#"):
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
            found[match.group(1), labels] = float(match.group(3))
    return found


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((f"celery_fence_{name}", frozenset({"task": TASK, **labels}.items())), 0.0)


@pytest.mark.parametrize("cluster", on_every_store(ttl="2"), indirect=True)
def test_a_prefork_worker_serves_its_fence_counters(cluster: Cluster) -> None:
    port, tmp = free_port(), cluster.workdir / "tmp-m"  # the worker's temp dir: its metrics folder goes there
    tmp.mkdir()
    metrics = ("--fence-metrics-port", str(port))
    worker = cluster.worker("m", env={"TMPDIR": str(tmp)}, concurrency=2, extra=metrics)
    done = [record.apply_async((f"item-{i}",), {"pause": 1.5 if i == 0 else 0.0}) for i in range(3)]
    for result in done:
        result.get(timeout=30)
    assert record.apply_async(("again",), task_id=done[1].id).get(timeout=30)["item"] == "item-1"
    abandoned = str(uuid.uuid4())
    cluster.store.acquire(abandoned, "a worker that died", 1.0)  # its lease expires, unreleased
    wait_for(lambda: (cluster.store.get(abandoned).expires_in or 0) <= 0, what="the dead lease to expire")
    record.apply_async(("abandoned",), task_id=abandoned).get(timeout=30)
    paused_run_taken_over(cluster)
    # 3 runs, the abandoned key's new run, the paused run and its takeover: 6 acquires, 6 ends.

    def all_ended() -> str | None:
        text = scrape(port)
        return text if value(text, "lease_hold_seconds_count") == 6 else None

    text = wait_for(all_ended, what="every run's end to be counted")
    if os.environ.get("FENCE_METRICS_SCRAPE"):
        Path(os.environ["FENCE_METRICS_SCRAPE"]).write_text(text)
    assert value(text, "acquired_total") == 6
    assert value(text, "takeover_total") == 2
    # Only Redis (and memory) can tell how long the old lease had been expired (docs/metrics.md).
    latency_known = cluster.store.url.startswith("redis")
    assert value(text, "takeover_latency_seconds_count") == (2 if latency_known else 0)
    assert value(text, "duplicate_total", reason="done") == 1
    assert value(text, "refused_total") == 1
    assert value(text, "renewed_total") >= 1  # the 1.5 s run outlives a renew interval (2 s ttl / 3)
    assert value(text, "recovered_total") == 0
    assert 'key="' not in text and 'token="' not in text and abandoned not in text  # low cardinality
    assert len(list(tmp.glob("celery-fence-metrics-*"))) == 1
    worker.stop()
    assert list(tmp.glob("celery-fence-metrics-*")) == []  # removed when the worker's main process exited


@pytest.mark.parametrize("cluster", [{"store": "sqlite"}], indirect=True)
def test_counters_never_go_back_when_a_pool_process_exits(cluster: Cluster) -> None:
    """Each run in a pool process of its own (``--max-tasks-per-child 1``): every process that counted has
    exited by the next scrape, and the counts it made are still there, adding up."""
    port, tmp = free_port(), cluster.workdir / "tmp-m"
    tmp.mkdir()
    extra = ("--fence-metrics-port", str(port), "--max-tasks-per-child", "1")
    cluster.worker("m", env={"TMPDIR": str(tmp)}, concurrency=1, extra=extra)
    seen = []
    for i in range(1, 5):
        record.apply_async((f"child-{i}",)).get(timeout=30)
        count = wait_for(
            lambda i=i: (
                value(scrape(port), "lease_hold_seconds_count") >= i and value(scrape(port), "acquired_total")
            ),
            what=f"run {i} to be counted",
        )
        seen.append(count)
    assert seen == [1, 2, 3, 4]
