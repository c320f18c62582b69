"""Canvas on real workers: chains, groups and chords of fenced tasks advance exactly once
under duplicates, the broker's own redelivery, a takeover and a refusal. Redis broker, Redis result backend,
PostgreSQL lease store.

The next step of a chain and the body of a chord are ``after``, a plain task without a fence that records
every run it gets, on a queue of its own served by one worker process: a second dispatch would show as a
second run. Before counting, the test sends a barrier (another ``after``) to that queue and waits for it:
the queue is first in, first out, so anything dispatched earlier has run by then.
"""

from __future__ import annotations

import os
import signal
import uuid
from typing import Any

import pytest
from celery import chain, chord, group

from celery_fence import LeaseHeld

from .fenced_app import after, record, record_keyed, record_keyed_or_fail, runs_of
from .workers import marks, wait_for
from .world import Cluster

pytestmark = pytest.mark.integration

RECORD = "fenced_app.record"


def _next_queue(cluster: Cluster) -> str:
    """The queue of ``after``, served by one worker process (first in, first out)."""
    queue = f"{cluster.queue}-next"
    cluster.worker("next", queues=queue, concurrency=1)
    return queue


def _barrier(cluster: Cluster, queue: str) -> None:
    label = f"barrier-{uuid.uuid4().hex[:8]}"
    after.apply_async((None, label), queue=queue)
    wait_for(lambda: runs_of(label, cluster.workdir), 30, "the barrier on the next queue")


def _log(cluster: Cluster) -> str:
    return "".join(worker.log_text() for worker in cluster.workers)


def _ended(cluster: Cluster, task_id: str) -> int:
    """How many deliveries of ``task_id`` ended."""
    log = _log(cluster)
    return sum(log.count(f"{RECORD}[{task_id}] {how}") for how in ("succeeded", "ignored"))


def _settled(cluster: Cluster, task_id: str) -> int:
    """How many deliveries of ``task_id`` ended, once every delivery received so far has ended (else 0)."""
    received = _log(cluster).count(f"{RECORD}[{task_id}] received")
    ended = _ended(cluster, task_id)
    return ended if received and ended == received else 0


def _values(cluster: Cluster, label: str) -> list[Any]:
    return [run["value"] for run in runs_of(label, cluster.workdir)]


def _label() -> str:
    return uuid.uuid4().hex[:12]


def test_a_chain_step_delivered_again_after_it_finished_advances_the_chain_once(cluster: Cluster) -> None:
    """The same frozen chain sent twice: the copy of the finished first step finds the key done and
    SUCCESS already stored for its task id, so it ends with Ignore and dispatches nothing."""
    cluster.worker("a")
    queue, label = _next_queue(cluster), _label()
    canvas = chain(record.s("first"), after.s(label).set(queue=queue))
    canvas.freeze()
    result = canvas.apply_async()
    first_id = result.parent.id
    assert result.get(timeout=30)["item"] == "first"
    again = canvas.apply_async()  # the same message again: same task ids, same chain
    assert (again.id, again.parent.id) == (result.id, first_id)
    assert wait_for(lambda: _settled(cluster, first_id) >= 2, 30, "the copy to end")
    _barrier(cluster, queue)
    assert [value["item"] for value in _values(cluster, label)] == ["first"]
    assert f"duplicate delivery of {first_id} absorbed: done" in _log(cluster)
    assert len(cluster.effects(first_id)) == 1
    assert [event for event, _ in cluster.events(first_id)].count("complete") == 1


def test_a_step_that_committed_but_died_before_dispatching_advances_the_chain_once(
    cluster: Cluster,
) -> None:
    """The first step's completion commits, then its process dies as it publishes the next step (before
    SUCCESS is stored). The redelivered copy finds the key done but no SUCCESS for its task id: it
    returns the stored result without running the body, and Celery dispatches the next step, once."""
    cluster.worker("a")
    queue, label = _next_queue(cluster), _label()
    canvas = chain(record.s("dies"), after.s(label).set(queue=queue))
    result = canvas.freeze()
    first_id = result.parent.id
    (cluster.workdir / f"die-before-publishing.{first_id}").write_text("")  # read by fenced_app
    canvas.apply_async()
    assert result.get(timeout=60)["item"] == "dies"
    assert not (cluster.workdir / f"die-before-publishing.{first_id}").exists()  # it did die there
    _barrier(cluster, queue)
    assert [value["item"] for value in _values(cluster, label)] == ["dies"]
    assert len(marks(cluster.workdir, first_id, "wrote")) == 1  # the copy did not run the body
    assert len(cluster.effects(first_id)) == 1
    assert f"duplicate delivery of {first_id} absorbed: done" in _log(cluster)


