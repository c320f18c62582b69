"""FencedTask on real ``celery worker`` processes: Redis broker (RabbitMQ too, for the duplicates and the
SIGKILL), PostgreSQL store (docs/guarantees.md "How a run ends")."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from .fenced_app import flaky, record, record_keyed, sleeper
from .workers import marks, wait_for
from .world import RABBITMQ, STORES, Cluster, on_every_store, on_rabbitmq

pytestmark = pytest.mark.integration


def _settled(cluster: Cluster, key: str) -> bool:
    return any(event == "complete" for event, _ in cluster.events(key))


def _expired(cluster: Cluster, key: str) -> bool:
    state = cluster.store.get(key)  # etcd forgets an expired lease: no expiry left to show
    return state is None or state.expires_in is None or state.expires_in <= 0


@pytest.mark.parametrize("cluster", on_every_store(), indirect=True)
def test_paused_run_is_refused_after_a_takeover(cluster: Cluster) -> None:
    """SIGSTOP a run past its lease, redeliver its id elsewhere, SIGCONT: only the second run's effect."""
    a = cluster.worker("a", queues=f"{cluster.queue}-a")
    cluster.worker("b", queues=f"{cluster.queue}-b")
    task_id = str(uuid.uuid4())
    record.apply_async(("paused",), {"pause": 3.0}, task_id=task_id, queue=f"{cluster.queue}-a")
    ((pid, _),) = wait_for(lambda: marks(cluster.workdir, task_id, "started"), what="first run started")
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _expired(cluster, task_id), what="the paused lease to expire")
        result = record.apply_async(("paused",), {"pause": 0.0}, task_id=task_id, queue=f"{cluster.queue}-b")
        second = result.get(timeout=30)
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: "refused" in [e for e, _ in cluster.events(task_id)], what="the stale run's refusal")
    first_token = cluster.events(task_id)[0][1]
    assert second["token"] > first_token
    assert cluster.effects(task_id) == [(task_id, second["token"], task_id, second["pid"])]
    assert ("takeover", second["token"]) in cluster.events(task_id)
    assert ("refused", first_token) in cluster.events(task_id)
    assert result.state == "SUCCESS" and result.get(timeout=5) == second
    # the refusal is in the store's history before the stale run logs it: poll the log, do not read it once
    wait_for(lambda: "fence refused" in a.log_text(), what="worker a to log its refused write")


@pytest.mark.parametrize(
    ("cluster", "pool"),
    [
        *[({"store": s}, "prefork") for s in STORES],
        ({}, "threads"),
        ({}, "solo"),
        ({"store": "postgresql", **RABBITMQ}, "prefork"),
    ],
    indirect=["cluster"],
    ids=[
        *[f"{s}-prefork" for s in STORES],
        "postgresql-threads",
        "postgresql-solo",
        "postgresql-prefork-rabbitmq",
    ],
)
def test_concurrent_deliveries_of_one_id_have_one_effect(cluster: Cluster, pool: str) -> None:
    concurrency = 1 if pool == "solo" else 2
    cluster.worker("a", pool=pool, concurrency=concurrency)
    cluster.worker("b", pool=pool, concurrency=concurrency)
    task_id = str(uuid.uuid4())
    results = [record.apply_async(("dup",), {"pause": 0.5}, task_id=task_id) for _ in range(20)]
    wait_for(lambda: _settled(cluster, task_id), what="one completion")
    assert results[0].get(timeout=60)["item"] == "dup"
    effects = cluster.effects(task_id)
    assert len(effects) == 1
    assert [e for e, _ in cluster.events(task_id)].count("complete") == 1


@pytest.mark.parametrize("cluster", on_every_store(), indirect=True)
def test_two_task_ids_with_one_fence_key_have_one_effect(cluster: Cluster) -> None:
    cluster.worker("a", concurrency=2)
    first = record_keyed.apply_async((7,), {"pause": 0.5})
    second = record_keyed.apply_async((7,), {"pause": 0.5})
    assert first.get(timeout=60) == second.get(timeout=60)
    assert len(cluster.effects("item:7")) == 1


