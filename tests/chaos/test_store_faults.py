"""Faults between the workers and the store: connections killed during renew and during completion, the
path slowed down and cut (a TCP proxy), the store restarted mid-run."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import text

from celery_fence.testing import StoreProxy
from tests.contract.restartable import RESTARTABLE
from tests.integration.conftest import Cluster
from tests.integration.workers import wait_for

from .checks import RUNS, done, settle_and_check
from .test_faults import BATCH, _batches, _send, every_store

pytestmark = pytest.mark.chaos


def _kill_pg_connections(cluster: Cluster) -> None:
    with cluster.user_db.connect() as conn:  # the store's own sessions, in the workers and here
        conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = "
                "'celery-fence' AND datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
        conn.commit()


def _kill_redis_connections(cluster: Cluster) -> None:
    import redis

    client = redis.Redis.from_url(cluster.store.url.split("?")[0])
    client.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    client.close()


@contextlib.contextmanager
def _every(seconds: float, action: Callable[[], None]) -> Iterator[None]:
    """Run ``action`` every ``seconds`` in a thread until the block ends (its failures are the point)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(seconds):
            with contextlib.suppress(Exception):
                action()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


@pytest.mark.parametrize("cluster", every_store("postgresql", "redis"), indirect=True)
def test_connections_killed_during_renew_and_completion(
    cluster: Cluster, request: pytest.FixtureRequest
) -> None:
    store = request.node.callspec.id
    kill = {"postgresql": _kill_pg_connections, "redis": _kill_redis_connections}[store]
    points = cluster.workdir / "failpoints"
    points.mkdir()
    cluster.worker(
        "a",
        concurrency=BATCH,
        env={"CELERY_FENCE_FAILPOINTS": str(points)},
        extra=("--fence-recover", "--fence-recover-interval", "1"),
    )
    keys: list[str] = []
    for size in _batches(RUNS):
        block = points / "before-complete.block"
        block.touch()
        with _every(0.4, lambda: kill(cluster)):  # while the bodies run, their renews lose connections
            ids = _send(cluster.queue, size, pause=2.5)
            wait_for(
                lambda size=size: len(list(points.glob("before-complete.*.reached"))) >= size,
                90,
                "every run at its completion",
            )
        kill(cluster)  # and the completions start on dead connections
        for path in points.glob("before-complete.*.reached"):
            path.unlink()
        block.unlink()
        wait_for(lambda ids=ids: all(done(cluster, i) for i in ids), 90, "the runs to finish")
        keys += ids
    settle_and_check(cluster, store, "store connections killed", keys)


@pytest.mark.parametrize("cluster", every_store("postgresql", "redis", "etcd"), indirect=True)
def test_latency_and_a_cut_on_the_path_to_the_store(cluster: Cluster, request: pytest.FixtureRequest) -> None:
    store = request.node.callspec.id
    with StoreProxy.for_url(cluster.store.url) as proxy:
        env = {"FENCE_IT_STORE": proxy.url_for(cluster.store.url)}
        cluster.worker(
            "a", concurrency=BATCH, env=env, extra=("--fence-recover", "--fence-recover-interval", "1")
        )
        keys: list[str] = []
        for number, size in enumerate(_batches(RUNS)):
            if number % 2 == 0:  # latency: every chunk held 50 ms, both ways
                proxy.delay(0.05)
                ids = _send(cluster.queue, size, pause=0.5)
            else:  # a cut longer than the ttl while the bodies run, then the path comes back
                proxy.delay(0.0)
                ids = _send(cluster.queue, size, pause=1.0)
                wait_for(lambda ids=ids: _all_started(cluster, ids), 60, "the runs to start")
                proxy.cut()
                time.sleep(3.0)  # the fault itself lasts this long (ttl 2 s): not a wait for a condition
                proxy.restore()
            wait_for(lambda ids=ids: all(done(cluster, i) for i in ids), 120, "the runs to finish")
            keys += ids
        settle_and_check(cluster, store, "latency 50 ms / cut 3 s", keys)


def _all_started(cluster: Cluster, ids: list[str]) -> bool:
    return all(any(cluster.workdir.glob(f"{i}.*.started")) for i in ids)


@pytest.mark.parametrize("cluster", every_store(*RESTARTABLE, restartable="1"), indirect=True)
def test_the_store_restarted_mid_run(cluster: Cluster, request: pytest.FixtureRequest) -> None:
    """The store's server crashes (PostgreSQL immediate shutdown, Redis and etcd SIGKILL) and comes back on
    its port while runs hold leases and renew, down for 1 s (renews ride it out) or 3 s (past the 2 s ttl:
    leases lapse and the runs are refused or re-queued): tokens never go back, and every run finishes."""
    worker = cluster.worker(
        "a", concurrency=BATCH, extra=("--fence-recover", "--fence-recover-interval", "1")
    )
    keys: list[str] = []
    for number, size in enumerate(_batches(RUNS)):
        ids = _send(cluster.queue, size, pause=2.0)
        wait_for(lambda ids=ids: _all_started(cluster, ids), 60, "the runs to start")
        cluster.server.crash()
        time.sleep(3.0 if number % 2 else 1.0)  # the outage itself: not a wait for a condition
        cluster.server.start()
        wait_for(lambda ids=ids: all(done(cluster, i) for i in ids), 120, "the runs to finish")
        keys += ids
    settle_and_check(cluster, request.node.callspec.id, "store restarted mid-run", keys)
    assert "failed, retrying" in worker.log_text(), "no renew saw the store go away: the fault did not bite"
