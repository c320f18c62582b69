"""``fence_mode="commit"`` on real prefork workers (docs/commit-mode.md, "A worker that dies"): a run holds no
lease, so when its process dies the database rolls its transaction back and only the broker's own redelivery
runs the task again. Failpoints hold the runs at the moment to strike: ``before-commit`` (the body's
``transaction()`` write sent, the claim and ``COMMIT`` not yet) and ``before-acquire`` (a run received, its
transaction not yet opened). The stores are PostgreSQL and SQLite, the two that fence a commit; the broker is
Redis (RabbitMQ too for a killed pool process).

Which redelivery: a pool process killed under a live worker comes back at once with
``task_reject_on_worker_lost``; without it Celery acks the message as failed and it never comes back. A whole
worker killed leaves the message unacked: Redis restores it once ``visibility_timeout`` has passed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_fence._failpoints import ENV as FAILPOINTS
from celery_fence.testing import assert_history_clean

from .commit_app import commit_write, commit_write_then_fail, commit_write_unrejected
from .workers import Worker, marks, wait_for
from .world import Cluster, on_rabbitmq

pytestmark = pytest.mark.integration

APP = "tests.integration.commit_app"
SQL = [pytest.param({"store": store}, id=store) for store in ("postgresql", "sqlite")]


def _worker(cluster: Cluster, name: str, queue: str | None = None) -> Worker:
    return cluster.worker(name, queues=queue, app_path=APP, env={FAILPOINTS: str(_points(cluster))})


def _points(cluster: Cluster) -> Path:
    points = cluster.workdir / "failpoints"
    points.mkdir(exist_ok=True)
    return points


def _hold(cluster: Cluster, point: str) -> Path:
    """Every run that reaches ``point`` from now on waits there until the returned file goes."""
    block = _points(cluster) / f"{point}.block"
    block.touch()
    return block


def _reached(cluster: Cluster, point: str) -> list[int]:
    """The pids of the processes that reached ``point`` while it was held, first first."""
    files = _points(cluster).glob(f"{point}.*.reached")
    return [pid for _, pid in sorted((float(p.read_text() or 0), int(p.name.split(".")[1])) for p in files)]


def _logged(cluster: Cluster, task: Any, task_id: str, what: str) -> int:
    """How many deliveries of ``task_id`` the workers' logs say ``what`` of (received, succeeded...)."""
    line = f"{task.name}[{task_id}] {what}"
    return sum(worker.log_text().count(line) for worker in cluster.workers)


def _in_broker(cluster: Cluster, task_id: str) -> dict[str, Any]:
    """Where the Redis broker holds ``task_id``'s message: ``queued`` (waiting in the test's queue) and
    ``delivered_at`` (delivered, unacked: the time its restore sweep compares with ``visibility_timeout``)."""
    client = redis.Redis.from_url(cluster.env["FENCE_IT_BROKER"])
    try:
        queued = [json.loads(m)["headers"]["id"] for m in client.lrange(cluster.queue, 0, -1)]
        unacked = {tag: json.loads(m)[0]["headers"]["id"] for tag, m in client.hgetall("unacked").items()}
        tags = [tag for tag, found in unacked.items() if found == task_id]
        delivered_at = client.zscore("unacked_index", tags[0]) if tags else None
    finally:
        client.close()
    return {"queued": task_id in queued, "delivered_at": delivered_at}


def _visible(cluster: Cluster, key: str) -> list[tuple[Any, ...]]:
    """``cluster.effects(key)`` as another connection sees them now, while a held run may keep SQLite's write
    lock: there, a plain read (the store's engine opens every transaction with ``BEGIN IMMEDIATE``, which
    would wait for that lock)."""
    if not cluster.store.url.startswith("sqlite"):
        return cluster.effects(key)
    with contextlib.closing(sqlite3.connect(cluster.store.url.split(":///", 1)[1])) as conn:
        query = "SELECT key, token, task_id, pid FROM fence_it_effects WHERE key = ?"
        return [tuple(row) for row in conn.execute(query, (key,))]


def _held_before_claim(cluster: Cluster, task: Any) -> tuple[Any, str, int, Path]:
    """Send ``task`` for a key of its own; once its run wrote and waits before its claim: its result, the key,
    the pid of the process running it, and the file that holds it there."""
    item = uuid.uuid4().hex[:12]
    block = _hold(cluster, "before-commit")
    result = task.apply_async((item,))
    (pid,) = wait_for(lambda: _reached(cluster, "before-commit"), 30, "the body's write, before the claim")
    return result, f"commit:{item}", pid, block