@pytest.mark.parametrize("cluster", on_every_store(), indirect=True)
def test_a_killed_run_is_taken_over_within_ttl_and_interval(cluster: Cluster) -> None:
    cluster.worker("a", concurrency=1)
    cluster.worker("b", concurrency=1)
    task_id = str(uuid.uuid4())
    result = record.apply_async(("killed",), {"pause": 60.0}, task_id=task_id)
    ((pid, _),) = wait_for(lambda: marks(cluster.workdir, task_id, "started"), what="run started")
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)  # acks_late + reject_on_worker_lost: the broker delivers it again
    record.apply_async(("killed",), {"pause": 0.0}, task_id=task_id)  # and a producer resends it at once
    wait_for(lambda: _settled(cluster, task_id), 60, "completion")
    # the next run takes the lease over at expiry, or acquires it at once if the worker's main process
    # released the dead pool process's lease first (FencedRequest)
    history = cluster.store.history(task_id)
    first, nxt = history[0], next(e for e in history[1:] if e.event in ("acquire", "takeover"))
    assert nxt.owner != first.owner and nxt.token > first.token
    print(
        f"\n{cluster.store.url.split(':')[0]}: {nxt.event} {nxt.at - killed_at:.2f}s after SIGKILL "
        "(ttl 2.0s, renew interval 0.67s)"
    )
    assert len(cluster.effects(task_id)) == 1
    assert result.get(timeout=30)["item"] == "killed"


@pytest.mark.parametrize("cluster", on_every_store(visibility="2", ttl="2"), indirect=True)
def test_the_brokers_own_redelivery_is_refused(cluster: Cluster) -> None:
    """Redis redelivers a run that outlives visibility_timeout while it still runs: absorbed."""
    cluster.worker("a", concurrency=2)
    cluster.worker("b", concurrency=2)
    task_id = str(uuid.uuid4())
    result = record.apply_async(("slow",), {"pause": 8.0}, task_id=task_id)
    received = f"record[{task_id}] received"
    wait_for(lambda: sum(w.log_text().count(received) for w in cluster.workers) >= 2, 60, "a redelivery")
    assert result.get(timeout=60)["item"] == "slow"
    assert len(marks(cluster.workdir, task_id, "started")) == 1  # the copy never ran the body
    assert len(cluster.effects(task_id)) == 1
    assert [e for e, _ in cluster.events(task_id)].count("complete") == 1


@pytest.mark.parametrize("cluster", on_every_store(ttl="30"), indirect=True)
def test_an_exception_releases_the_lease_for_the_retry(cluster: Cluster) -> None:
    cluster.worker("a")
    result = flaky.apply_async(("retry",))
    assert result.get(timeout=30)["item"] == "retry"
    events = [e.event for e in cluster.store.history(result.id)]
    assert events[:3] == ["acquire", "release", "acquire"]  # no takeover: nobody waited for the ttl
    history = cluster.store.history(result.id)
    print(f"\nretry acquired {history[2].at - history[1].at:.3f}s after the release (ttl 30s)")


@pytest.mark.parametrize("cluster", on_every_store(), indirect=True)
def test_interrupt_stops_a_sleeping_body_once_the_lease_is_lost(cluster: Cluster) -> None:
    cluster.worker("a")
    result = sleeper.apply_async((60.0,))
    wait_for(lambda: marks(cluster.workdir, result.id, "started"), what="run started")
    released_at = time.time()
    cluster.store.force_release(result.id)  # an operator fences the holder out
    ((_, ended_at),) = wait_for(lambda: marks(cluster.workdir, result.id, "ended"), 30, "the body to stop")
    print(f"\nbody interrupted {ended_at - released_at:.2f}s after the admin release (interval 0.67s)")
    wait_for(lambda: "refused" in [e for e, _ in cluster.events(result.id)], what="refusal recorded")
    assert result.state in ("PENDING", "STARTED")  # refused: nothing stored in the result backend


@pytest.mark.parametrize("cluster", [*on_every_store(ttl="30"), on_rabbitmq(ttl="30")], indirect=True)
def test_a_lost_pool_process_releases_its_lease_at_once(cluster: Cluster) -> None:
    """The worker's main process sees the child die and releases its lease: no wait for the 30 s ttl."""
    cluster.worker("a", concurrency=1)
    task_id = str(uuid.uuid4())
    result = record.apply_async(("lost",), {"pause": 60.0}, task_id=task_id)
    ((pid, _),) = wait_for(lambda: marks(cluster.workdir, task_id, "started"), what="run started")
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)  # reject_on_worker_lost: the broker delivers the message again
    wait_for(lambda: _settled(cluster, task_id), 25, "completion before the 30 s ttl could pass")
    history = cluster.store.history(task_id)
    assert [e.event for e in history][:3] == ["acquire", "release", "acquire"]  # released, not taken over
    store = cluster.store.url.split(":")[0]
    print(f"\n{store}: re-acquired {history[2].at - killed_at:.2f}s after SIGKILL (ttl 30s)")
    assert result.get(timeout=30)["item"] == "lost"
