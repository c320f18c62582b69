"""The renewer, one ``tick()`` at a time: one round trip per ttl; loss reported once, never silently.

The thread is never started (``_ensure_thread`` is a no-op here). Two fake clocks: the store's (``clock``,
which decides expiry) and the renewer's monotonic one (``mono``, which decides local deadlines).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import pytest

from celery_fence._runtime import Renewer
from celery_fence.errors import InvalidArgument, StoreUnavailable
from celery_fence.lease import Lease, LeasePolicy
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import FakeClock

TAKEN_OVER = "renew refused: the lease was taken over or released"
OVERDUE = "no successful renew before the local deadline"


class Calls:
    """Wraps ``store.renew``: records each call; can be told to fail."""

    def __init__(self, store: MemoryStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = store.renew
        self.log: list[tuple[list[Lease], float]] = []
        self.fail: Exception | None = None
        self.during: Any = None  # runs inside the call (e.g. moves the monotonic clock)
        monkeypatch.setattr(store, "renew", self)

    def __call__(self, leases: Sequence[Lease], ttl: float) -> list[Lease]:
        self.log.append((list(leases), ttl))
        if self.during is not None:
            self.during()
        if self.fail is not None:
            raise self.fail
        return self.real(leases, ttl)


class Lost:
    """An ``on_lost`` callback that records what it was told."""

    def __init__(self) -> None:
        self.seen: list[tuple[Lease, str]] = []

    def __call__(self, lease: Lease, reason: str) -> None:
        self.seen.append((lease, reason))


@pytest.fixture
def calls(store: MemoryStore, monkeypatch: pytest.MonkeyPatch) -> Calls:
    return Calls(store, monkeypatch)


def test_a_lease_acquired_under_half_an_interval_ago_is_not_renewed_yet(
    store: MemoryStore, renewer: Renewer, mono: FakeClock, calls: Calls
) -> None:
    """A task shorter than half the renew interval costs no renew at all."""
    hold(store, renewer, mono, "fresh")
    mono.advance(4.9)
    renewer.tick()
    assert calls.log == []
    mono.advance(0.1)
    renewer.tick()
    assert [lease.key for lease in calls.log[0][0]] == ["fresh"]


def hold(
    store: MemoryStore, renewer: Renewer, mono: FakeClock, key: str, ttl: float = 30.0, on_lost: Any = None
) -> Lease:
    lease = store.acquire(key, f"owner-of-{key}", ttl)
    renewer.track(lease, LeasePolicy(ttl), mono(), on_lost or Lost())
    return lease


@pytest.mark.parametrize("count", [1, 100, 10_000])
def test_one_renew_call_per_tick_for_any_number_of_leases(
    store: MemoryStore, clock: FakeClock, renewer: Renewer, mono: FakeClock, calls: Calls, count: int
) -> None:
    leases = [hold(store, renewer, mono, f"k{i}") for i in range(count)]
    clock.advance(20)
    mono.advance(10)
    renewer.tick()
    assert len(calls.log) == 1
    assert renewer.round_trips == 1
    sent, ttl = calls.log[0]
    assert sorted(sent, key=lambda lease: lease.token) == leases
    assert ttl == 30.0
    state = store.get(leases[-1].key)
    assert state is not None and state.expires_in == pytest.approx(30.0)  # renewed from the store's now
    renewer.tick()
    assert len(calls.log) == 1  # just renewed: not due yet
    mono.advance(10)
    renewer.tick()
    assert len(calls.log) == 2 and renewer.round_trips == 2


def test_one_renew_call_per_distinct_ttl(
    store: MemoryStore, renewer: Renewer, mono: FakeClock, calls: Calls
) -> None:
    by_ttl = {
        ttl: [hold(store, renewer, mono, f"{ttl}-{i}", ttl) for i in range(3)] for ttl in (6.0, 30.0, 90.0)
    }
    mono.advance(15.0)  # due, even for ttl 90 (interval 30)
    renewer.tick()
    assert renewer.round_trips == 3
    assert {ttl: sorted(sent, key=lambda lease: lease.token) for sent, ttl in calls.log} == by_ttl


def test_nothing_tracked_means_no_round_trip(renewer: Renewer, calls: Calls) -> None:
    renewer.tick()
    assert calls.log == [] and renewer.round_trips == 0


def test_track_lowers_the_interval_to_the_shortest_policy(
    store: MemoryStore, renewer: Renewer, mono: FakeClock
) -> None:
    hold(store, renewer, mono, "a", ttl=60.0)
    assert renewer.interval == 10.0
    hold(store, renewer, mono, "b", ttl=6.0)
    assert renewer.interval == pytest.approx(2.0)


def test_a_taken_over_lease_is_reported_lost_once(
    store: MemoryStore, clock: FakeClock, renewer: Renewer, mono: FakeClock, calls: Calls
) -> None:
    lost, kept = Lost(), Lost()
    mine = hold(store, renewer, mono, "k", on_lost=lost)
    other = hold(store, renewer, mono, "other", on_lost=kept)
    clock.advance(31)  # the store expires "k" ...
    thief = store.acquire("k", "thief", 30)  # ... and someone takes it over
    assert thief.token > mine.token
    calls.real([other], 30)  # "other" stays live (not counted)
    mono.advance(5.0)  # due: half an interval since the acquire
    renewer.tick()
    assert lost.seen == [(mine, TAKEN_OVER)]
    assert renewer.held() == [other]
    assert kept.seen == []
    renewer.tick()
    renewer.tick()
    assert lost.seen == [(mine, TAKEN_OVER)]
    assert all(mine not in sent for sent, _ in calls.log[1:])
    state = store.get("k")
    assert state is not None and state.token == thief.token and state.owner == "thief"


def test_a_released_lease_is_reported_lost(store: MemoryStore, renewer: Renewer, mono: FakeClock) -> None:
    lost = Lost()
    lease = hold(store, renewer, mono, "k", on_lost=lost)
    store.release(lease)
    mono.advance(5.0)  # due: half an interval since the acquire
    renewer.tick()
    assert lost.seen == [(lease, TAKEN_OVER)]
    assert renewer.held() == []


def test_an_unreachable_store_keeps_leases_until_the_local_deadline(
    store: MemoryStore, renewer: Renewer, mono: FakeClock, calls: Calls
) -> None:
    lost = Lost()
    lease = hold(store, renewer, mono, "k", ttl=30.0, on_lost=lost)  # sent at 0: deadline 27
    calls.fail = StoreUnavailable("connection refused")
    for now in (10.0, 20.0, 26.9):
        mono.advance(now - mono())
        renewer.tick()
        assert lost.seen == [] and renewer.held() == [lease]
    mono.advance(27.0 - mono())
    renewer.tick()
    assert lost.seen == [(lease, OVERDUE)]
    assert renewer.held() == []
    renewer.tick()
    assert lost.seen == [(lease, OVERDUE)]
    assert renewer.round_trips == 4  # no renew once nothing is tracked


def test_a_failing_store_keeps_leases_too(
    store: MemoryStore, renewer: Renewer, mono: FakeClock, calls: Calls
) -> None:
    """Any FenceError from renew (not only StoreUnavailable) is survived until the local deadline."""
    lost = Lost()
    lease = hold(store, renewer, mono, "k", on_lost=lost)
    calls.fail = InvalidArgument("refused")
    mono.advance(20)
    renewer.tick()
    assert lost.seen == []
    mono.advance(7)
    renewer.tick()
    assert lost.seen == [(lease, OVERDUE)]


def test_a_successful_renew_moves_the_deadline_from_when_it_was_sent(
    store: MemoryStore, renewer: Renewer, mono: FakeClock, calls: Calls
) -> None:
    lost = Lost()
    lease = hold(store, renewer, mono, "k", ttl=30.0, on_lost=lost)  # deadline 27
    mono.advance(20.0)
    calls.during = lambda: mono.advance(5.0)  # the reply takes 5 s: sent at 20, answered at 25
    renewer.tick()  # new deadline: 20 + 30 - 3 = 47, not 52
    calls.during = None
    calls.fail = StoreUnavailable("down")
    mono.advance(30.0 - mono())
    renewer.tick()  # past the old deadline: still held
    assert lost.seen == []
    mono.advance(46.9 - mono())
    renewer.tick()
    assert lost.seen == []
    mono.advance(47.0 - mono())
    renewer.tick()
    assert lost.seen == [(lease, OVERDUE)]


def test_a_raising_callback_does_not_stop_the_others(
    store: MemoryStore, clock: FakeClock, renewer: Renewer, mono: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    def explode(lease: Lease, reason: str) -> None:
        raise RuntimeError("callback bug")

    second = Lost()
    first_lease = hold(store, renewer, mono, "a", on_lost=explode)
    second_lease = hold(store, renewer, mono, "b", on_lost=second)
    clock.advance(31)
    store.acquire("a", "thief", 30)
    store.acquire("b", "thief", 30)
    mono.advance(5.0)  # due: half an interval since the acquire
    renewer.tick()
    assert second.seen == [(second_lease, TAKEN_OVER)]
    assert renewer.held() == []
    assert any("callback failed" in r.getMessage() and r.exc_info for r in caplog.records)
    assert first_lease not in renewer.held()


def test_a_renew_failure_is_logged_not_silent(
    store: MemoryStore, renewer: Renewer, mono: FakeClock, calls: Calls, caplog: pytest.LogCaptureFixture
) -> None:
    hold(store, renewer, mono, "k")
    calls.fail = StoreUnavailable("down")
    mono.advance(5.0)  # due: half an interval since the acquire
    renewer.tick()
    assert any("renew" in r.getMessage() and "down" in r.getMessage() for r in caplog.records)


def test_untrack_stops_renewing(
    store: MemoryStore, clock: FakeClock, renewer: Renewer, mono: FakeClock, calls: Calls
) -> None:
    lost = Lost()
    gone = hold(store, renewer, mono, "gone", on_lost=lost)
    kept = hold(store, renewer, mono, "kept")
    renewer.untrack(gone)
    renewer.untrack(gone)  # twice is harmless
    assert renewer.held() == [kept]
    clock.advance(20)
    mono.advance(5.0)  # due: half an interval since the acquire
    renewer.tick()
    assert calls.log == [([kept], 30.0)]
    gone_state = store.get("gone")
    assert gone_state is not None and gone_state.expires_in == pytest.approx(10.0)  # not renewed
    mono.advance(100)
    calls.fail = StoreUnavailable("down")
    renewer.tick()
    assert lost.seen == []  # an untracked lease is never reported


def test_an_unexpected_renew_error_still_expires_leases_locally(
    store: MemoryStore, renewer: Renewer, mono: FakeClock, calls: Calls
) -> None:
    lost = Lost()
    lease = hold(store, renewer, mono, "k", on_lost=lost)
    calls.fail = RuntimeError("untranslated driver error")
    mono.advance(27)
    with contextlib.suppress(RuntimeError):  # what the thread's _run does with it
        renewer.tick()
    assert lost.seen == [(lease, OVERDUE)]
