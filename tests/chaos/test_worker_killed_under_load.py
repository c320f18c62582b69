"""A whole worker SIGKILLed under load: the messages the broker loses before any run
took their key.

Three workers share the load: ``FENCE_SOAK_RUNS`` x 5 keys, each sent three times as three task ids of
``record_keyed`` (one fence key per item, as producers that send a key again do). Worker ``a``, main process
and pool, is SIGKILLed while it runs some of them. Recovery re-sends the runs that had acquired their key;
nothing can see a message the dead worker had taken from the broker and not yet run. On Redis such a
message waits in kombu's ``unacked`` hash until ``visibility_timeout`` (an hour here), or is gone for good
if the worker died between taking it off the list and recording it there. On RabbitMQ the dead
connection's unacknowledged messages go back to the queue at once.

The case **reports** those task ids (columns ``no result``, ``never ran``, ``in unacked``, ``vanished`` of the
chaos report, and ``lost``: keys with no effect) and never fails on them; it asserts the fence's invariants:
no key with two effects or two completions, every finished key with its one effect, ``verify`` clean.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.result import AsyncResult
from celery.states import READY_STATES

from celery_fence.verify import verify_store
from tests.integration.fenced_app import record_keyed
from tests.integration.rabbitmq import ready_messages
from tests.integration.workers import Worker, wait_for
from tests.integration.world import Cluster

from .checks import REPORT, RUNS, Tally, done
from .sending import AND_RABBITMQ, BATCH, every_store

pytestmark = pytest.mark.chaos
COPIES = 3  # task ids per key
PAUSE = 0.2  # each task id's first run sleeps this long in its body


@dataclass
class LoadTally(Tally):
    no_result: int  # task ids that never got a result
    never_ran: int  # ... of which no run ever started the body: recovery cannot know them
    in_unacked: int  # ... of which kombu's unacked hash still holds the message (Redis: back after an hour)
    vanished: int  # ... of which the message is nowhere: not queued, not in the unacked hash


@pytest.mark.parametrize("cluster", [*every_store("postgresql"), AND_RABBITMQ], indirect=True)
def test_a_whole_worker_killed_under_load(cluster: Cluster, request: pytest.FixtureRequest) -> None:
    interval = ("--fence-recover-interval", "0.5")
    a, b, c = (cluster.worker(name, concurrency=BATCH, extra=interval) for name in "abc")
    items = [f"{uuid.uuid4().hex[:8]}-{n}" for n in range(RUNS * 5)]
    keys = [f"item:{item}" for item in items]
    sent = [record_keyed.apply_async((item,), {"pause": PAUSE}).id for _ in range(COPIES) for item in items]
    wait_for(_mid_load(cluster, a), 120, "worker a in a run's body, a key done", 0.05)
    os.killpg(os.getpgid(a.pid), signal.SIGKILL)  # main process and pool: nobody acks, releases or restores
    a.proc.wait(10)
    try:
        wait_for(_settled(cluster, [b, c], keys), 120 + 2 * len(sent) // BATCH, "the load to settle", 0.5)
        tally = _count(cluster, request.node.callspec.id, keys, sent)
    finally:
        if (
            not cluster.on_rabbitmq
        ):  # the dead worker's entries would be restored into a dead queue in an hour
            _forget_unacked(cluster, set(sent))
    effects = {key: len(cluster.effects(key)) for key in keys}
    completions = Counter(e.key for e in cluster.store.history() if e.event == "complete")
    assert verify_store(cluster.store) == []
    assert max(effects.values()) <= 1, "a key with two effects"
    assert all(completions[key] <= 1 for key in keys), "a key completed twice"
    assert all(effects[key] == 1 for key in keys if done(cluster, key)), "a finished key without its effect"
    assert tally.runs == len(sent) and tally.lost <= len(keys)


def _mid_load(cluster: Cluster, a: Worker) -> Callable[[], bool]:
    """A condition: the load is under way (a run wrote its effect) and one of a's pool processes is in a
    body. The whole load takes about a second on an idle machine: a condition with a narrower window (it
    was a third of the keys done) was missed between two polls on a loaded one, and never came again."""
    pool = set(a.children())

    def now() -> bool:
        wrote = {path.name.split(".")[0] for path in cluster.workdir.glob("*.wrote")}
        if not wrote:
            return False
        started = {p.name.split(".")[0]: int(p.name.split(".")[1]) for p in cluster.workdir.glob("*.started")}
        return any(pid in pool and task_id not in wrote for task_id, pid in started.items())

    return now


def _settled(cluster: Cluster, live: list[Worker], keys: list[str]) -> Callable[[], bool]:
    """A condition, true on two polls in a row: every key someone leased is done, the live workers hold
    nothing (active, reserved, or waiting for a countdown) and the queue is empty."""
    streak = 0

    def now() -> bool:
        nonlocal streak
        quiet = all(_finished_or_never_leased(cluster, k) for k in keys) and _idle(cluster, live)
        streak = streak + 1 if quiet and _queued(cluster) == 0 else 0
        return streak >= 2

    return now


def _finished_or_never_leased(cluster: Cluster, key: str) -> bool:
    state = cluster.store.get(key)
    return state is None or state.done


def _idle(cluster: Cluster, workers: list[Worker]) -> bool:
    connection = cluster.app.connection_for_write()  # its own: see Worker.pid_of
    try:
        names = [w.nodename for w in workers]
        inspect = cluster.app.control.inspect(names, timeout=1.0, limit=len(names), connection=connection)
        for ask in (inspect.active, inspect.reserved, inspect.scheduled):
            replies = ask() or {}
            if len(replies) < len(names) or any(replies.values()):
                return False
        return True
    finally:
        connection.close()


def _queued(cluster: Cluster) -> int:
    if cluster.on_rabbitmq:
        return ready_messages(cluster.app, cluster.queue)
    with _broker(cluster) as client:  # kombu keeps one list per priority step, named after the queue
        return sum(int(client.llen(name)) for name in client.scan_iter(match=f"{cluster.queue}*"))


@contextlib.contextmanager
def _broker(cluster: Cluster) -> Any:
    client = redis.Redis.from_url(cluster.env["FENCE_IT_BROKER"], decode_responses=True)
    try:
        yield client
    finally:
        client.close()


def _unacked(cluster: Cluster, ids: set[str]) -> dict[str, str]:
    """kombu's unacked hash (Redis broker): delivery tag of each of ``ids`` it holds."""
    if cluster.on_rabbitmq:
        return {}
    with _broker(cluster) as client:
        held = {}
        for tag, entry in client.hgetall("unacked").items():
            task_id = json.loads(entry)[0]["headers"].get("id")
            if task_id in ids:
                held[task_id] = tag
        return held