def _committed_once(cluster: Cluster, key: str, task_id: str, outcome: dict[str, Any]) -> None:
    """The key is done by ``task_id``'s run, whose one write is the only row; its history one ``commit``."""
    assert outcome["by"] == task_id
    assert cluster.effects(key) == [(key, 0, task_id, outcome["pid"])]  # token 0: no lease in the body
    state = cluster.store.get(key)
    assert state is not None and state.done and state.result == outcome
    assert [event for event, _ in cluster.events(key)] == ["commit"]
    assert_history_clean(cluster.store, key)


@pytest.mark.parametrize("cluster", [*SQL, on_rabbitmq()], indirect=True)
def test_a_pool_process_killed_before_its_claim_leaves_no_write_and_the_redelivery_commits_once(
    cluster: Cluster,
) -> None:
    """SIGKILL the pool process between its write and its claim: nothing of it stays, and the broker's
    redelivery (acks_late + task_reject_on_worker_lost) runs the task again, which commits."""
    _worker(cluster, "a")
    result, key, pid, block = _held_before_claim(cluster, commit_write)
    assert [p for p, _ in marks(cluster.workdir, result.id, "wrote")] == [pid]  # written, not committed
    os.kill(pid, signal.SIGKILL)
    killed_at = time.time()
    assert _visible(cluster, key) == [] and cluster.store.get(key) is None  # no write, no key, no lease
    block.unlink()
    outcome = result.get(timeout=60)
    assert outcome["pid"] != pid
    ((_, again_at),) = [m for m in marks(cluster.workdir, result.id, "started") if m[0] != pid]
    print(f"\n{cluster.store.url.split(':')[0]}: run again {again_at - killed_at:.2f}s after SIGKILL")
    _committed_once(cluster, key, result.id, outcome)
    assert [p for p, _ in marks(cluster.workdir, result.id, "redelivered")] == [outcome["pid"]]
    assert [p for p, _ in marks(cluster.workdir, result.id, "started")] == [pid, outcome["pid"]]
    wait_for(lambda: _logged(cluster, commit_write, result.id, "succeeded"), 30, "the success in the log")
    assert result.state == "SUCCESS"
    assert _logged(cluster, commit_write, result.id, "received") == 2
    assert _logged(cluster, commit_write, result.id, "succeeded") == 1


@pytest.mark.parametrize("cluster", SQL, indirect=True)
def test_a_pool_process_killed_between_its_failures_mark_and_its_failure_ends_failure_once(
    cluster: Cluster,
) -> None:
    """A run that fails first marks its key failed by its task id (one ending per task id), then Celery stores
    the FAILURE. SIGKILL the pool process in between: nothing is stored. The broker's redelivery meets the
    mark before its body, finds no FAILURE stored, looks again a ttl later (the failed run may still be
    storing it), and then ends FAILURE with ``FailedBefore``: the body ran once, nothing of it committed, and
    the task id ends once, not PENDING for ever."""
    _worker(cluster, "a")
    item = uuid.uuid4().hex[:12]
    key, block = f"commit:{item}", _hold(cluster, "after-mark")
    result = commit_write_then_fail.apply_async((item,))
    (pid,) = wait_for(lambda: _reached(cluster, "after-mark"), 30, "the FAILURE's mark")
    os.kill(pid, signal.SIGKILL)
    block.unlink()
    wait_for(lambda: result.state == "FAILURE", 60, "the FAILURE, ended by the redelivery")
    assert type(result.result).__name__ == "FailedBefore", result.result
    assert "ended FAILURE (RuntimeError)" in str(result.result)
    assert [p for p, _ in marks(cluster.workdir, result.id, "started")] == [pid]  # the body ran once
    assert _visible(cluster, key) == []
    state = cluster.store.get(key)
    assert state is not None and not state.done and "ended FAILURE (RuntimeError)" in (state.dead or "")
    assert [event for event, _ in cluster.events(key)] == ["gave-up"]
    raised = lambda: _logged(cluster, commit_write_then_fail, result.id, "raised")  # noqa: E731
    wait_for(raised, 30, "the FAILURE in the log")
    assert raised() == 1  # the redelivery's, alone


