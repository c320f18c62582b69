"""A run whose acquire answered "done" or "held" and whose read of the key then failed, or found the key
pruned meanwhile (docs/guarantees.md#how-a-run-ends: every store call answered, failed or unknown). Eager
``apply()`` on a memory store behind a wrapper; these are rows of the decide table that the mutation run found
no run-level test reaching (docs/reliability.md, "Mutation testing")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_fence import FencedTask, LeaseHeld, StoreUnavailable
from celery_fence._runtime import Renewer, runtime_for
from celery_fence.stores.memory import MemoryStore


class Unreadable:
    """The memory store, except that ``get`` fails (``read="fail"``) or first prunes every finished key
    (``read="pruned"``, as if ``celery fence prune`` ran between the acquire and the read)."""

    def __init__(self, store: MemoryStore, read: str) -> None:
        self._store, self.read = store, read

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def get(self, key: str) -> Any:
        if self.read == "fail":
            raise StoreUnavailable("the test lost the read")
        if self.read == "pruned":
            self._store.prune(0.0)
        return self._store.get(key)


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    monkeypatch.setattr(Renewer, "_ensure_thread", lambda self: None)
    app = Celery("unread", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.fence_store_url = "memory://"
    yield app
    runtime = runtime_for(app)
    runtime._store = runtime._store._store if isinstance(runtime._store, Unreadable) else runtime._store
    runtime.close()


@pytest.fixture
def calls() -> list[str]:
    return []


@pytest.fixture
def task(app: Celery, calls: list[str]) -> Any:
    @app.task(base=FencedTask, bind=True, shared=False, fence_key="order:{n}", name="unread.charge")
    def charge(self: Any, n: int) -> str:
        calls.append(self.request.id)
        return f"charged by {self.request.id}"

    return charge


def _reads(app: Celery, read: str) -> MemoryStore:
    runtime = runtime_for(app)
    store = runtime.store
    runtime._store = Unreadable(store, read)
    return store


def test_a_done_key_whose_read_fails_returns_the_acquires_stored_result(
    app: Celery, task: Any, calls: list[str]
) -> None:
    assert task.apply((1,), task_id="first").get() == "charged by first"
    _reads(app, "fail")
    again = task.apply((1,), task_id="second")
    assert again.successful() and again.get() == "charged by first"  # what AlreadyDone carried
    assert calls == ["first"]


def test_a_held_key_whose_read_fails_is_busy(app: Celery, task: Any, calls: list[str]) -> None:
    store = _reads(app, "fail")
    store.acquire("order:2", "someone-else", 30.0)
    task.fence_on_busy = "fail"
    try:
        result = task.apply((2,), task_id="turned-away")
    finally:
        task.fence_on_busy = None
    assert result.failed() and isinstance(result.result, LeaseHeld) and calls == []
    assert "someone-else" in str(result.result)  # the acquire's own answer, not a second round's guess


def test_a_done_key_pruned_before_the_read_is_acquired_again_and_run(
    app: Celery, task: Any, calls: list[str]
) -> None:
    assert task.apply((3,), task_id="first").get() == "charged by first"
    store = _reads(app, "pruned")
    again = task.apply((3,), task_id="second")
    assert again.successful() and again.get() == "charged by second"  # nothing left to return: run it
    assert calls == ["first", "second"]
    state = store.get("order:3")
    assert state is not None and state.done and state.result == "charged by second"
