"""The records a process owes its store: a run that gave up waiting out an unavailable store is
recorded with ``strand``, at once if the store takes it, else kept by the process's runtime and written
later; what is never written is logged at ERROR. A memory store behind the fault kit: no network, no sleeps.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_fence import FencedTask, StoreUnavailable, _owed
from celery_fence._delivery import Stranded
from celery_fence._owed import OwedRecords
from celery_fence._runtime import runtime_for
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import Fault, IndeterminateStore, Outcome
from celery_fence.worker.bootstep import settle_owed_records

RUN = {"task": "shop.charge", "id": "t-1", "args": [1], "kwargs": {}}


def record(n: int) -> Stranded:
    return Stranded(f"t-{n}", f"order:{n}", {**RUN, "id": f"t-{n}"}, f"shop.charge[t-{n}] gave up")


def failing(store: MemoryStore, *faults: Fault) -> IndeterminateStore:
    return IndeterminateStore(store, list(faults) or [Fault(Outcome.BEFORE, method="strand", rate=1.0)])


def messages(caplog: pytest.LogCaptureFixture, level: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == level]


def test_a_record_the_store_takes_is_written_at_once(store: MemoryStore) -> None:
    records = OwedRecords()
    records.write(store, record(1))
    assert len(records) == 0
    state = store.get("order:1")
    assert state is not None and (state.dead, state.run) == ("shop.charge[t-1] gave up", {**RUN, "id": "t-1"})


def test_a_record_the_store_refuses_is_owed_then_flushed(
    store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    records = OwedRecords()
    records.write(failing(store), record(1))
    assert len(records) == 1 and store.get("order:1") is None
    assert any("is owed" in m and "t-1" in m and "order:1" in m for m in messages(caplog, "WARNING"))
    records.flush(store)  # the store answers again
    assert len(records) == 0 and store.get("order:1") is not None


def test_a_flush_stops_at_the_first_record_the_store_refuses_and_keeps_the_order(store: MemoryStore) -> None:
    records = OwedRecords()
    for n in (1, 2, 3):
        records.write(failing(store), record(n))
    wrapped = failing(store, Fault(Outcome.BEFORE, method="strand", nth=2))
    records.flush(wrapped)
    assert wrapped.calls == ["strand", "strand"]  # the third was not tried: the store is still down
    assert [s.key for s in store.leases()] == ["order:1"] and len(records) == 2
    records.flush(wrapped)
    assert [s.key for s in store.leases()] == ["order:1", "order:2", "order:3"] and len(records) == 0
    assert [e.key for e in store.history()] == ["order:1", "order:2", "order:3"]


def test_a_key_leased_meanwhile_is_no_longer_owed(store: MemoryStore) -> None:
    records = OwedRecords()
    records.write(failing(store), record(1))
    lease = store.acquire("order:1", "w", 30.0)  # a fresh delivery got the key meanwhile
    records.flush(store)
    assert len(records) == 0 and store.get("order:1").dead is None  # type: ignore[union-attr]
    store.complete(lease, "ok")


def test_past_the_bound_the_oldest_record_is_logged_as_not_written(
    store: MemoryStore, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_owed, "MAX_OWED", 2)
    records = OwedRecords()
    for n in (1, 2, 3):
        records.write(failing(store), record(n))
    assert len(records) == 2
    assert [m for m in messages(caplog, "ERROR") if "record not written" in m and "'order:1'" in m]
    records.flush(store)
    assert [s.key for s in store.leases()] == ["order:2", "order:3"]


@pytest.fixture
def app() -> Any:
    app = Celery("owed", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.fence_store_url = "memory://"
    yield app
    runtime_for(app).close()


def test_closing_the_runtime_writes_what_is_owed(app: Celery) -> None:
    runtime = runtime_for(app)
    store: MemoryStore = runtime.store  # type: ignore[assignment]
    runtime.owed.write(failing(store), record(1))
    runtime.close()
    assert len(runtime.owed) == 0 and store.get("order:1") is not None


def test_what_the_store_still_refuses_at_close_is_logged_at_error(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = runtime_for(app)
    runtime._store = failing(runtime.store)  # type: ignore[assignment]
    runtime.owed.write(runtime.store, record(1))
    runtime.close()
    expected = "fence: record not written: t-1 gave up on key 'order:1'"
    assert any(m.startswith(expected) for m in messages(caplog, "ERROR")), caplog.records
    assert len(runtime.owed) == 0


def test_a_process_without_a_runtime_settles_nothing(app: Celery) -> None:
    settle_owed_records(SimpleNamespace(app=app))  # the worker's shutdown signal
    assert "_celery_fence_runtime" not in app.__dict__  # none made just to settle


def test_an_eager_run_that_gives_up_owes_no_record(app: Celery, monkeypatch: pytest.MonkeyPatch) -> None:
    """``apply()`` raises to its caller, who sees why: no record is made for it."""
    runtime = runtime_for(app)
    monkeypatch.setattr(runtime, "sleep", lambda _s: None)
    store: MemoryStore = runtime.store  # type: ignore[assignment]
    runtime._store = IndeterminateStore(store, [Fault(Outcome.BEFORE, method="acquire", rate=1.0)])

    @app.task(base=FencedTask, bind=True, fence_key="order:{n}", shared=False)
    def charge(self: Any, n: int) -> int:
        return n

    result = charge.apply((1,), task_id="t-eager")
    assert result.failed() and isinstance(result.result, StoreUnavailable)
    assert store.get("order:1") is None and len(runtime.owed) == 0
    assert "strand" not in runtime._store.calls  # type: ignore[attr-defined]



def test_a_store_without_the_recovery_role_owes_no_record_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from tests.support.harnesses.run_only import RunOnlyStore

    records = OwedRecords()
    records.write(RunOnlyStore(), record(1))  # type: ignore[arg-type]  # a run role only
    assert len(records) == 0
    assert messages(caplog, "WARNING") == [
        "fence: the store keeps no give-up records (no recovery role): shop.charge[t-1] gave up"
    ]
