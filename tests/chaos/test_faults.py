"""The fault matrix: each fault, on each store it applies to, on real ``celery worker`` processes.

Every case runs ``FENCE_SOAK_RUNS`` faulted runs (4 in CI, one batch; ``make soak`` runs 1,000) in batches of
``BATCH`` (``FENCE_SOAK_BATCH``; one run per pool process), then checks the same invariants
(checks.settle_and_check).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time
import uuid
from pathlib import Path

import pytest

from tests.integration.fenced_app import chaos, chaos_joined
from tests.integration.workers import marks, wait_for
from tests.integration.world import Cluster

from .checks import RUNS, settle_and_check
from .sending import AND_RABBITMQ, BATCH, assert_every_key_ran_twice, batches, every_store, send
from .store_faults import plan_faults

pytestmark = pytest.mark.chaos


def _expired(cluster: Cluster, key: str) -> bool:
    state = cluster.store.get(key)
    return state is None or state.expires_in is None or state.expires_in <= 0


def _started_pids(cluster: Cluster, ids: list[str]) -> list[int]:
    found = wait_for(
        lambda: (
            [marks(cluster.workdir, i, "started") for i in ids]
            if all(marks(cluster.workdir, i, "started") for i in ids)
            else None
        ),
        60,
        "every run to start",
    )
    return [runs[0][0] for runs in found]


def _pause(cluster: Cluster, pid: int) -> None:
    """SIGSTOP ``pid``; on SQLite, never inside a write. SQLite has no server to end a stopped writer's lock,
    so one stopped mid-renew would block every takeover until it resumes (a documented SQLite limit that
    costs liveness, not safety): let such a process finish its statement, then stop it again."""
    os.kill(pid, signal.SIGSTOP)
    if not cluster.store.url.startswith("sqlite"):
        return
    path = cluster.store.url.split(":///", 1)[1]
    while not _sqlite_writable(path):  # the process stopped last holds the lock: those before it were checked
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.005)
        os.kill(pid, signal.SIGSTOP)


def _sqlite_writable(path: str) -> bool:
    conn = sqlite3.connect(path, timeout=0.5, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


@pytest.mark.parametrize("cluster", every_store(), indirect=True)
def test_runs_paused_past_their_lease_are_refused_once_redelivered(
    cluster: Cluster, request: pytest.FixtureRequest
) -> None:
    """SIGSTOP runs past their lease, redeliver them elsewhere, SIGCONT: the stale runs are refused."""
    cluster.worker("a", queues=f"{cluster.queue}-a", concurrency=BATCH)
    cluster.worker("b", queues=f"{cluster.queue}-b", concurrency=BATCH)
    keys: list[str] = []
    for size in batches(RUNS):
        # Held until released: a batch of 50 can take longer to start than a fixed pause would last.
        ids = send(f"{cluster.queue}-a", size, pause=120.0, hold=True)
        pids = _started_pids(cluster, ids)
        for pid in pids:
            _pause(cluster, pid)
        try:
            wait_for(
                lambda ids=ids: all(_expired(cluster, i) for i in ids), 30, "the paused leases to expire"
            )
            for task_id in ids:
                chaos.apply_async((task_id,), task_id=task_id, queue=f"{cluster.queue}-b")
            wait_for(lambda ids=ids: all(cluster.store.get(i).done for i in ids), 60, "the takeovers")
        finally:
            for task_id in ids:
                (cluster.workdir / f"{task_id}.release").touch()
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        refused = lambda ids=ids: all("refused" in [e for e, _ in cluster.events(i)] for i in ids)  # noqa: E731
        wait_for(refused, 60, "every stale run to be refused")
        keys += ids
    tally = settle_and_check(cluster, request.node.callspec.id, "paused past ttl", keys)
    assert tally.takeovers >= len(keys) and tally.refused >= len(keys)


@pytest.mark.parametrize("cluster", [*every_store(), AND_RABBITMQ], indirect=True)
def test_runs_killed_mid_body_are_redelivered_and_taken_over(
    cluster: Cluster, request: pytest.FixtureRequest
) -> None:
    """SIGKILL runs mid-body: acks_late + reject_on_worker_lost redeliver them; the new runs take over."""
    worker = cluster.worker(
        "a", concurrency=BATCH, extra=("--fence-recover", "--fence-recover-interval", "1")
    )
    keys: list[str] = []
    for size in batches(RUNS):
        ids = send(cluster.queue, size, pause=30.0)
        for pid in _started_pids(cluster, ids):
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda ids=ids: all(cluster.store.get(i).done for i in ids), 90, "the killed runs to finish")
        keys += ids
    settle_and_check(cluster, request.node.callspec.id, "SIGKILL mid-body", keys)
    assert_every_key_ran_twice(cluster, keys)
    assert worker.proc.poll() is None


@pytest.mark.parametrize("cluster", every_store(), indirect=True)
def test_killed_between_body_and_completion(cluster: Cluster, request: pytest.FixtureRequest) -> None:
    """A failpoint holds each run after its body; SIGKILL it there: the effect still happens once."""
    points = cluster.workdir / "failpoints"
    points.mkdir()
    cluster.worker("a", concurrency=BATCH, env={"CELERY_FENCE_FAILPOINTS": str(points)})
    keys: list[str] = []
    for size in batches(RUNS):
        block = points / "before-complete.block"
        block.touch()
        ids = send(cluster.queue, size, pause=0.0)
        reached = wait_for(lambda size=size: _reached(points, size), 60, "every run at before-complete")
        for pid in reached:
            os.kill(pid, signal.SIGKILL)
        for path in points.glob("before-complete.*.reached"):
            path.unlink()
        block.unlink()
        wait_for(lambda ids=ids: all(cluster.store.get(i).done for i in ids), 90, "the killed runs to finish")
        keys += ids
    settle_and_check(cluster, request.node.callspec.id, "SIGKILL before completion", keys)
    assert_every_key_ran_twice(cluster, keys)


def _reached(points: Path, size: int) -> list[int] | None:
    pids = [int(p.name.split(".")[1]) for p in points.glob("before-complete.*.reached")]
    return pids if len(pids) >= size else None


@pytest.mark.parametrize("cluster", [*every_store(), AND_RABBITMQ], indirect=True)
def test_concurrent_duplicate_deliveries(cluster: Cluster, request: pytest.FixtureRequest) -> None:
    """Every run delivered five times at once, over two workers."""
    cluster.worker("a", concurrency=BATCH)
    cluster.worker("b", concurrency=BATCH)
    keys = [str(uuid.uuid4()) for _ in range(RUNS)]
    for task_id in keys:
        for _ in range(5):
            chaos.apply_async((task_id,), {"pause": 0.3}, task_id=task_id)
    tally = settle_and_check(cluster, request.node.callspec.id, "5 concurrent deliveries", keys)
    assert tally.takeovers == 0


@pytest.mark.parametrize("cluster", every_store(visibility="2"), indirect=True)
def test_the_brokers_own_redelivery(cluster: Cluster, request: pytest.FixtureRequest) -> None:
    """Runs longer than Redis's visibility_timeout: the broker delivers running tasks again."""
    cluster.worker("a", concurrency=BATCH)
    cluster.worker("b", concurrency=BATCH)
    keys: list[str] = []
    for size in batches(RUNS):
        ids = send(cluster.queue, size, pause=4.0)
        wait_for(
            lambda ids=ids: all(cluster.store.get(i) and cluster.store.get(i).done for i in ids),
            90,
            "the runs to finish",
        )
        keys += ids
    settle_and_check(cluster, request.node.callspec.id, "broker redelivery", keys)


