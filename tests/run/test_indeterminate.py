"""Indeterminate outcomes at every store call of a run, on every store: exactly once per key.

A clean run is recorded first (its store calls in order); then, for every call position and every outcome
(failed before the store acted, acted with the reply lost, acted late with the reply lost), a fresh key
runs with that one call misbehaving, and again with the next call misbehaving too (the calls of the way
out: a release, a read). Each ends checked: the caller gets SUCCESS with the right result, the key has one
committed effect, the work ran to the end, ``verify`` is clean, and the history holds no refusal (no run
but this one's attempts ever held the key). Runs go through Celery's in-process worker (solo pool, memory
broker): a re-queued copy is a real message.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import text

from celery_fence import FencedTask, StoreUnavailable
from celery_fence._runtime import runtime_for
from celery_fence.signals import store_wait_exhausted
from celery_fence.stores.memory import MemoryStore
from celery_fence.stores.sql import SQLStore
from celery_fence.testing import Fault, IndeterminateStore, Outcome
from celery_fence.verify import verify_store
from celery_fence.worker.bootstep import settle_owed_records
from tests.support.harnesses import Harness
from tests.support.inprocess import memory_app, running_worker

EFFECTS = "fence_test_effects"


pytestmark = pytest.mark.stores(
    "memory", "sqlite", "postgresql", "redis", "redis_cluster", "etcd_cluster"  # etcd_cluster: under its mark
)


def _expire_one(store: Any, harness: Harness) -> Any:
    def expire(_key: str) -> None:  # every live lease of this test's store: one run at a time here
        harness.expire_all(store)

    return expire


@pytest.fixture
def app(store: Any, harness: Harness) -> Iterator[Celery]:
    app = memory_app("indeterminate", fence_store_url=store.url, task_acks_late=True, fence_lease_ttl=3.0,
                    fence_renew_interval=0.3)
    sql = isinstance(store, SQLStore)
    if sql:
        with store.engine.begin() as conn:
            conn.execute(text(f"CREATE TABLE IF NOT EXISTS {EFFECTS} (key TEXT, token BIGINT)"))

    @app.task(base=FencedTask, bind=True, fence_key="order:{n}", name="indeterminate.pipeline", shared=False)
    def pipeline(self: Any, n: int) -> int:
        value: int = self.fence.step("prepare", lambda: n * 10)
        if sql:
            with self.fence.transaction() as conn:
                conn.execute(text(f"INSERT INTO {EFFECTS} VALUES (:k, :t)"), {"k": f"order:{n}", "t": 0})
        return value + 1

    runtime = runtime_for(app)
    runtime._store = IndeterminateStore(store, expire=_expire_one(store, harness))
    with running_worker(app):
        yield app
    runtime._store = None  # the harness closes the store itself
    runtime.close()
    if sql:
        with store.engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {EFFECTS}"))


def _run(app: Celery, n: int, faults: list[Fault]) -> list[str]:
    wrapped: IndeterminateStore = runtime_for(app).store  # type: ignore[assignment]
    wrapped.calls.clear()
    wrapped.faults = list(faults)
    result = app.tasks["indeterminate.pipeline"].delay(n)
    assert result.get(timeout=60) == n * 10 + 1, faults
    assert result.state == "SUCCESS"
    assert not wrapped.faults, f"a fault never fired: {wrapped.faults} (calls {wrapped.calls})"
    return list(wrapped.calls)


def _check(store: Any, n: int, faults: list[Fault]) -> None:
    key = f"order:{n}"
    state = store.get(key)
    assert state is not None and state.done and state.result == n * 10 + 1, (faults, state)
    assert store.steps(key) == {"prepare": n * 10}
    assert verify_store(store, key) == [], faults
    events = [e.event for e in store.history(key)]
    assert "refused" not in events and "renew-failed" not in events, (faults, events)
    assert events.count("complete") == 1, (faults, events)
    if isinstance(store, SQLStore):
        with store.engine.connect() as conn:
            count = conn.execute(text(f"SELECT count(*) FROM {EFFECTS} WHERE key = :k"), {"k": key})
            assert count.scalar() == 1, (faults, events)
        assert events.count("write") == 1, (faults, events)


@pytest.mark.timeout(600)
def test_every_call_position_and_outcome_leaves_one_effect_and_no_lost_work(
    app: Celery, store: Any, harness: Harness
) -> None:
    clean = _run(app, 0, [])
    _check(store, 0, [])
    outcomes = [Outcome.BEFORE, Outcome.LOST, Outcome.LATE]  # INTERRUPTED: test_every_exit_in_process.py
    if isinstance(store, MemoryStore):  # its clock is the harness's: LATE moves it for everyone
        outcomes = [Outcome.BEFORE, Outcome.LOST]
    if not harness.expired_lease_survives:  # etcd: LATE expires the lease, whose next write is refused
        outcomes = [Outcome.BEFORE, Outcome.LOST]
    cases = [[Fault(o, nth=i)] for i in range(1, len(clean) + 1) for o in outcomes]
    # ... and a second fault on the call right after the first: the way out (a release, a read) fails too.
    # (On the SQL stores, whose runs make the most calls; memory and Redis share the same run code.)
    cases += [] if not isinstance(store, SQLStore) else [
        [Fault(o1, nth=i), Fault(o2, nth=i + 1)]
        for i in range(1, len(clean) + 1)
        for o1, o2 in itertools.product((Outcome.BEFORE, Outcome.LOST), repeat=2)
    ]
    for n, faults in enumerate(cases, start=1):
        _run(app, n, faults)
        _check(store, n, faults)


def test_a_copy_takes_the_key_back_from_the_attempt_that_sent_it(app: Celery, store: Any) -> None:
    """A run re-queued itself after an outage and its release failed too, so its copy finds the key held
    by that earlier attempt. Whatever ``fence_on_busy`` says, the copy takes it back at
    once (the attempt named its token in the copy's ``fence_handoff`` header) and does the work."""
    task = app.tasks["indeterminate.pipeline"]
    wrapped: IndeterminateStore = runtime_for(app).store  # type: ignore[assignment]
    for n, on_busy in enumerate(["retry", "ignore", "fail"], start=1):
        task.fence_on_busy = on_busy
        faults = [Fault(Outcome.LOST, method="save_step"), Fault(Outcome.BEFORE, method="release")]
        _run(app, n, faults)
        _check(store, n, faults)
        events = [e.event for e in store.history(f"order:{n}") if e.event != "write"]
        assert events == ["acquire", "step", "release", "acquire", "complete"], (on_busy, events)
        assert wrapped.calls.count("acquire") == 3  # the first run, the copy held off, the copy again


def test_a_store_outage_at_acquire_is_waited_out_without_spending_max_retries(
    app: Celery, store: Any
) -> None:
    """The store down before the body runs never fails the task:
    the run is sent again with a backoff (not a Celery retry), here three times for a task allowed one."""
    app.tasks["indeterminate.pipeline"].max_retries = 1
    faults = [Fault(Outcome.BEFORE, method="acquire", nth=i) for i in range(1, 10)]  # 3 rounds of 3
    _run(app, 1, faults)
    _check(store, 1, faults)


def test_a_run_that_cannot_wait_the_store_out_fails_and_says_so(
    app: Celery, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = runtime_for(app)
    runtime.config = dataclasses.replace(runtime.config, store_wait=0.5)
    wrapped: IndeterminateStore = runtime.store  # type: ignore[assignment]
    wrapped.faults = [Fault(Outcome.BEFORE, method="acquire", rate=1.0)]
    gave_up: list[dict[str, Any]] = []

    def on_gave_up(sender: Any = None, **fields: Any) -> None:
        gave_up.append(fields)

    store_wait_exhausted.connect(on_gave_up, weak=False)
    try:
        result = app.tasks["indeterminate.pipeline"].delay(1)
        with pytest.raises(StoreUnavailable):
            result.get(timeout=60)
    finally:
        store_wait_exhausted.disconnect(on_gave_up)
    assert result.state == "FAILURE"
    assert [(g["key"], g["task_id"]) for g in gave_up] == [("order:1", result.id)]
    assert any("gave up on" in r.getMessage() and result.id in r.getMessage() for r in caplog.records)


def _give_up(app: Celery, faults: list[Fault]) -> Any:
    """Run ``pipeline(1)`` on a store whose acquires all fail, with ``fence_store_wait`` 0: the run gives up
    at its first failure (no waiting, no re-sent copy) and ends FAILURE."""
    runtime = runtime_for(app)
    runtime.config = dataclasses.replace(runtime.config, store_wait=0.0)
    wrapped: IndeterminateStore = runtime.store  # type: ignore[assignment]
    wrapped.faults = [Fault(Outcome.BEFORE, method="acquire", rate=1.0), *faults]
    result = app.tasks["indeterminate.pipeline"].delay(1)
    with pytest.raises(StoreUnavailable):
        result.get(timeout=60)
    assert result.state == "FAILURE"
    return result


def _given_up(store: Any, task_id: str) -> None:
    """The record ``celery fence leases`` shows: key order:1 dead, naming the run, which is kept."""
    state = store.get("order:1")
    assert state is not None and (state.token, state.owner, state.done) == (0, None, False), state
    assert state.dead is not None and f"indeterminate.pipeline[{task_id}]" in state.dead
    assert state.run is not None and (state.run["id"], state.run["args"]) == (task_id, [1])
    assert [(e.event, e.token, e.owner) for e in store.history("order:1")] == [("gave-up", 0, None)]
    assert "order:1" in [s.key for s in store.leases()]


def test_a_run_that_gives_up_waiting_out_the_store_leaves_a_dead_key(app: Celery, store: Any) -> None:
    """The store answers the record at once (only its acquires failed)."""
    result = _give_up(app, [])
    _given_up(store, result.id)
    assert len(runtime_for(app).owed) == 0
    _run(app, 1, [])  # a fresh delivery of the key runs normally: its acquire clears dead
    _check(store, 1, [])
    assert store.get("order:1").dead is None


def test_a_record_the_store_did_not_take_is_written_after_the_next_acquire(app: Celery, store: Any) -> None:
    """The store is down for the record too, so the process owes it; the next run that acquires
    (another key) writes it, right after its acquire."""
    result = _give_up(app, [Fault(Outcome.BEFORE, method="strand", rate=1.0)])
    assert store.get("order:1") is None and len(runtime_for(app).owed) == 1
    calls = _run(app, 2, [])  # the store answers again
    assert calls[calls.index("acquire") + 1] == "strand"
    assert len(runtime_for(app).owed) == 0
    _given_up(store, result.id)
    _check(store, 2, [])


def test_a_record_still_owed_when_the_worker_process_ends_is_logged(
    app: Celery, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """At the end of the process (the worker's shutdown signal) the store still does not take
    it: one ERROR line names the task id and the key, and nothing is left owed."""
    result = _give_up(app, [Fault(Outcome.BEFORE, method="strand", rate=1.0)])
    settle_owed_records(SimpleNamespace(app=app))
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("record not written" in m and result.id in m and "order:1" in m for m in errors), errors
    assert len(runtime_for(app).owed) == 0 and store.get("order:1") is None