@pytest.mark.parametrize("cluster", [{"store": "postgresql"}], indirect=True)
def test_without_reject_on_worker_lost_a_killed_pool_process_is_acked_and_its_task_lost(
    cluster: Cluster,
) -> None:
    """Without ``task_reject_on_worker_lost`` Celery's main process acknowledges the message of a pool process
    that died (``acks_on_failure_or_timeout``) and stores FAILURE: the message is gone from the broker, so
    ``visibility_timeout`` never brings it back, and the run's write rolled back with no key done. A commit
    mode task on a prefork worker needs ``task_reject_on_worker_lost`` (or a whole worker lost, below)."""
    _worker(cluster, "a")
    result, key, pid, block = _held_before_claim(cluster, commit_write_unrejected)
    os.kill(pid, signal.SIGKILL)
    block.unlink()
    wait_for(lambda: result.state == "FAILURE", 30, "the lost pool process's FAILURE")
    assert type(result.result).__name__ == "WorkerLostError"
    gone = {"queued": False, "delivered_at": None}
    wait_for(lambda: _in_broker(cluster, result.id) == gone, 30, "the ack")
    assert _visible(cluster, key) == [] and cluster.store.get(key) is None
    assert _logged(cluster, commit_write_unrejected, result.id, "received") == 1


@pytest.mark.parametrize("cluster", [{"store": "postgresql", "visibility": "6"}], indirect=True)
def test_a_whole_worker_killed_before_its_claim_is_redelivered_after_the_visibility_timeout(
    cluster: Cluster,
) -> None:
    """SIGKILL the whole worker (main process and pool) between the write and the claim: nobody acks or
    rejects, so the message stays in Redis's unacked set until ``visibility_timeout`` passes and a worker's
    restore sweep puts it back in the queue; the next worker runs it, flagged redelivered, and it commits
    once. 6 s: far above the time from delivery to the kill, so the live worker cannot restore its own
    message before it is killed."""
    first = _worker(cluster, "a")
    result, key, pid, block = _held_before_claim(cluster, commit_write_unrejected)
    os.killpg(first.pid, signal.SIGKILL)  # its own process group: the main process and its pool
    first.stop()
    block.unlink()
    broker = _in_broker(cluster, result.id)
    assert not broker["queued"] and broker["delivered_at"] is not None  # unacked, not yet restored
    assert _visible(cluster, key) == [] and cluster.store.get(key) is None
    _worker(cluster, "b")
    outcome = result.get(timeout=60)
    assert outcome["pid"] != pid
    _committed_once(cluster, key, result.id, outcome)
    ((redelivered_pid, restarted_at),) = marks(cluster.workdir, result.id, "redelivered")
    assert redelivered_pid == outcome["pid"]
    assert _in_broker(cluster, result.id) == {"queued": False, "delivered_at": None}
    again = restarted_at - broker["delivered_at"]
    print(f"\n{cluster.store.url.split(':')[0]}: run again {again:.2f}s after its first delivery")


@pytest.mark.parametrize("cluster", SQL, indirect=True)
def test_a_duplicate_sent_to_two_workers_at_once_commits_one_write(cluster: Cluster) -> None:
    """Two task ids, one key, on two workers at once. Both runs are held before they open their transaction,
    then before their claim. On PostgreSQL both read the key (not done) and write; released, one claim commits
    and the other's waits on the key's unique index, changes no row, rolls back its write and is recorded
    ``refused``. On SQLite the first transaction holds the database's write lock from its read: the second
    run waits at its read, finds the key done and never runs its body. Either way both ids end with the
    winner's result."""
    _worker(cluster, "a", f"{cluster.queue}-a")
    _worker(cluster, "b", f"{cluster.queue}-b")
    item = uuid.uuid4().hex[:12]
    key = f"commit:{item}"
    opening = _hold(cluster, "before-acquire")
    results = [commit_write.apply_async((item,), queue=f"{cluster.queue}-{name}") for name in "ab"]
    wait_for(lambda: len(_reached(cluster, "before-acquire")) == 2, 30, "both runs, before their read")
    claiming = _hold(cluster, "before-commit")
    opening.unlink()
    sqlite = cluster.store.url.startswith("sqlite")
    writers = 1 if sqlite else 2  # SQLite's second run waits for the write lock at its read
    wait_for(lambda: len(_reached(cluster, "before-commit")) == writers, 30, "the writes, before the claims")
    assert _visible(cluster, key) == []
    claiming.unlink()
    outcomes = [result.get(timeout=60) for result in results]
    winner = outcomes[0]["by"]
    assert outcomes[1] == outcomes[0] and winner in {r.id for r in results}
    loser = next(r.id for r in results if r.id != winner)
    assert cluster.effects(key) == [(key, 0, winner, outcomes[0]["pid"])]
    history = cluster.store.history(key)
    assert Counter(e.event for e in history) == ({"commit": 1} if sqlite else {"commit": 1, "refused": 1})
    assert [e.detail for e in history if e.event == "refused"] == ([] if sqlite else ["commit"])
    assert_history_clean(cluster.store, key)
    loser_wrote = len(marks(cluster.workdir, loser, "wrote"))
    assert loser_wrote == (0 if sqlite else 1)  # on SQLite the loser's body never ran
    assert all(r.state == "SUCCESS" for r in results)
