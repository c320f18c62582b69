"""``fence_mode="commit"`` under the fault matrix, on real ``celery worker`` processes, on PostgreSQL and
SQLite (the stores that fence a commit): runs killed in their body (the broker's redelivery runs them again:
no lease is left for recovery), copies of a run delivered at once (one claim commits), and store calls whose
outcome is unknown (the fault kit: ``begin_commit``, the claim with its commit, ``claim`` alone, ``get``).
Each case ends with one effect row and one ``commit`` per key, and ``verify`` clean (checks.settle_and_check).
"""

from __future__ import annotations

import os
import signal
import uuid
from typing import Any

import pytest

from tests.integration.commit_app import chaos_commit
from tests.integration.workers import marks, wait_for
from tests.integration.world import Cluster

from .checks import RUNS, done, settle_and_check
from .sending import BATCH, batches, every_store
from .store_faults import plan_faults

pytestmark = pytest.mark.chaos

APP = "tests.integration.commit_app"  # a worker of fenced_app's app with the fence_mode="commit" tasks
EFFECTS = "fence_it_effects"


def _send(cluster: Cluster, task_id: str, pause: float = 0.0) -> Any:
    return chaos_commit.apply_async((task_id,), {"pause": pause}, task_id=task_id, queue=cluster.queue)


def _one_writer(cluster: Cluster) -> bool:
    """SQLite: a fenced commit holds the one write lock from its read to its claim, so runs of the whole
    database go one at a time; a run stopped in its body makes every other wait (docs/commit-mode.md)."""
    return cluster.store.url.startswith("sqlite")


@pytest.mark.parametrize("cluster", every_store("postgresql", "sqlite"), indirect=True)
def test_commit_mode_runs_killed_mid_body_run_again_and_commit_once(
    cluster: Cluster, request: pytest.FixtureRequest
) -> None:
    """SIGKILL each run's pool process in its body: its transaction rolls back with the connection, the
    broker redelivers the message (acks_late, reject_on_worker_lost), and the run commits once."""
    worker = cluster.worker("a", concurrency=BATCH, app_path=APP)
    keys: list[str] = []
    # SQLite: one run at a time (a run stopped in its body holds the write lock), and half as many
    for size in batches(RUNS) if not _one_writer(cluster) else [1] * max(1, RUNS // 2):
        ids = [str(uuid.uuid4()) for _ in range(size)]
        for task_id in ids:
            _send(cluster, task_id, pause=30.0)
        started = wait_for(
            lambda ids=ids: [marks(cluster.workdir, i, "started") for i in ids]
            if all(marks(cluster.workdir, i, "started") for i in ids) else None,
            60, "every run to start",
        )
        for runs in started:
            os.kill(runs[0][0], signal.SIGKILL)
        wait_for(lambda ids=ids: all(done(cluster, i) for i in ids), 90, "the killed runs to finish")
        keys += ids
    settle_and_check(cluster, request.node.callspec.id, "commit mode: SIGKILL mid-body", keys, table=EFFECTS)
    assert all(len(marks(cluster.workdir, key, "started")) >= 2 for key in keys)  # killed, then run again
    assert [e.event for e in cluster.store.history() if e.key in keys and e.event == "recovered"] == []
    assert worker.proc.poll() is None


@pytest.mark.parametrize("cluster", every_store("postgresql", "sqlite"), indirect=True)
def test_commit_mode_copies_delivered_at_once_commit_once(
    cluster: Cluster, request: pytest.FixtureRequest
) -> None:
    """Every run delivered five times at once, over two workers: on PostgreSQL the copies run their bodies
    together and one claim commits (the others roll back, refused); on SQLite they queue at the read."""
    cluster.worker("a", concurrency=BATCH, app_path=APP)
    cluster.worker("b", concurrency=BATCH, app_path=APP)
    keys = [str(uuid.uuid4()) for _ in range(RUNS)]
    for task_id in keys:
        for _ in range(5):
            _send(cluster, task_id, pause=0.3)
    settle_and_check(cluster, request.node.callspec.id, "commit mode: 5 concurrent deliveries", keys,
                     table=EFFECTS)


@pytest.mark.parametrize("cluster", every_store("postgresql", "sqlite"), indirect=True)
def test_commit_mode_store_calls_of_unknown_outcome_commit_once(
    cluster: Cluster, request: pytest.FixtureRequest
) -> None:
    """Every store call a fenced commit makes (its transaction's opening, the claim with its commit, a claim
    alone, a read) failing before the store acts or acting with its reply lost, at most once per key (as the
    lease mode's case in test_faults.py): every caller gets SUCCESS with its result, and each key has one
    effect row and one commit."""
    calls = ("begin_commit", "commit", "claim", "get")
    plan = plan_faults(calls, ("begin_commit", "commit"), cluster.workdir / "faults.log")
    cluster.worker("a", concurrency=BATCH, app_path=APP, env=plan.env)
    for ids in plan.batches():
        results = [_send(cluster, i) for i in ids]
        assert [r.get(timeout=120)["item"] for r in results] == ids
    tally = settle_and_check(cluster, request.node.callspec.id, "commit mode: indeterminate outcomes",
                             plan.keys, table=EFFECTS)
    plan.assert_met()
    assert tally.lost == 0