def _forget_unacked(cluster: Cluster, ids: set[str]) -> None:
    tags = list(_unacked(cluster, ids).values())
    if tags:
        with _broker(cluster) as client:
            client.hdel("unacked", *tags)
            client.zrem("unacked_index", *tags)


def _count(cluster: Cluster, store: str, keys: list[str], sent: list[str]) -> LoadTally:
    ids = set(sent)
    missing = [i for i in sent if AsyncResult(i, app=cluster.app).state not in READY_STATES]
    started = {p.name.split(".")[0] for p in cluster.workdir.glob("*.started")}
    unacked = _unacked(cluster, ids)
    history = cluster.store.history()
    events = Counter((e.key, e.event) for e in history)
    tally = LoadTally(
        store,
        "whole worker SIGKILLed under load",
        len(sent),
        takeovers=sum(n for (k, event), n in events.items() if event == "takeover" and k in keys),
        refused=sum(n for (k, event), n in events.items() if event == "refused" and k in keys),
        duplicates_absorbed=sum(w.log_text().count("absorbed:") for w in cluster.workers),
        lost=sum(1 for key in keys if not done(cluster, key)),
        violations=len(verify_store(cluster.store)),
        no_result=len(missing),
        never_ran=sum(1 for i in missing if i not in started),
        in_unacked=sum(1 for i in missing if i in unacked),
        vanished=sum(1 for i in missing if i not in unacked),  # and the settled queue is empty
    )
    if REPORT:
        with Path(REPORT).open("a") as out:
            out.write(json.dumps(asdict(tally)) + "\n")
    print(f"\n{tally}\nno result: {missing}")
    return tally
