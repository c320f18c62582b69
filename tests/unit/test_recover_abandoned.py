"""recover_abandoned over the memory store with a fake app: what is re-sent, and when it gives up."""

from __future__ import annotations

import itertools
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
    sent = {"args": [7], "kwargs": {"x": 1}, "task_id": "t-1", "queue": "q1"}
    sent["headers"] = {"fence_recovered": 1}
    assert app.sent == [("shop.charge", sent)]  # marked: a copy of a task id that ended FAILURE is not run
    assert recover_abandoned(app, store, grace=TTL, max_recoveries=3).resent == []  # quiet for the grace


def test_a_fence_key_header_travels_with_the_resend() -> None:
    store, app = MemoryStore(clock=FakeClock()), FakeApp()
    _abandon(store, "custom", {**RUN, "fence_key": "custom"})
    recover_abandoned(app, store, grace=TTL, max_recoveries=3)
    assert app.sent[0][1]["headers"] == {"fence_key": "custom", "fence_recovered": 1}


def test_recovery_gives_up_after_the_bound_of_started_and_lost_copies() -> None:
    store, app = MemoryStore(clock=FakeClock()), FakeApp()
    _abandon(store, "k", RUN)
    for _ in range(2):
        assert recover_abandoned(app, store, grace=TTL, max_recoveries=2).resent == ["k"]
        _abandon(store, "k", RUN)  # the re-sent copy started (acquired the key) and was lost too
    report = recover_abandoned(app, store, grace=TTL, max_recoveries=2)
    assert (report.resent, report.dead) == ([], ["k"])
    assert store.get("k").dead == "gave up after 2 recoveries"
    assert len(app.sent) == 2


def test_a_copy_that_has_not_started_never_counts_and_the_wait_grows() -> None:
    """A busy pool: the re-sent copies sit in the queue. Not one counts against the bound, and each
    further copy waits twice as long as the one before (after the first two)."""
    store, app = MemoryStore(clock=FakeClock()), FakeApp()
    _abandon(store, "k", RUN)
    sent_at = []
    for _ in range(6):  # far beyond max_recoveries=1: none of these copies started
        while not recover_abandoned(app, store, grace=TTL, max_recoveries=1).resent:
            store.clock.advance(1.0)  # type: ignore[attr-defined]
        sent_at.append(store.clock())
    gaps = [b - a for a, b in itertools.pairwise(sent_at)]
    assert [round(g / TTL) for g in gaps] == [1, 2, 4, 8, 16]
    state = store.get("k")
    assert (state.dead, state.recoveries, state.recovery_sent) == (None, 0, 6)
    store.acquire("k", "copy", TTL, RUN)  # one copy finally starts: it is attempt 1
    state = store.get("k")
    assert (state.recoveries, state.recovery_sent) == (1, 0)


def test_a_task_this_process_does_not_know_is_sent_by_name_never_dead() -> None:
    """It may belong to another service's workers: the app's send_task routes it by name."""
    store, app = MemoryStore(clock=FakeClock()), FakeApp()
    store.acquire("a", "w", TTL, {**RUN, "task": "billing.elsewhere"})
    store.clock.advance(3 * TTL)  # type: ignore[attr-defined]
    report = recover_abandoned(app, store, grace=TTL, max_recoveries=3)
    assert (report.resent, report.foreign, report.dead) == (["a"], ["a"], [])
    assert [name for name, _ in app.sent] == ["billing.elsewhere"]
    assert store.get("a").dead is None and store.get("a").recovery_sent == 1


def test_unrecorded_arguments_are_dead_at_once_with_the_reason() -> None:
    store, app = MemoryStore(clock=FakeClock()), FakeApp()
    store.acquire("b", "w", TTL, {**RUN, "args": None, "kwargs": None})
    store.acquire("c", "w", TTL, {**RUN, "args": None, "kwargs": None, "dropped": "too big for etcd"})
    store.clock.advance(3 * TTL)  # type: ignore[attr-defined]
    report = recover_abandoned(app, store, grace=TTL, max_recoveries=3)
    assert sorted(report.dead) == ["b", "c"] and app.sent == []
    assert "not JSON-serializable" in (store.get("b").dead or "")
    assert "too big for etcd" in (store.get("c").dead or "")


def test_live_finished_and_recently_expired_runs_are_left_alone() -> None:
    store, app = MemoryStore(clock=FakeClock()), FakeApp()
    store.complete(store.acquire("done", "w", TTL, RUN), 1)
    store.acquire("recent", "w", TTL, RUN)
    store.clock.advance(TTL + 1)  # type: ignore[attr-defined]  # expired, but within the grace
    store.acquire("live", "w", TTL, RUN)
    assert recover_abandoned(app, store, grace=TTL, max_recoveries=3).resent == []
