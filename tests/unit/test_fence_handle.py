"""The per-run handle ``self.fence``: local loss check, the SQL-only transaction, checkpointed steps."""

from __future__ import annotations

from typing import Any

import pytest

from celery_fence.errors import ConfigurationError, LeaseLost, StaleToken
from celery_fence.fence import Fence
from celery_fence.lease import Lease
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import FakeClock


class Counter:
    """A step function that counts its calls and returns what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append((args, kwargs))
        return kwargs.get("value", args[0] if args else None)


@pytest.fixture
def fence(store: MemoryStore) -> Fence:
    return Fence(store, store.acquire("order:1", "first", 30))


def take_over(store: MemoryStore, clock: FakeClock, key: str = "order:1") -> Fence:
    clock.advance(31)
    return Fence(store, store.acquire(key, "second", 30))


def test_the_handle_shows_its_lease_key_token_and_owner(fence: Fence) -> None:
    assert (fence.key, fence.token) == ("order:1", 1)
    assert fence.lease.owner == "first"


def test_check_passes_while_held(fence: Fence) -> None:
    fence.check()
    assert fence.lost is False and fence.lost_reason is None
    assert "held" in repr(fence)


def test_check_raises_lease_lost_after_mark_lost(fence: Fence) -> None:
    fence.mark_lost("renew refused")
    assert fence.lost is True and fence.lost_reason == "renew refused"
    with pytest.raises(LeaseLost) as info:
        fence.check()
    assert (info.value.key, info.value.token, info.value.reason) == ("order:1", 1, "renew refused")
    with pytest.raises(LeaseLost):
        fence.check()  # stays lost
    assert "renew refused" in repr(fence)


def test_transaction_needs_a_sql_store(fence: Fence) -> None:
    entered = False
    with pytest.raises(ConfigurationError, match="fenced_update") as info, fence.transaction():
        entered = True
    assert not entered
    assert "memory://" in str(info.value)


def test_step_runs_once_and_returns_the_stored_value(fence: Fence, store: MemoryStore) -> None:
    fn = Counter()
    assert fence.step("total", fn, 41, value=42) == 42
    assert fence.step("total", fn, 99, value=100) == 42
    assert fn.calls == [((41,), {"value": 42})]
    assert store.steps("order:1") == {"total": 42}
    assert [e.event for e in store.history("order:1")] == ["acquire", "step"]


def test_distinct_steps_each_run(fence: Fence, store: MemoryStore) -> None:
    fn = Counter()
    assert fence.step("a", fn, 1) == 1
    assert fence.step("b", fn, 2) == 2
    assert len(fn.calls) == 2
    assert store.steps("order:1") == {"a": 1, "b": 2}


def test_a_takeover_resumes_after_the_committed_steps(
    fence: Fence, store: MemoryStore, clock: FakeClock
) -> None:
    fn = Counter()
    fence.step("charged", fn, "ch_123")
    successor = take_over(store, clock)
    assert successor.token > fence.token
    assert successor.step("charged", fn, "ch_999") == "ch_123"
    assert successor.step("mailed", fn, True) is True
    assert fn.calls == [(("ch_123",), {}), ((True,), {})]


def test_values_are_json_normalised_both_times(fence: Fence, store: MemoryStore, clock: FakeClock) -> None:
    first = fence.step("pair", lambda: (1, (2, 3)))
    second = fence.step("pair", lambda: (9, 9))
    resumed = take_over(store, clock).step("pair", lambda: (9, 9))
    assert first == second == resumed == [1, [2, 3]]
    assert isinstance(first, list)


def test_dict_keys_come_back_as_strings(fence: Fence) -> None:
    assert fence.step("map", lambda: {1: "one"}) == {"1": "one"}


def test_a_stale_step_is_refused_and_not_stored(fence: Fence, store: MemoryStore, clock: FakeClock) -> None:
    take_over(store, clock)
    fn = Counter()
    with pytest.raises(StaleToken) as info:
        fence.step("late", fn, "stale value")
    assert len(fn.calls) == 1  # the body ran; only its commit was refused
    assert (info.value.token, info.value.current) == (1, 2)
    assert "late" not in store.steps("order:1")
    refused = [e for e in store.history("order:1") if e.event == "refused"]
    assert [(e.token, e.detail) for e in refused] == [(1, "step late")]


def test_a_stale_step_after_a_takeover_wrote_it_still_refuses(
    fence: Fence, store: MemoryStore, clock: FakeClock
) -> None:
    fence.step("seen", lambda: None)  # loads the step cache before the takeover
    successor = take_over(store, clock)
    successor.step("total", lambda: 2)
    with pytest.raises(StaleToken):
        fence.step("total", lambda: 1)
    assert store.steps("order:1") == {"seen": None, "total": 2}


def test_a_step_of_an_expired_lease_nobody_took_commits(
    fence: Fence, store: MemoryStore, clock: FakeClock
) -> None:
    clock.advance(300)
    assert fence.step("late but current", lambda: 5) == 5
    assert store.steps("order:1") == {"late but current": 5}


def test_check_self_fences_at_the_local_deadline_even_if_the_renewer_is_stuck() -> None:
    import time

    store = MemoryStore(clock=FakeClock())
    deadline = [time.monotonic() + 3600.0]

    class StuckRenewer:  # a renewer whose deadline the test moves
        def deadline(self, lease: Lease) -> float:
            return deadline[0]

        def pin(self, lease: Lease) -> None: ...
        def unpin(self, lease: Lease) -> None: ...

    fence = Fence(store, store.acquire("k", "w", 30.0), StuckRenewer())
    fence.check()  # well before the deadline
    deadline[0] = time.monotonic() - 0.001  # the renewer never got an answer in time
    with pytest.raises(LeaseLost, match="local deadline"):
        fence.check()
    assert fence.lost
