"""Every exit of a run ends right, through Celery's in-process worker: what the body and Celery do
around the store. A time limit that lands while the completion's reply is due or after it answered, a failed
run whose release was lost, and the headers a copy inherits."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import before_task_publish
from sqlalchemy import text

from celery_fence import FencedTask
from celery_fence._owed import OwedRecords
from celery_fence._runtime import runtime_for
from celery_fence.recovery import recover_abandoned
from celery_fence.signals import lease_duplicate
from celery_fence.stores.sql import SQLStore
from celery_fence.testing import Fault, IndeterminateStore, Outcome, wait_for
from tests.support.harnesses import Harness
from tests.support.inprocess import memory_app, running_worker

EFFECTS = "fence_test_exit_effects"


pytestmark = pytest.mark.stores("memory", transactions=True)


class World:
    """The app's runs as the test sees them: bodies entered, callbacks fired."""

    def __init__(self) -> None:
        self.bodies: list[str] = []
        self.callbacks: list[Any] = []


@pytest.fixture
def world() -> World:
    return World()


@pytest.fixture
def app(store: Any, world: World) -> Iterator[Celery]:
    app = memory_app("exits", fence_store_url=store.url, task_acks_late=True, fence_recover=False)
    sql = isinstance(store, SQLStore)
    if sql:
        with store.engine.begin() as conn:
            conn.execute(text(f"CREATE TABLE IF NOT EXISTS {EFFECTS} (key TEXT)"))

    @app.task(base=FencedTask, bind=True, fence_key="k:{n}", name="exits.work", shared=False)
    def work(self: Any, n: int, joined: bool = False, fail: bool = False) -> str:
        world.bodies.append(f"{n}:{self.request.id}")
        if fail:
            raise ValueError("the body failed")
        if joined:
            with self.fence.transaction() as conn:
                conn.execute(text(f"INSERT INTO {EFFECTS} VALUES (:k)"), {"k": self.fence.key})
        return f"done {n}"

    # A short ttl: its wait out of the outage comes back after one renew interval (1 s, not 10)
    @app.task(base=FencedTask, bind=True, fence_key="r:{n}", name="exits.retrying", shared=False,
              fence_lease_ttl=3.0)
    def retrying(self: Any, n: int) -> str:
        world.bodies.append(f"{n}:{self.request.retries}")
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        return "retried"

    @app.task(name="exits.then", shared=False)
    def then(value: Any) -> None:
        world.callbacks.append(value)

    runtime = runtime_for(app)
    runtime._store = IndeterminateStore(store)
    with running_worker(app):
        yield app
    runtime._store = None  # the harness closes the store itself
    runtime.close()
    if sql:
        with store.engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {EFFECTS}"))


def _faults(app: Celery, *faults: Fault) -> IndeterminateStore:
    wrapped: IndeterminateStore = runtime_for(app).store  # type: ignore[assignment]
    wrapped.faults = list(faults)
    return wrapped


def test_a_time_limit_while_the_completions_reply_is_due_still_ends_success(
    app: Celery, store: Any, world: World
) -> None:
    """Finding 2: the completion committed, then a SoftTimeLimitExceeded landed before its reply. The run
    reads the key, finds its own token done, and ends SUCCESS; the chain's next task runs once (it used to
    be FAILURE, with the next task marked FAILURE unrun, while the store held the key done)."""
    _interrupted_reply(app, store, world, joined=False)


@pytest.mark.stores(transactions=True)
def test_a_time_limit_while_the_joined_completions_reply_is_due_still_ends_success(
    app: Celery, store: Any, world: World
) -> None:
    """Finding 2 with the run's transaction: the writes, the result and the release committed as one."""
    _interrupted_reply(app, store, world, joined=True)
    with store.engine.connect() as conn:
        assert conn.execute(text(f"SELECT count(*) FROM {EFFECTS}")).scalar() == 1


def _interrupted_reply(app: Celery, store: Any, world: World, joined: bool) -> None:
    _faults(app, Fault(Outcome.INTERRUPTED, method="commit" if joined else "complete"))
    work, then = app.tasks["exits.work"], app.tasks["exits.then"]
    result = work.apply_async((1, joined), link=then.s())
    assert result.get(timeout=30) == "done 1" and result.state == "SUCCESS"
    wait_for(lambda: world.callbacks == ["done 1"], what="the chain's next task")
    state = store.get("k:1")
    assert state is not None and state.done and state.result == "done 1"
    assert len(world.bodies) == 1


@pytest.mark.parametrize("reply", ["answered", "lost"])
def test_a_time_limit_after_the_completion_answered_still_ends_success(
    app: Celery, store: Any, world: World, reply: str
) -> None:
    """Finding 2, the other window: the interruption lands on the way out, after the completion answered,
    or after a read found the key done when the completion's reply was lost (the simulation's N7)."""
    if reply == "lost":
        _faults(app, Fault(Outcome.LOST, method="complete"))
    runtime = runtime_for(app)
    renewer = runtime.renewer
    untrack, fired = renewer.untrack, []

    def interrupted_untrack(lease: Any) -> None:
        untrack(lease)
        state = store.get(lease.key)
        if state is not None and state.done and not fired:
            fired.append(lease.key)
            raise SoftTimeLimitExceeded("a time limit on the way out")

    renewer.untrack = interrupted_untrack  # type: ignore[method-assign]
    work, then = app.tasks["exits.work"], app.tasks["exits.then"]
    result = work.apply_async((2,), link=then.s())
    assert result.get(timeout=30) == "done 2" and result.state == "SUCCESS"
    assert fired == ["k:2"]
    wait_for(lambda: world.callbacks == ["done 2"], what="the chain's next task")