def test_a_fenced_next_step_dispatched_twice_runs_once(cluster: Cluster) -> None:
    """chain(a, b, after) with a and b fenced: a's process dies just after publishing b (SUCCESS of a not
    stored), so a's redelivered copy returns the stored result and Celery publishes b a second time, with
    b's same frozen id. That copy of b finds b's key done and SUCCESS stored: absorbed. ``after`` runs once.
    This is why the window between sending the callbacks and storing SUCCESS is closed for fenced steps."""
    cluster.worker("a")
    queue, label = _next_queue(cluster), _label()
    canvas = chain(record.s("a"), record.s().set(queue=cluster.queue), after.s(label).set(queue=queue))
    result = canvas.freeze()
    b_id = result.parent.id
    a_id = result.parent.parent.id
    (cluster.workdir / f"die-after-publishing.{a_id}").write_text("")  # read by fenced_app
    canvas.apply_async()
    assert result.get(timeout=60)["item"]["item"] == "a"
    assert not (cluster.workdir / f"die-after-publishing.{a_id}").exists()  # it did die there
    assert wait_for(lambda: _settled(cluster, b_id) >= 2, 30, "b's second message to end")
    _barrier(cluster, queue)
    assert [value["item"]["item"] for value in _values(cluster, label)] == ["a"]
    for step in (a_id, b_id):
        assert len(marks(cluster.workdir, step, "wrote")) == 1
        assert len(cluster.effects(step)) == 1
    assert f"duplicate delivery of {b_id} absorbed: done" in _log(cluster)


def test_a_copy_that_finds_a_step_finished_but_not_yet_dispatched_lets_it_advance_the_chain_once(
    cluster: Cluster,
) -> None:
    """The first step's completion commits; before its process sends the next step (SUCCESS not stored yet),
    a copy of its message finds the key finished but not delivered. The copy looks again a ttl later instead
    of delivering in its place (CI caught it sending the next step a second time in this window), then finds
    SUCCESS and is absorbed: the chain advances once."""
    cluster.worker("a", concurrency=2)
    queue, label = _next_queue(cluster), _label()
    canvas = chain(record.s("held back"), after.s(label).set(queue=queue))
    result = canvas.freeze()
    first_id = result.parent.id
    pause = cluster.workdir / f"pause-before-publishing.{first_id}"
    pause.write_text("")  # read by fenced_app
    canvas.apply_async()
    paused = cluster.workdir / f"paused-before-publishing.{first_id}"
    wait_for(paused.exists, 30, "the first step to commit and pause before it dispatches")
    canvas.apply_async()  # the same message again: same task ids, same chain
    wait_for(lambda: _ended(cluster, first_id), 30, "the copy to end while the first step is paused")
    pause.unlink()
    assert result.get(timeout=30)["item"] == "held back"
    assert wait_for(lambda: _settled(cluster, first_id) >= 2, 30, "every copy to end")
    _barrier(cluster, queue)
    assert [value["item"] for value in _values(cluster, label)] == ["held back"]
    assert len(marks(cluster.workdir, first_id, "started")) == 1
    assert len(cluster.effects(first_id)) == 1
    assert f"{first_id}] finds {first_id} finished, not delivered yet" in _log(cluster)
    assert f"duplicate delivery of {first_id} absorbed: done" in _log(cluster)


@pytest.mark.parametrize("cluster", [{"visibility": "2", "ttl": "2"}], indirect=True)
def test_the_brokers_redelivery_of_a_running_chain_step_advances_the_chain_once(cluster: Cluster) -> None:
    """Redis redelivers the first step while it runs (visibility_timeout 2 s): the copy finds the key held
    by its own task id, goes back to the queue, and is absorbed once the first run has delivered."""
    cluster.worker("a", concurrency=2)
    cluster.worker("b", concurrency=2)
    queue, label = _next_queue(cluster), _label()
    result = chain(record.s("slow", pause=6.0), after.s(label).set(queue=queue)).apply_async()
    first_id = result.parent.id
    received = f"{RECORD}[{first_id}] received"
    wait_for(lambda: _log(cluster).count(received) >= 2, 60, "a redelivery")
    assert result.get(timeout=60)["item"] == "slow"
    assert wait_for(lambda: _settled(cluster, first_id) >= 2, 60, "every copy to end")
    _barrier(cluster, queue)
    assert [value["item"] for value in _values(cluster, label)] == ["slow"]
    assert len(marks(cluster.workdir, first_id, "started")) == 1  # no copy ran the body
    assert len(cluster.effects(first_id)) == 1


