"""What users' hooks and callers see of a run, through Celery's in-process worker (threads pool, recovery
off: no bootstep runs in it): the signals of a refused and of a lost run, ``fence_on_busy`` ``retry`` and
``ignore``, and the re-queue of a run whose lease only lapsed, with nobody to recover it."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.signals import before_task_publish, task_failure, task_postrun, task_success

from celery_fence import FencedTask, LeaseHeld, LeasePolicy, StoreUnavailable
from celery_fence._runtime import Renewer, runtime_for
from celery_fence.signals import lease_duplicate, lease_lost
from celery_fence.testing import wait_for
from tests.support.harnesses import Harness
from tests.support.inprocess import Gates, memory_app, running_worker

TTL = 30.0
SHORT_TTL = 3.0


pytestmark = pytest.mark.stores("memory", "sqlite")


@pytest.fixture
def gates() -> Gates:
    return Gates()


class Clock:
    """The renewer's monotonic clock, moved on by the test: no waiting for a renew interval."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


class Unreachable:
    """The store, except that its renews fail as if the server did not answer (``down``)."""

    def __init__(self, store: Any) -> None:
        self._store, self.down = store, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def renew(self, leases: Any, ttl: float) -> Any:
        if self.down:
            raise StoreUnavailable("the test cut the store")
        return self._store.renew(leases, ttl)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def app(store: Any, gates: Gates, clock: Clock) -> Iterator[Celery]:
    app = memory_app("hooks", fence_store_url=store.url, fence_lease_ttl=TTL, fence_recover=False)

    @app.task(base=FencedTask, bind=True, fence_key="k:{n}", name="hooks.keyed", shared=False)
    def keyed(self: Any, n: int, tag: str, wait: bool = False) -> str:
        copies = self.request.retries + (getattr(self.request, "fence_resends", None) or 0)
        gates.entered.add(f"{tag}:{copies}")
        if wait:
            gates.wait(tag)
        self.fence.check()
        return f"done by {tag}"

    runtime = runtime_for(app)
    runtime._store = Unreachable(store)
    runtime._renewer = Renewer(runtime._store, runtime.config.policy.interval, clock=clock)
    with running_worker(app, pool="threads", concurrency=3):
        yield app
    for tag in list(gates.entered):
        gates.open(tag.split(":")[0])
    runtime._store = None  # the harness closes the store itself
    runtime.close()


class Seen:
    """The Celery and celery-fence signals fired for one task id."""

    def __init__(self, task_id: str) -> None:
        self.task_id, self.fired = task_id, []

    def __call__(self, signal: Any = None, sender: Any = None, task_id: str = "", **kw: Any) -> None:
        request_id = task_id or getattr(getattr(sender, "request", None), "id", None)
        if task_id == self.task_id or (not task_id and request_id == self.task_id):
            self.fired.append(signal.name)

    def hooks(self) -> list[str]:
        return [name for name in self.fired if name != "task_postrun"]


@pytest.fixture
def hooks() -> Iterator[list[Seen]]:
    watching: list[Seen] = []

    def watch(signal: Any = None, sender: Any = None, **kw: Any) -> None:
        for seen in watching:
            seen(signal=signal, sender=sender, **kw)

    for signal in (task_success, task_failure, task_postrun, lease_lost):
        signal.connect(watch, weak=False)
    yield watching
    for signal in (task_success, task_failure, task_postrun, lease_lost):
        signal.disconnect(watch)


def _start_a(n: int, app: Celery, gates: Gates, hooks: list[Seen]) -> tuple[Any, Any, Seen]:
    """Run ``A`` on key ``k:n``, watched by ``hooks``, until it waits in its body."""
    keyed, a_id = app.tasks["hooks.keyed"], str(uuid.uuid4())
    hooks.append(seen := Seen(a_id))
    a = keyed.apply_async((n, "A"), {"wait": True}, task_id=a_id)
    wait_for(lambda: "A:0" in gates.entered, what="A in its body")
    return keyed, a, seen