def test_a_failed_run_whose_release_was_lost_is_not_run_again_by_recovery(
    app: Celery, store: Any, harness: Harness, world: World
) -> None:
    """Finding 4: the body raised (FAILURE); its release did not reach the store and the process ended
    before it could write what it owed; the lease expired and recovery sent the message again. The copy
    takes the key over, sees its task id ended FAILURE, and ends without running the body."""
    wrapped = _faults(app, Fault(Outcome.BEFORE, method="release", rate=1.0))
    work = app.tasks["exits.work"]
    task_id = str(uuid.uuid4())
    result = work.apply_async((3,), {"fail": True}, task_id=task_id)
    with pytest.raises(ValueError, match="the body failed"):
        result.get(timeout=30)
    runtime = runtime_for(app)
    assert len(runtime.owed) == 1  # the release is owed...
    runtime.owed = OwedRecords()  # ... and lost with the process
    wrapped.faults = []
    harness.expire_all(store)
    report = recover_abandoned(app, runtime.store, grace=0.0, max_recoveries=3)
    assert report.resent == ["k:3"]
    wait_for(lambda: (s := store.get("k:3")) is not None and s.expires_in is None, what="the copy to end")
    assert world.bodies == [f"3:{task_id}"]  # the body ran once
    assert result.state == "FAILURE"
    state = store.get("k:3")
    assert state is not None and not state.done


def test_a_failed_runs_lost_release_is_owed_and_written_after_the_next_acquire(
    app: Celery, store: Any, world: World
) -> None:
    """Finding 4, the usual case: the process lives on, writes the release it owes once the store answers
    again, and recovery finds nothing abandoned."""
    _faults(app, Fault(Outcome.BEFORE, method="release"), Fault(Outcome.BEFORE, method="release", nth=2))
    work = app.tasks["exits.work"]
    with pytest.raises(ValueError):
        work.delay(4, fail=True).get(timeout=30)
    assert len(runtime_for(app).owed) == 1
    assert work.delay(5).get(timeout=30) == "done 5"  # its acquire lets the process write what it owes
    assert len(runtime_for(app).owed) == 0
    state = store.get("k:4")
    assert state is not None and state.expires_in is None and not state.done
    assert recover_abandoned(app, runtime_for(app).store, grace=0.0, max_recoveries=3).resent == []


def test_a_copy_never_inherits_an_attempts_wait_clock(app: Celery, store: Any, world: World) -> None:
    """Finding 5: a run that waited out an outage, then acquired and called self.retry(), sent the retry
    with the outage's ``fence_waiting_since`` and ``fence_waits``, so a later short outage gave up at once.
    The headers of one wait belong to that wait: every other copy is sent without them."""
    retrying = app.tasks["exits.retrying"]
    published: list[dict[str, Any]] = []

    def on_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
        published.append(dict(headers or {}))

    _faults(app, *[Fault(Outcome.BEFORE, method="acquire", nth=n) for n in (1, 2, 3)])  # the first run waits
    before_task_publish.connect(on_publish, weak=False)
    try:
        result = retrying.delay(6)
        assert result.get(timeout=60) == "retried"
    finally:
        before_task_publish.disconnect(on_publish)
    mine = [h for h in published if h.get("id") == result.id]
    waited = [h for h in mine if "fence_waiting_since" in h]
    retried = [h for h in mine if h.get("retries") == 1]
    assert waited and waited[0]["fence_waits"] == 1  # the wait's own copy carries its clock
    assert retried and all("fence_waiting_since" not in h and "fence_waits" not in h for h in retried)
    assert world.bodies == ["6:0", "6:1"]


def test_a_late_copy_of_a_failed_task_id_leaves_its_failure_alone(
    app: Celery, store: Any, world: World
) -> None:
    """The simulation's N6: a task id ended FAILURE (its errback ran); the producer sends its message again
    (not marked redelivered) while another task id holds the key. Storing RETRY over the FAILURE would let
    the copy that look-again sends run the body later (its task id no longer reads FAILURE): both branches
    of the canvas. The late copy is absorbed instead, and the FAILURE stays."""
    work = app.tasks["exits.work"]
    task_id = str(uuid.uuid4())
    result = work.apply_async((7,), {"fail": True}, task_id=task_id)
    with pytest.raises(ValueError, match="the body failed"):
        result.get(timeout=30)
    store.acquire("k:7", "another-task-ids-run", 30.0, {"id": "another-task-id"})
    absorbed: list[str] = []

    def on_duplicate(sender: Any = None, reason: str = "", task_id: str = "", **_: Any) -> None:
        absorbed.append(f"{task_id}:{reason}")

    lease_duplicate.connect(on_duplicate, weak=False)
    try:
        work.apply_async((7,), {"fail": True}, task_id=task_id)  # the producer's resend
        wait_for(lambda: absorbed, what="the late copy to end")
    finally:
        lease_duplicate.disconnect(on_duplicate)
    assert absorbed == [f"{task_id}:ended"]
    assert result.state == "FAILURE"  # not RETRY: no copy of it will run the body
    assert world.bodies == [f"7:{task_id}"]
