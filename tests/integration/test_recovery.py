"""Recovery on real workers: the whole worker is SIGKILLed mid-run (the Redis broker keeps the unacked
message for an hour), and another worker's recovery bootstep sends the run's message again. On RabbitMQ the
dead worker's connection closes and the broker puts the message back at once: the next worker gets it."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest
from celery import chain
from celery.result import AsyncResult
from kombu import Exchange, Queue

from .fenced_app import record
from .rabbitmq import ready_messages
from .workers import marks, wait_for
from .world import Cluster, on_rabbitmq

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("cluster", [pytest.param({}, id="redis"), on_rabbitmq()], indirect=True)
def test_a_chain_whose_worker_was_killed_mid_run_goes_on_once_recovered(cluster: Cluster) -> None:
    """chain(work, after) on a queue whose routing key differs from its name: recovery
    re-sends the same message (its chain included) to that exchange and queue, so ``after`` runs once.
    On RabbitMQ the broker itself returns the message when the worker's connection dies (before the next
    worker starts); whichever copy comes first takes the key over, and ``after`` still runs once."""
    name, exchange, key = f"{cluster.queue}-routed", f"{cluster.queue}-ex", f"rk-{uuid.uuid4().hex[:8]}"
    routed = Queue(name, Exchange(exchange, type="direct"), routing_key=key)
    env = {"FENCE_IT_ROUTE": f"{name},{exchange},{key}"}
    queues = f"{name},{cluster.queue}"
    a = cluster.worker("a", queues=queues, env=env)
    work = record.s("work", pause=60.0).set(queue=routed)
    after = record.si("after").set(queue=cluster.queue)  # sent by a worker: its default queue is not ours
    result = chain(work, after).apply_async()
    work_id, after_id = result.parent.id, result.id
    wait_for(lambda: marks(cluster.workdir, work_id, "started"), what="work started")
    os.killpg(os.getpgid(a.proc.pid), signal.SIGKILL)  # the whole worker: nobody releases or acks
    a.proc.wait(10)
    if cluster.on_rabbitmq:
        wait_for(lambda: ready_messages(cluster.app, name) == 1, 30, "RabbitMQ to return the unacked message")
    extra = ("--fence-recover", "--fence-recover-interval", "0.5")
    cluster.worker("b", queues=queues, env=env, extra=extra)
    assert result.get(timeout=90)["item"] == "after"
    assert len(marks(cluster.workdir, work_id, "wrote")) == 1  # the recovered copy, on worker b
    assert len(cluster.effects(work_id)) == 1
    assert len(marks(cluster.workdir, after_id, "started")) == 1
    assert len(cluster.effects(after_id)) == 1
    if not cluster.on_rabbitmq:  # on Redis the message waits an hour in kombu's unacked hash
        assert "recovered" in [event for event, _ in cluster.events(work_id)]


def test_recovery_is_on_by_default_and_one_worker_at_a_time_runs_it(cluster: Cluster) -> None:
    """A whole worker SIGKILLed mid-run is recovered without anyone passing
    --fence-recover or running `celery fence recover`; of the workers left, exactly one is elected."""
    interval = ("--fence-recover-interval", "0.5")
    result = _abandoned_by_a_killed_worker(cluster, "abandoned", interval)
    b, c = cluster.worker("b", extra=interval), cluster.worker("c", extra=interval)
    assert result.get(timeout=90)["item"] == "abandoned"
    assert "recovered" in [event for event, _ in cluster.events(result.id)]
    assert len(cluster.effects(result.id)) == 1
    elected = [w.name for w in (b, c) if "elected the recoverer" in w.log_text()]
    assert len(elected) == 1, elected
    holder = cluster.store.get("celery-fence:recoverer")
    assert holder is not None and holder.expires_in is not None and holder.expires_in > 0


def test_a_worker_started_with_no_fence_recover_never_recovers(cluster: Cluster) -> None:
    """Claim C57, the opt-out: a worker started with ``--no-fence-recover`` leaves a run abandoned by a
    SIGKILLed worker alone for many recovery intervals; a worker started without it then recovers the run."""
    interval = ("--fence-recover-interval", "0.5")
    result = _abandoned_by_a_killed_worker(cluster, "opted-out", interval)
    b = cluster.worker("b", extra=(*interval, "--no-fence-recover"))
    grace = 2.0  # the cluster's ttl: what the recovery step waits after expiry
    wait_for(lambda: _abandoned(cluster, result.id, grace), what="the run to be recoverable")
    # An absence, so a window: six recovery intervals in which worker b could have re-sent the run.
    watch_until = time.monotonic() + 3.0
    while time.monotonic() < watch_until:
        assert "recovered" not in [event for event, _ in cluster.events(result.id)], "b recovered"
        assert result.state == "PENDING"
        time.sleep(0.25)
    assert "elected the recoverer" not in b.log_text()
    cluster.worker("c", extra=interval)
    assert result.get(timeout=90)["item"] == "opted-out"
    assert "recovered" in [event for event, _ in cluster.events(result.id)]
    assert len(cluster.effects(result.id)) == 1


def _abandoned(cluster: Cluster, key: str, grace: float) -> bool:
    return key in {seen.key for seen in cluster.store.abandoned(grace)}


def _abandoned_by_a_killed_worker(cluster: Cluster, item: str, extra: tuple[str, ...]) -> AsyncResult:
    """A run of ``record`` whose whole worker was SIGKILLed mid-run: nobody released its lease or acked it."""
    a = cluster.worker("a", extra=extra)
    result = record.apply_async((item,), {"pause": 60.0})
    wait_for(lambda: marks(cluster.workdir, result.id, "started"), what="the run started")
    os.killpg(os.getpgid(a.proc.pid), signal.SIGKILL)
    a.proc.wait(10)
    return result