def test_a_refused_run_fires_neither_task_success_nor_task_failure_and_lease_lost_fires_on_loss(
    app: Celery, store: Any, harness: Harness, gates: Gates, clock: Clock, hooks: list[Seen]
) -> None:
    keyed, a, seen = _start_a(1, app, gates, hooks)
    harness.expire_all(store)  # A stalls past its lease; the broker's copy (same id) takes over, finishes
    assert keyed.apply_async((1, "B"), task_id=a.id).get(timeout=30) == "done by B"
    assert seen.hooks() == ["task_success"]  # the copy's
    clock.offset += TTL / 3  # A's renew is due: the store refuses it (token superseded)
    runtime_for(app).renewer.tick()
    assert seen.hooks() == ["task_success", "lease_lost"]
    gates.open("A")
    wait_for(lambda: seen.fired.count("task_postrun") == 2, what="A's run to end")
    assert "refused" in [e.event for e in store.history("k:1")]
    assert a.get(timeout=30) == "done by B"  # the copy's SUCCESS, never overwritten
    assert seen.hooks() == ["task_success", "lease_lost"]  # nothing more for the refused run
    assert [e.event for e in store.history("k:1")].count("complete") == 1


def test_a_run_whose_lease_only_lapsed_sends_itself_again_with_recovery_off(
    app: Celery, store: Any, gates: Gates, clock: Clock, hooks: list[Seen]
) -> None:
    _, a, seen = _start_a(2, app, gates, hooks)
    runtime = runtime_for(app)
    runtime._store.down = True  # its renews fail until the local deadline: lost, nobody took over
    clock.offset += TTL
    runtime.renewer.tick()
    runtime._store.down = False
    assert seen.hooks() == ["lease_lost"]
    gates.open("A")  # check() raises LeaseLost; the store shows A's own token unfinished: re-queued
    assert a.get(timeout=30) == "done by A"
    assert "A:1" in gates.entered  # the copy (same id) ran the body: the work was not dropped
    events = [e.event for e in store.history("k:2")]
    assert events.count("complete") == 1 and events[0] == "acquire"
    wait_for(lambda: seen.fired.count("task_postrun") == 2, what="both runs to end")
    assert seen.hooks() == ["lease_lost", "task_success"]  # the re-queued run fired nothing


def test_a_lapsed_run_at_max_retries_is_sent_again_without_spending_a_retry(
    app: Celery, store: Any, gates: Gates, clock: Clock, hooks: list[Seen]
) -> None:
    """The fence's own re-send of a refused run nobody took over spends none of the task's max_retries:
    at max_retries the run is still sent again, not ended Ignore with its lease released (an operator's
    release leaves none to expire, so nothing would ever run the key again)."""
    keyed, a, _seen = _start_a(5, app, gates, hooks)
    keyed.max_retries = 0  # a re-queue as a retry would be past max_retries
    runtime = runtime_for(app)
    runtime._store.down = True
    clock.offset += TTL
    runtime.renewer.tick()
    runtime._store.down = False
    try:
        gates.open("A")
        assert a.get(timeout=30) == "done by A"
    finally:
        keyed.max_retries = 3
    assert "A:1" in gates.entered  # the copy ran the body
    assert [e.event for e in store.history("k:5")].count("complete") == 1


def test_an_operators_release_of_a_run_with_no_retries_left_runs_the_key_again(
    app: Celery, store: Any, gates: Gates, hooks: list[Seen]
) -> None:
    """An operator's `celery fence release KEY` fences the run out; the run sends itself again though
    max_retries is 0, and the key ends done once."""
    keyed, a, _seen = _start_a(6, app, gates, hooks)
    keyed.max_retries = 0
    try:
        store.force_release("k:6")
        gates.open("A")
        assert a.get(timeout=30) == "done by A"
    finally:
        keyed.max_retries = 3
    state = store.get("k:6")
    assert state is not None and state.done and state.result == "done by A"
    assert [e.event for e in store.history("k:6")].count("complete") == 1


