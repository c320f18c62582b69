"""Faults between the workers and the store: connections killed during renew and during completion, the
path slowed down and cut (a TCP proxy), the store restarted mid-run."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
from celery import chain
from sqlalchemy import text

from celery_fence.testing import StoreProxy
from tests.integration.fenced_app import chaos
from tests.integration.workers import wait_for
from tests.integration.world import Cluster
from tests.servers.restartable import RESTARTABLE
from tests.servers.sqlite_holder import holding_write_lock

from .checks import RUNS, done, settle_and_check
from .sending import AND_RABBITMQ, BATCH, all_started, assert_every_key_ran_twice, batches, every_store, send

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
    db = client.connection_pool.connection_kwargs.get("db", 0)
    own = client.client_id()
    for other in client.client_list():  # the store's database only: a broker's or another test's stay
        if int(other["db"]) == db and int(other["id"]) != own:
            with contextlib.suppress(redis.ResponseError):  # gone meanwhile
                client.client_kill_filter(_id=other["id"])
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
    for size in batches(RUNS):
        block = points / "before-complete.block"
        block.touch()
        with _every(0.4, lambda: kill(cluster)):  # while the bodies run, their renews lose connections
            ids = send(cluster.queue, size, pause=2.5)
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
        for number, size in enumerate(batches(RUNS)):
            if number % 2 == 0:  # latency: every chunk held 50 ms, both ways
                proxy.delay(0.05)
                ids = send(cluster.queue, size, pause=0.5)
            else:  # a cut longer than the ttl while the bodies run, then the path comes back
                proxy.delay(0.0)
                ids = send(cluster.queue, size, pause=1.0)
                wait_for(lambda ids=ids: all_started(cluster, ids), 60, "the runs to start")
                proxy.cut()
                time.sleep(3.0)  # the fault itself lasts this long (ttl 2 s): not a wait for a condition
                proxy.restore()
            wait_for(lambda ids=ids: all(done(cluster, i) for i in ids), 120, "the runs to finish")
            keys += ids
        settle_and_check(cluster, store, "latency 50 ms / cut 3 s", keys)


@pytest.mark.parametrize("cluster", every_store(*RESTARTABLE, restartable="1"), indirect=True)
def test_the_store_restarted_mid_run(cluster: Cluster, request: pytest.FixtureRequest) -> None:
    """The store's server crashes (PostgreSQL immediate shutdown, Redis and etcd SIGKILL) and comes back on
    its port while runs hold leases and renew, down for 1 s (renews ride it out) or 3 s (past the 2 s ttl:
    leases lapse and the runs are refused or re-queued): tokens never go back, and every run finishes."""
    worker = cluster.worker(
        "a", concurrency=BATCH, extra=("--fence-recover", "--fence-recover-interval", "1")
    )
    keys: list[str] = []
    for number, size in enumerate(batches(RUNS)):
        ids = send(cluster.queue, size, pause=2.0)
        wait_for(lambda ids=ids: all_started(cluster, ids), 60, "the runs to start")
        cluster.server.crash()
        time.sleep(3.0 if number % 2 else 1.0)  # the outage itself: not a wait for a condition
        cluster.server.start()
        wait_for(lambda ids=ids: all(done(cluster, i) for i in ids), 120, "the runs to finish")
        keys += ids
    settle_and_check(cluster, request.node.callspec.id, "store restarted mid-run", keys)
    assert "failed, retrying" in worker.log_text(), "no renew saw the store go away: the fault did not bite"


@pytest.mark.parametrize(
    "cluster", [*every_store(*RESTARTABLE, restartable="1"), *every_store("sqlite")], indirect=True
)
def test_the_store_down_at_acquire(cluster: Cluster, request: pytest.FixtureRequest) -> None:
    """Runs delivered while the store is down (its server crashed; on SQLite, another process holds the
    write lock) never start their body and never fail: each waits the store out (sent again with a
    backoff, its max_retries unspent) and runs once the store is back."""
    store = request.node.callspec.id
    worker = cluster.worker("a", concurrency=BATCH)
    keys: list[str] = []
    for size in batches(RUNS):
        ids = _ids(size)
        with _store_down(cluster, store):
            results = [chaos.apply_async((i,), task_id=i) for i in ids]
            wait_for(lambda: "waiting it out" in worker.log_text(), 60, "a run to wait the store out")
            time.sleep(2.0)  # the outage itself goes on a little: not a wait for a condition
        assert all(r.get(timeout=120)["item"] == i for r, i in zip(results, ids, strict=True))
        keys += ids
    settle_and_check(cluster, store, "store down at acquire", keys)


@contextlib.contextmanager
def _store_down(cluster: Cluster, store: str) -> Iterator[None]:
    if store == "sqlite":
        with holding_write_lock(cluster.store.url.split(":///", 1)[1]) as holder:
            yield
            holder.commit()
        return
    cluster.server.crash()
    try:
        yield
    finally:
        cluster.server.start()


def _ids(size: int) -> list[str]:
    return [str(uuid.uuid4()) for _ in range(size)]


@pytest.mark.parametrize("cluster", [*every_store(), AND_RABBITMQ], indirect=True)
def test_a_whole_worker_killed_mid_chain_is_recovered(
    cluster: Cluster, request: pytest.FixtureRequest
) -> None:
    """chain(first, second) of fenced runs; the whole worker is SIGKILLed while the first runs (the Redis
    broker keeps the unacked message for an hour): the recovery that every worker runs by default re-sends
    the first run's message as it was, chain included, and the second runs once. On RabbitMQ the broker
    returns the messages as the dead worker's connection closes, and the new worker takes the keys over."""
    interval = ("--fence-recover-interval", "0.5")
    keys: list[str] = []
    firsts: list[str] = []
    for number, size in enumerate(batches(RUNS)):
        doomed = cluster.worker(f"doomed-{number}", concurrency=BATCH, extra=interval)
        ids = _ids(size)
        chains = [
            chain(  # the second is sent by a worker, whose default queue is not this test's
                chaos.si(i, pause=60.0).set(task_id=i),
                chaos.si(f"{i}-next").set(task_id=f"{i}-next", queue=cluster.queue),
            )
            for i in ids
        ]
        results = [c.apply_async() for c in chains]
        wait_for(lambda ids=ids: all_started(cluster, ids), 60, "the first runs to start")
        os.killpg(os.getpgid(doomed.proc.pid), signal.SIGKILL)  # the whole worker: nobody releases or acks
        doomed.proc.wait(10)
        rescuer = cluster.worker(f"rescuer-{number}", concurrency=BATCH, extra=interval)
        assert all(r.get(timeout=120)["item"] == f"{i}-next" for r, i in zip(results, ids, strict=True))
        rescuer.stop()
        keys += ids + [f"{i}-next" for i in ids]
        firsts += ids
    settle_and_check(cluster, request.node.callspec.id, "whole worker killed mid-chain", keys)
    assert_every_key_ran_twice(cluster, firsts)  # the killed run, and the one that took its key over
    if not cluster.on_rabbitmq:  # only recovery could bring the messages back within the hour
        recovered = {e.key for e in cluster.store.history() if e.event == "recovered"}
        assert set(firsts) <= recovered, "a first run finished without recovery: the fault did not bite"
