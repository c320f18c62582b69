"""recover_abandoned over the memory store with a fake app: what is re-sent, and when it gives up."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from celery_fence.recovery import recover_abandoned
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import FakeClock

TTL = 10.0


@dataclass
class FakeApp:
    tasks: dict[str, Any] = field(default_factory=lambda: {"shop.charge": object()})
    sent: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def send_task(self, name: str, **options: Any) -> None:
        self.sent.append((name, options))


def _abandon(store: MemoryStore, key: str, run: dict[str, Any] | None) -> None:
    store.acquire(key, "dead-worker", TTL, run)
    assert isinstance(store.clock, FakeClock)
    store.clock.advance(TTL + TTL + 1)  # expired for longer than the grace


RUN = {"task": "shop.charge", "id": "t-1", "args": [7], "kwargs": {"x": 1}, "queue": "q1"}


def test_an_abandoned_run_is_sent_again_with_its_id_queue_and_arguments() -> None:
    store, app = MemoryStore(clock=FakeClock()), FakeApp()
    _abandon(store, "invoice:7", RUN)
    report = recover_abandoned(app, store, grace=TTL, max_recoveries=3)
    assert report.resent == ["invoice:7"]
    assert app.sent == [("shop.charge", {"args": [7], "kwargs": {"x": 1}, "task_id": "t-1", "queue": "q1"})]
    assert recover_abandoned(app, store, grace=TTL, max_recoveries=3).resent == []  # quiet for the grace


def test_a_fence_key_header_travels_with_the_resend() -> None:
    store, app = MemoryStore(clock=FakeClock()), FakeApp()
    _abandon(store, "custom", {**RUN, "fence_key": "custom"})
    recover_abandoned(app, store, grace=TTL, max_recoveries=3)
    assert app.sent[0][1]["headers"] == {"fence_key": "custom"}


def test_recovery_gives_up_after_the_bound_and_marks_the_key_dead() -> None:
    store, app = MemoryStore(clock=FakeClock()), FakeApp()
    _abandon(store, "k", RUN)
    for _ in range(2):
        assert recover_abandoned(app, store, grace=TTL, max_recoveries=2).resent == ["k"]
        store.clock.advance(TTL + 1)  # type: ignore[attr-defined]  # the re-sent run never came
    report = recover_abandoned(app, store, grace=TTL, max_recoveries=2)
    assert (report.resent, report.dead) == ([], ["k"])
    assert store.get("k").dead == "gave up after 2 recoveries"
    assert len(app.sent) == 2


def test_unknown_tasks_and_unrecorded_arguments_are_dead_at_once() -> None:
    store, app = MemoryStore(clock=FakeClock()), FakeApp()
    store.acquire("a", "w", TTL, {**RUN, "task": "gone.task"})
    store.acquire("b", "w", TTL, {**RUN, "args": None, "kwargs": None})
    store.clock.advance(3 * TTL)  # type: ignore[attr-defined]
    report = recover_abandoned(app, store, grace=TTL, max_recoveries=3)
    assert sorted(report.dead) == ["a", "b"] and app.sent == []
    assert store.get("a").dead == "unknown task 'gone.task'"
    assert "not JSON-serializable" in (store.get("b").dead or "")


def test_live_finished_and_recently_expired_runs_are_left_alone() -> None:
    store, app = MemoryStore(clock=FakeClock()), FakeApp()
    store.complete(store.acquire("done", "w", TTL, RUN), 1)
    store.acquire("recent", "w", TTL, RUN)
    store.clock.advance(TTL + 1)  # type: ignore[attr-defined]  # expired, but within the grace
    store.acquire("live", "w", TTL, RUN)
    assert recover_abandoned(app, store, grace=TTL, max_recoveries=3).resent == []
