"""FencedTask through eager ``apply()`` on a memory store: the lifecycle of one run, without a worker.

The renewer's thread is never started here (``_ensure_thread`` is a no-op): nothing runs in the background.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_fence import FencedTask, FenceError, LeaseHeld, NotSerializable, StaleToken
from celery_fence._runtime import Renewer, runtime_for
from celery_fence.stores.base import Store


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    monkeypatch.setattr(Renewer, "_ensure_thread", lambda self: None)
    app = Celery("unit", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.fence_store_url = "memory://"
    yield app
    runtime_for(app).close()


@pytest.fixture
def store(app: Celery) -> Store:
    return runtime_for(app).store


def events(store: Store, key: str) -> list[tuple[str, int]]:
    return [(e.event, e.token) for e in store.history(key)]


def test_the_body_sees_its_lease(app: Celery, store: Store) -> None:
    seen: list[tuple[str, int, Any]] = []

    @app.task(base=FencedTask, bind=True, shared=False)
    def double(self: Any, x: int) -> int:
        seen.append((self.fence.key, self.fence.token, self.request.id))
        self.fence.check()
        return x * 2

    result = double.apply((21,), task_id="t-1")
    assert result.successful() and result.get() == 42
    assert seen == [("t-1", 1, "t-1")]
    state = store.get("t-1")
    assert state is not None and state.done and state.result == 42 and state.expires_in is None
    assert events(store, "t-1") == [("acquire", 1), ("complete", 1)]
    assert runtime_for(app).renewer.held() == []  # untracked once the run ended


def test_a_finished_key_returns_its_stored_result_unrun(app: Celery, store: Store) -> None:
    calls: list[int] = []

    @app.task(base=FencedTask, bind=True, shared=False)
    def once(self: Any) -> dict[str, int]:
        calls.append(self.fence.token)
        return {"run": len(calls)}

    first = once.apply(task_id="dup")
    second = once.apply(task_id="dup")
    assert first.get() == second.get() == {"run": 1}
    assert calls == [1]
    assert events(store, "dup") == [("acquire", 1), ("complete", 1)]


def test_an_exception_releases_the_lease(app: Celery, store: Store) -> None:
    tokens: list[int] = []

    @app.task(base=FencedTask, bind=True, shared=False)
    def boom(self: Any) -> None:
        tokens.append(self.fence.token)
        raise ValueError("boom")

    first = boom.apply(task_id="b-1")
    assert first.failed() and isinstance(first.result, ValueError)
    state = store.get("b-1")
    assert state is not None and state.expires_in is None and not state.done
    second = boom.apply(task_id="b-1")
    assert second.failed()
    assert tokens == [1, 2]
    assert events(store, "b-1") == [("acquire", 1), ("release", 1), ("acquire", 2), ("release", 2)]


def test_a_direct_call_runs_unfenced(app: Celery, store: Store) -> None:
    @app.task(base=FencedTask, bind=True, shared=False)
    def plain(self: Any, x: int) -> str:
        try:
            self.fence  # noqa: B018
        except FenceError as exc:
            return f"{x}: {exc}"
        return "fenced"

    @app.task(base=FencedTask, bind=True, shared=False)
    def needs_fence(self: Any) -> int:
        return self.fence.token

    answer = plain(3)
    assert answer.startswith("3: ") and "direct call" in answer
    with pytest.raises(FenceError, match="without a lease"):
        needs_fence()
    assert store.leases() == []


def test_an_unserializable_result_fails_and_leaves_the_key_not_done(app: Celery, store: Store) -> None:
    calls: list[int] = []

    @app.task(base=FencedTask, bind=True, shared=False)
    def odd(self: Any) -> set[int]:
        calls.append(self.fence.token)
        return {1, 2}

    result = odd.apply(task_id="odd")
    assert result.failed() and isinstance(result.result, NotSerializable)
    state = store.get("odd")
    assert state is not None and not state.done and state.result is None and state.expires_in is None
    odd.apply(task_id="odd")
    assert calls == [1, 2]  # not done: the next delivery runs again


def test_a_key_template_groups_calls_whose_key_matches(app: Celery, store: Store) -> None:
    calls: list[tuple[int, str]] = []

    @app.task(base=FencedTask, bind=True, shared=False, fence_key="invoice:{invoice_id}")
    def charge(self: Any, invoice_id: int, note: str = "") -> str:
        calls.append((invoice_id, note))
        return f"charged {invoice_id} ({note}) with token {self.fence.token}"

    first = charge.apply((1,), {"note": "a"}).get()
    again = charge.apply((1,), {"note": "b"}).get()
    other = charge.apply((2,), {"note": "a"}).get()
    assert first == again == "charged 1 (a) with token 1"
    assert other == "charged 2 (a) with token 2"
    assert calls == [(1, "a"), (2, "a")]
    assert [s.key for s in store.leases()] == ["invoice:1", "invoice:2"]


def test_a_held_key_with_on_busy_fail_fails_unrun(app: Celery, store: Store) -> None:
    calls: list[int] = []

    @app.task(base=FencedTask, bind=True, shared=False, fence_key="k", fence_on_busy="fail")
    def busy(self: Any) -> None:
        calls.append(1)

    holder = store.acquire("k", "someone-else", 30)
    result = busy.apply()
    assert result.failed() and isinstance(result.result, LeaseHeld)
    assert calls == []
    state = store.get("k")
    assert state is not None and state.token == holder.token and state.owner == "someone-else"


def test_a_superseded_run_stores_nothing(app: Celery, store: Store) -> None:
    @app.task(base=FencedTask, bind=True, shared=False, fence_key="k")
    def superseded(self: Any) -> str:
        store.force_release(self.fence.key)  # an operator fences this run out while it works
        return "late"

    result = superseded.apply()
    # apply() has no queue to send the run again: the caller sees why (never IGNORED with the work undone)
    assert result.state == "FAILURE" and isinstance(result.result, StaleToken)
    state = store.get("k")
    assert state is not None and not state.done and state.result is None
    assert [e for e, _ in events(store, "k")] == ["acquire", "admin-release", "refused"]


def test_an_acquire_whose_answer_was_lost_is_found_again_with_the_same_owner(
    app: Celery, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_fence import StoreUnavailable
    from celery_fence import task as task_module

    monkeypatch.setattr(task_module.time, "sleep", lambda _s: None)
    real_acquire, owners = store.acquire, []

    def lossy(key: str, owner: str, ttl: float, run: Any = None) -> Any:
        owners.append(owner)
        lease = real_acquire(key, owner, ttl, run)
        if len(owners) == 1:
            raise StoreUnavailable("the answer was lost")  # committed, but the caller never heard
        return lease

    monkeypatch.setattr(store, "acquire", lossy)

    @app.task(base=FencedTask, bind=True, shared=False)
    def once(self: Any) -> int:
        return self.fence.token

    assert once.apply(task_id="t-lost").get() == 1  # its own lease, not a LeaseHeld against itself
    assert len(set(owners)) == 1 and len(owners) == 2


def test_a_store_that_stays_down_makes_the_task_retry(
    app: Celery, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from celery_fence import StoreUnavailable
    from celery_fence import task as task_module

    monkeypatch.setattr(task_module.time, "sleep", lambda _s: None)

    def down(*_args: Any, **_kwargs: Any) -> Any:
        raise StoreUnavailable("down")

    monkeypatch.setattr(store, "acquire", down)
    ran: list[int] = []

    @app.task(base=FencedTask, bind=True, shared=False, max_retries=2)
    def never(self: Any) -> None:
        ran.append(1)

    result = never.apply(task_id="t-down")
    assert result.failed() and isinstance(result.result, StoreUnavailable)
    assert ran == []  # the body never ran without a lease


@pytest.mark.parametrize("what", ["renewed", "refused"])
def test_the_runs_reports_reach_the_signals_with_the_task_as_sender(app: Celery, what: str) -> None:
    """What the run reports (from the renewer's thread too) reaches ``lease_renewed`` / ``write_refused``
    receivers connected for this task, with the key, the token, the task id and (refused) the reason."""
    from celery.app.task import Context

    from celery_fence.signals import lease_renewed, write_refused
    from celery_fence.task import _Host

    @app.task(base=FencedTask, bind=True, shared=False, fence_key="k")
    def work(self: Any) -> None:
        pass

    task = work._get_current_object()  # a registered task, not the lazy proxy (whose receivers connect late)
    heard: list[dict[str, Any]] = []

    def receiver(sender: Any, **fields: Any) -> None:
        heard.append({"sender": sender, **{k: v for k, v in fields.items() if k != "signal"}})

    signal = lease_renewed if what == "renewed" else write_refused
    signal.connect(receiver, sender=task, weak=False)
    try:
        host = _Host(task, Context(id="t-1", is_eager=True), runtime_for(app))
        host.report(what, "k", 3, reason="lease lost: renew refused")
    finally:
        signal.disconnect(receiver, sender=task)
    expected: dict[str, Any] = {"sender": task, "key": "k", "token": 3, "task_id": "t-1"}
    if what == "refused":
        expected["reason"] = "lease lost: renew refused"
    assert heard == [expected]


def test_a_takeover_and_its_release_reach_signals_and_events_with_their_fields(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``lease_acquired`` and, for an acquire that took an expired lease over, ``lease_takeover`` and the
    ``task-fence-takeover`` event; ``lease_released`` when the run lets go; a refusal's event names the key
    and the token."""
    from celery.app.task import Context

    import celery_fence.task as task_module
    from celery_fence.fence import Fence
    from celery_fence.signals import lease_acquired, lease_released, lease_takeover
    from celery_fence.stores.memory import MemoryStore
    from celery_fence.task import _Host
    from celery_fence.testing import FakeClock

    @app.task(base=FencedTask, bind=True, shared=False, fence_key="k")
    def work(self: Any) -> None:
        pass

    task = work._get_current_object()
    runtime = runtime_for(app)
    events: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(task_module, "send_fence_event", lambda c, t, r, kind, **f: events.append((kind, f)))
    heard: list[tuple[str, dict[str, Any]]] = []

    def receiver(signal: Any, sender: Any, **fields: Any) -> None:
        assert sender is task
        heard.append((signal.name, fields))

    signals = (lease_acquired, lease_takeover, lease_released)
    for signal in signals:
        signal.connect(receiver, sender=task, weak=False)
    try:
        clock = FakeClock()
        store = MemoryStore(clock=clock)
        store.acquire("k", "the-dead-run", 30)
        clock.advance(45)  # the store's clock: the dead run's lease expired 15 s ago
        lease = store.acquire("k", "the-new-run", 30)
        assert lease.taken_over
        host = _Host(task, Context(id="t-1", is_eager=True), runtime)
        fence = Fence(store, lease, None, 30.0)
        host.acquired(fence)
        host.report("refused", "k", lease.token, reason="refused")
        host.released(fence)
    finally:
        for signal in signals:
            signal.disconnect(receiver, sender=task)
    run = {"key": "k", "token": lease.token, "task_id": "t-1"}
    assert [name for name, _ in heard] == ["lease_acquired", "lease_takeover", "lease_released"]
    assert heard[0][1] == run and heard[1][1] == {**run, "expired_for": lease.expired_for}
    assert {k: v for k, v in heard[2][1].items() if k != "held"} == run and heard[2][1]["held"] >= 0
    assert events == [
        ("takeover", {"key": "k", "token": lease.token, "expired_for": lease.expired_for}),
        ("refused", {"key": "k", "token": lease.token, "exception": "refused"}),
    ]


def test_a_direct_call_passes_keyword_arguments(app: Celery) -> None:
    @app.task(base=FencedTask, bind=True, shared=False)
    def add(self: Any, x: int, y: int = 0) -> int:
        return x + y

    assert add(1, y=2) == 3


def test_a_tasks_own_lease_ttl_is_the_runs(app: Celery, store: Store) -> None:
    """``fence_lease_ttl`` on the task, not the app's default (30 s), sets the lease the run holds."""
    seen: list[float | None] = []

    @app.task(base=FencedTask, bind=True, shared=False, fence_key="k", fence_lease_ttl=7.0)
    def short(self: Any) -> None:
        state = store.get("k")
        seen.append(None if state is None else state.expires_in)

    assert short.apply().successful()
    assert seen and seen[0] is not None and 6.0 < seen[0] <= 7.0


def test_a_copy_built_during_a_run_names_the_token_it_hands_over(app: Celery) -> None:
    """``self.retry()`` and the fence's re-sends build their copy with ``signature_from_request``: the copy
    carries the running lease's token (``fence_handoff``), to take the key back if the release is lost."""

    @app.task(base=FencedTask, bind=True, shared=False, fence_key="k")
    def work(self: Any) -> tuple[Any, int]:
        copy = self.signature_from_request(self.request)
        return copy.options["headers"].get("fence_handoff"), self.fence.token

    handoff, token = work.apply().get()
    assert handoff == token == 1