@pytest.mark.skipif(not Path("/usr/bin/faketime").exists() and not os.environ.get("CI"), reason="no faketime")
@pytest.mark.parametrize("cluster", every_store(ttl="5"), indirect=True)
def test_one_workers_clock_skewed_by_minutes(cluster: Cluster, request: pytest.FixtureRequest) -> None:
    """A worker whose clock runs five minutes ahead races a normal one: expiry is the store's business.

    The ttl (5 s, far below the 300 s skew) keeps lapses of a CPU-starved renewer out of it: at 2 s, a
    hundred soak processes on two cores made etcd leases lapse, which is the paused case's fault, not this."""
    cluster.worker("skewed", concurrency=BATCH, prefix=("/usr/bin/faketime", "-f", "+300s"))
    cluster.worker("normal", concurrency=BATCH)
    keys = [str(uuid.uuid4()) for _ in range(RUNS)]
    for task_id in keys:
        for _ in range(3):
            chaos.apply_async((task_id,), {"pause": 0.5}, task_id=task_id)
    store = request.node.callspec.id
    tally = settle_and_check(cluster, store, "worker clock +300s", keys)
    if store != "sqlite":  # a server's clock judges expiry: nobody's lease looked expired
        assert tally.takeovers == 0
    # SQLite's clock is each process's own: the skewed worker sees live leases as expired and takes them
    # over; the tokens still fence the holders out (settle_and_check found one effect per key, no violation)


@pytest.mark.parametrize("cluster", every_store(), indirect=True)
def test_indeterminate_store_calls_leave_one_ledger_row_and_one_completion_per_key(
    cluster: Cluster, request: pytest.FixtureRequest
) -> None:
    """Store calls that fail before acting or act and lose their reply, at every point of a run: each key
    ends with one ledger row committed (with the completion, on SQL) and one completion, every caller gets
    SUCCESS with its result, and ``verify`` is clean."""
    calls = ("acquire", "steps", "save_step", "begin_run", "commit", "complete", "release", "get")
    every_run = ("acquire", "save_step")  # every store's run makes these two
    plan = plan_faults(calls, every_run, cluster.workdir / "faults.log")
    cluster.worker("a", concurrency=BATCH, env=plan.env)
    for ids in plan.batches():
        results = [chaos_joined.apply_async((i,), task_id=i) for i in ids]
        assert [r.get(timeout=120)["item"] for r in results] == ids
    tally = settle_and_check(cluster, request.node.callspec.id, "indeterminate outcomes", plan.keys)
    plan.assert_met()
    # Takeovers and refusals may still happen under load: a copy that finds its earlier attempt's lease
    # already lapsed takes it over, and a run whose starved renewer let the lease lapse can be recovered.
    assert tally.lost == 0