@pytest.mark.parametrize("cluster", [{"visibility": "2", "ttl": "2"}], indirect=True)
def test_a_chord_whose_parts_are_redelivered_and_duplicated_runs_its_body_once(cluster: Cluster) -> None:
    """A chord of three fenced parts: the slow one is redelivered by the broker while it runs, and a
    finished one is sent again (same message, same group) before the chord completes. The body runs once
    and sees each part's result once."""
    cluster.worker("a", concurrency=2)
    cluster.worker("b", concurrency=2)
    queue, label = _next_queue(cluster), _label()
    canvas = chord(
        [record.s("p0", pause=6.0), record.s("p1"), record.s("p2")], after.s(label).set(queue=queue)
    )
    result = canvas.freeze()
    group_id, parts = result.parent.id, [part.id for part in result.parent.results]
    canvas.apply_async()
    wait_for(lambda: _log(cluster).count(f"{RECORD}[{parts[0]}] received") >= 2, 60, "p0 redelivered")
    wait_for(lambda: _settled(cluster, parts[1]), 30, "p1 to finish")
    canvas.tasks.tasks[1].clone().apply_async(group_id=group_id)  # p1's message again, while p0 runs
    wait_for(lambda: _settled(cluster, parts[1]) >= 2, 30, "p1's copy to end")
    body = result.get(timeout=60)
    assert [value["item"] for value in body] == ["p0", "p1", "p2"]  # the header's order, p0 finished last
    for part in parts:
        assert wait_for(lambda: _settled(cluster, part), 60, "every copy to end")  # noqa: B023
    _barrier(cluster, queue)
    (run,) = runs_of(label, cluster.workdir)  # the body, once
    assert run["value"] == body
    assert run["id"] == result.id
    for part in parts:
        assert len(marks(cluster.workdir, part, "started")) == 1
        assert len(cluster.effects(part)) == 1
    assert f"duplicate delivery of {parts[1]} absorbed: done" in _log(cluster)


@pytest.mark.parametrize("kind", ["group", "chord"])
def test_a_group_whose_part_is_taken_over_has_each_result_once(cluster: Cluster, kind: str) -> None:
    """A group of three fenced parts; the first run of one is paused (SIGSTOP) past its lease, its message
    is delivered again elsewhere and takes the key over, then the paused run resumes and is refused. The
    group's results are complete: each part once, the taken-over part with the newer run's result. As a
    chord's header, the body runs once and sees that same result."""
    a = cluster.worker("a", queues=f"{cluster.queue}-a")
    cluster.worker("b", concurrency=2)
    queue, label = _next_queue(cluster), _label()
    paused = record.s("paused", pause=3.0).set(queue=f"{cluster.queue}-a")
    header = group(paused, record.s("q1"), record.s("q2"))
    canvas = header if kind == "group" else chord(header, after.s(label).set(queue=queue))
    frozen = canvas.freeze()
    header_result = frozen if kind == "group" else frozen.parent
    group_id, parts = header_result.id, [part.id for part in header_result.results]
    canvas.apply_async()
    ((pid, _),) = wait_for(lambda: marks(cluster.workdir, parts[0], "started"), what="first run started")
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _expired(cluster, parts[0]), what="the paused lease to expire")
        sent = canvas.tasks[0] if kind == "group" else canvas.tasks.tasks[0]
        sent.clone().apply_async(group_id=group_id, queue=cluster.queue)  # worker b takes the key over
        values = header_result.get(timeout=30)
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: "refused" in [e for e, _ in cluster.events(parts[0])], what="the stale run's refusal")
    assert [value["item"] for value in values] == ["paused", "q1", "q2"]
    first_token = cluster.events(parts[0])[0][1]
    assert values[0]["token"] > first_token and values[0]["pid"] != pid
    assert cluster.effects(parts[0]) == [(parts[0], values[0]["token"], parts[0], values[0]["pid"])]
    for part in parts[1:]:
        assert len(cluster.effects(part)) == 1
    wait_for(lambda: "fence refused" in a.log_text(), what="the refusal in the paused worker's log")
    assert header_result.get(timeout=5) == values  # the refused run stored nothing over the newer result
    if kind == "chord":
        assert sorted(v["item"] for v in frozen.get(timeout=30)) == ["paused", "q1", "q2"]
        _barrier(cluster, queue)
        (run,) = runs_of(label, cluster.workdir)  # the body, once, with the newer run's result
        assert run["value"] == values  # in the header's order