def test_a_run_the_fence_sent_again_fence_max_resends_times_gives_up_with_a_record(
    app: Celery, store: Any, gates: Gates, hooks: list[Seen]
) -> None:
    """The fence's re-sends are bounded (fence_max_resends) and giving up is never silent: FAILURE with
    GaveUp, and the key marked given up in the store."""
    from celery_fence import GaveUp

    runtime = runtime_for(app)
    runtime.config = dataclasses.replace(runtime.config, max_resends=0)  # read when a run starts
    _keyed, a, _seen = _start_a(7, app, gates, hooks)
    store.force_release("k:7")
    gates.open("A")
    with pytest.raises(GaveUp):
        a.get(timeout=30)
    state = store.get("k:7")
    assert state is not None and not state.done and state.dead
    assert "gave up" in (state.dead or "")


def test_on_busy_retry_looks_again_sooner_than_the_holders_ttl_without_spending_retries(
    app: Celery, store: Any, gates: Gates
) -> None:
    """A run of another task id finding the key held shows RETRY, is sent again after
    a renew interval (not the holder's whole ttl) with its retries unspent, and ends with the winner's
    result once the holder finishes; after fence_busy_wait it gives up with LeaseHeld."""
    keyed = app.tasks["hooks.keyed"]
    holder = store.acquire("k:3", "someone-else", TTL)  # held elsewhere
    published: list[dict[str, Any]] = []

    def on_publish(headers: dict[str, Any] | None = None, **_: Any) -> None:
        published.append(dict(headers or {}))

    before_task_publish.connect(on_publish, weak=False)
    keyed.fence_lease_ttl = SHORT_TTL  # its looks come a renew interval apart: 1 s, not the holder's 30 s
    try:
        keyed.max_retries = 0
        b = keyed.delay(3, "B")
        wait_for(lambda: b.state == "RETRY", what="B to show RETRY")
        again = next(h for h in published if h.get("id") == b.id and h.get("fence_looks") == 1)
        countdown = time.mktime(time.strptime(again["eta"][:19], "%Y-%m-%dT%H:%M:%S")) - time.mktime(
            time.gmtime()
        )
        assert again["retries"] == 0 and again["fence_busy_since"] > 0
        assert countdown <= LeasePolicy(SHORT_TTL).interval + 1  # not the holder's 30 s
        store.complete(holder, "the winner's")  # the holder finishes: B ends with its result
        assert b.get(timeout=60) == "the winner's"
        runtime = runtime_for(app)
        runtime.config = dataclasses.replace(runtime.config, busy_wait=0.0)
        store.acquire("k:8", "someone-else", TTL)
        c = keyed.delay(8, "C")
        with pytest.raises(LeaseHeld):  # fence_busy_wait spent: FAILURE with the LeaseHeld
            c.get(timeout=30)
    finally:
        before_task_publish.disconnect(on_publish)
        keyed.max_retries = 3
        del keyed.fence_lease_ttl  # the class's again
    assert not any(tag.startswith(("B:", "C:")) for tag in gates.entered)  # no body ran


def test_on_busy_ignore_runs_nothing_and_ends_ready_with_lease_held(
    app: Celery, store: Any, gates: Gates
) -> None:
    keyed = app.tasks["hooks.keyed"]
    keyed.fence_on_busy = "ignore"
    store.acquire("k:4", "someone-else", TTL)
    absorbed: list[str] = []

    def on_duplicate(sender: Any = None, reason: str = "", **_: Any) -> None:
        absorbed.append(reason)

    lease_duplicate.connect(on_duplicate, weak=False)
    try:
        with pytest.raises(LeaseHeld, match="someone-else"):
            keyed.delay(4, "D").get(timeout=30)
    finally:
        lease_duplicate.disconnect(on_duplicate)
        keyed.fence_on_busy = None
    assert absorbed == ["held"] and not any(tag.startswith("D:") for tag in gates.entered)