def test_a_chain_step_refused_after_an_admin_release_runs_again_and_advances_once(cluster: Cluster) -> None:
    """An operator releases the first step's lease while it runs: its fenced write is refused, nobody took
    the key over, so it sends itself again (same id, same chain). The copy writes, and the next step runs
    once, with the copy's result."""
    cluster.worker("a", concurrency=2)
    queue, label = _next_queue(cluster), _label()
    result = chain(record.s("released", pause=3.0), after.s(label).set(queue=queue)).apply_async()
    first_id = result.parent.id
    wait_for(lambda: marks(cluster.workdir, first_id, "started"), what="first run started")
    cluster.store.force_release(first_id)
    value = result.get(timeout=60)
    assert value["item"] == "released"
    assert "refused" in [event for event, _ in cluster.events(first_id)]
    assert value["token"] > cluster.events(first_id)[0][1]  # the copy's token, not the refused run's
    assert wait_for(lambda: _settled(cluster, first_id) >= 2, 30, "every delivery to end")
    _barrier(cluster, queue)
    assert _values(cluster, label) == [value]
    assert cluster.effects(first_id) == [(first_id, value["token"], first_id, value["pid"])]


def _expired(cluster: Cluster, key: str) -> bool:
    state = cluster.store.get(key)
    return state is None or state.expires_in is None or state.expires_in <= 0


# Claim C60: the rows of the table for another task id (the same fence_key), through a chain.


def test_a_chain_whose_key_another_task_id_finished_advances_with_the_winners_result(
    cluster: Cluster,
) -> None:
    """Two chains whose first steps (different task ids) share a fence_key: the second finds the key
    finished and returns the winner's result without running the body; its own chain advances with it."""
    cluster.worker("a")
    queue, item, labels = _next_queue(cluster), _label(), (_label(), _label())
    first = chain(record_keyed.s(item), after.s(labels[0]).set(queue=queue)).apply_async()
    winner = first.get(timeout=30)
    second = chain(record_keyed.s(item), after.s(labels[1]).set(queue=queue)).apply_async()
    assert second.get(timeout=30) == winner
    _barrier(cluster, queue)
    assert [_values(cluster, label) for label in labels] == [[winner], [winner]]
    assert marks(cluster.workdir, second.parent.id, "started") == []  # the body did not run again
    assert len(cluster.effects(f"item:{item}")) == 1


def test_a_chain_whose_key_another_task_id_holds_retries_then_advances_with_the_winners_result(
    cluster: Cluster,
) -> None:
    """The key is held by another task id's run: with ``fence_on_busy="retry"`` (the default) the second
    chain's step comes back after the holder's lease time, finds the key finished and returns the
    winner's result; both chains advance once, with that result."""
    cluster.worker("a", concurrency=2)
    queue, item, labels = _next_queue(cluster), _label(), (_label(), _label())
    first = chain(record_keyed.s(item, pause=3.0), after.s(labels[0]).set(queue=queue)).apply_async()
    wait_for(lambda: marks(cluster.workdir, first.parent.id, "started"), what="the holder to start")
    second = chain(record_keyed.s(item), after.s(labels[1]).set(queue=queue)).apply_async()
    winner = first.get(timeout=30)
    assert second.get(timeout=60) == winner
    _barrier(cluster, queue)
    assert [_values(cluster, label) for label in labels] == [[winner], [winner]]
    assert marks(cluster.workdir, second.parent.id, "started") == []
    assert len(cluster.effects(f"item:{item}")) == 1


def test_a_chain_whose_key_another_task_id_holds_fails_with_fence_on_busy_fail(cluster: Cluster) -> None:
    """``fence_on_busy="fail"``: the second chain's step fails with LeaseHeld naming the holder, the chain
    stops (its next step never runs) and its errback runs; the holder's chain advances once."""
    cluster.worker("a", concurrency=2)
    queue, item, labels = _next_queue(cluster), _label(), (_label(), _label(), _label())
    first = chain(record_keyed.s(item, pause=3.0), after.s(labels[0]).set(queue=queue)).apply_async()
    wait_for(lambda: marks(cluster.workdir, first.parent.id, "started"), what="the holder to start")
    errback = after.si(None, labels[2]).set(queue=queue)
    second = chain(record_keyed_or_fail.s(item), after.s(labels[1]).set(queue=queue))
    second = second.on_error(errback).apply_async()
    with pytest.raises(LeaseHeld, match=first.parent.id):
        second.parent.get(timeout=30, propagate=True)
    winner = first.get(timeout=30)
    _barrier(cluster, queue)
    assert [len(_values(cluster, label)) for label in labels] == [1, 0, 1]
    assert _values(cluster, labels[0]) == [winner]
    assert len(cluster.effects(f"item:{item}")) == 1


@pytest.mark.parametrize("holder_pause", [0.0, 8.0], ids=["winner-finished", "winner-holds"])
def test_a_chain_step_refused_after_another_task_id_took_its_key_over(
    cluster: Cluster, holder_pause: float
) -> None:
    """The first chain's step is paused (SIGSTOP) past its lease; another task id with the same key takes
    it over. Resumed, the paused run is refused. If the winner finished, the refused step returns the
    winner's result and its chain advances once with it; if the winner still holds the key, the refused
    step fails with LeaseHeld naming it and its chain stops."""
    a = cluster.worker("a", queues=f"{cluster.queue}-a")
    cluster.worker("b", concurrency=2)
    queue, item, labels = _next_queue(cluster), _label(), (_label(), _label())
    step = record_keyed.s(item, pause=3.0).set(queue=f"{cluster.queue}-a")
    paused = chain(step, after.s(labels[0]).set(queue=queue)).apply_async()
    ((pid, _),) = wait_for(lambda: marks(cluster.workdir, paused.parent.id, "started"), what="first run")
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: _expired(cluster, f"item:{item}"), what="the paused lease to expire")
        winner = chain(record_keyed.s(item, pause=holder_pause), after.s(labels[1]).set(queue=queue))
        winner = winner.apply_async()
        wait_for(lambda: marks(cluster.workdir, winner.parent.id, "started"), what="the takeover")
        if not holder_pause:
            winner.get(timeout=30)  # finished before the paused run resumes
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: "fence refused" in a.log_text(), what="the paused run's refusal")
    if holder_pause:
        with pytest.raises(LeaseHeld, match=winner.parent.id):
            paused.parent.get(timeout=30, propagate=True)
    winning = winner.get(timeout=30)
    if not holder_pause:
        assert paused.get(timeout=30) == winning
    _barrier(cluster, queue)
    assert _values(cluster, labels[1]) == [winning]
    assert _values(cluster, labels[0]) == ([] if holder_pause else [winning])
    assert cluster.effects(f"item:{item}") == [
        (f"item:{item}", winning["token"], winner.parent.id, winning["pid"])
    ]


def test_a_frozen_chord_applied_again_after_it_finished_runs_its_body_once(cluster: Cluster) -> None:
    """The same frozen chord (same ids) applied a second time after it finished: every part's key is
    finished and its SUCCESS stored, so every part is absorbed and the body does not run again."""
    cluster.worker("a", concurrency=2)
    queue, label = _next_queue(cluster), _label()
    canvas = chord([record.s("c0"), record.s("c1")], after.s(label).set(queue=queue))
    result = canvas.freeze()
    parts = [part.id for part in result.parent.results]
    canvas.apply_async()
    body = result.get(timeout=30)
    canvas.apply_async()
    for part in parts:
        assert wait_for(lambda: _settled(cluster, part) >= 2, 30, "the copies to end")  # noqa: B023
        assert f"duplicate delivery of {part} absorbed: done" in _log(cluster)
        assert len(cluster.effects(part)) == 1
    _barrier(cluster, queue)
    assert [run["value"] for run in runs_of(label, cluster.workdir)] == [body]
