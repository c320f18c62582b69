"""A renew waits for a lock another client holds (SQLite's write lock) only as long as it can still land
before the lease's local deadline: the bound each renew runs under, on a fake monotonic clock."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from celery_fence._runtime import Renewer
from celery_fence.errors import StoreUnavailable
from celery_fence.lease import Lease, LeasePolicy
from celery_fence.stores.memory import MemoryStore
from celery_fence.stores.waits import LOCK_WAIT, lock_wait
from celery_fence.testing import FakeClock


class Bounds:
    """Wraps ``store.renew``: records the keys and the lock-wait bound of each call; can be told to fail."""

    def __init__(self, store: MemoryStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = store.renew
        self.seen: list[tuple[list[str], float | None]] = []
        self.fail = False
        monkeypatch.setattr(store, "renew", self)

    def __call__(self, leases: Sequence[Lease], ttl: float) -> list[Lease]:
        self.seen.append(([lease.key for lease in leases], LOCK_WAIT.get()))
        if self.fail:
            raise StoreUnavailable("the write lock is held by another process")
        return self.real(leases, ttl)


@pytest.fixture
def bounds(store: MemoryStore, monkeypatch: pytest.MonkeyPatch) -> Bounds:
    return Bounds(store, monkeypatch)


def _hold(
    store: MemoryStore, renewer: Renewer, mono: FakeClock, key: str, ttl: float, sent_at: float | None = None
) -> list[str]:
    lost: list[str] = []
    lease = store.acquire(key, "me", ttl)
    renewer.track(lease, LeasePolicy(ttl), mono() if sent_at is None else sent_at, _recorder(lost))
    return lost


def _recorder(lost: list[str]) -> Callable[[Lease, str], None]:
    return lambda _lease, why: lost.append(why)


def test_a_renew_waits_at_most_until_the_local_deadline_less_a_margin(
    store: MemoryStore, renewer: Renewer, mono: FakeClock, bounds: Bounds
) -> None:
    """ttl 10: the local deadline is 9 s after the acquire was sent; a renew keeps 0.5 s for its reply."""
    lost = _hold(store, renewer, mono, "k", 10.0)
    bounds.fail = True  # another process holds the write lock: every renew times out
    for now, bound in [(3.5, 5.0), (7.0, 1.5), (8.8, 0.0)]:
        mono.advance(now - mono())
        renewer.tick()
        assert bounds.seen[-1] == (["k"], pytest.approx(bound))
        assert lost == []  # a renew that timed out is transient: retried until the deadline
    mono.advance(0.2)
    renewer.tick()
    assert lost == ["no successful renew before the local deadline"]


def test_a_renew_that_lands_moves_the_next_bound(
    store: MemoryStore, renewer: Renewer, mono: FakeClock, bounds: Bounds
) -> None:
    _hold(store, renewer, mono, "k", 10.0)
    mono.advance(4.0)
    renewer.tick()  # renewed: the deadline is now 4 + 9
    mono.advance(4.0)
    renewer.tick()
    assert bounds.seen[-1] == (["k"], pytest.approx(13.0 - 8.0 - 0.5))


def test_the_group_whose_deadline_comes_first_is_renewed_first_under_its_own_bound(
    store: MemoryStore, renewer: Renewer, mono: FakeClock, bounds: Bounds
) -> None:
    _hold(store, renewer, mono, "long", 60.0)  # deadline 54
    mono.advance(11.0)  # "long" is due (interval 20)
    _hold(store, renewer, mono, "later", 6.0, sent_at=10.5)  # deadline 15.9
    _hold(store, renewer, mono, "sooner", 6.0, sent_at=10.0)  # deadline 15.4: the group's
    mono.advance(1.0)  # the ttl-6 group is due too
    renewer.tick()
    assert bounds.seen == [
        (["later", "sooner"], pytest.approx(15.4 - 12.0 - 0.3)),
        (["long"], pytest.approx(54.0 - 12.0 - 3.0)),
    ]


def test_the_bound_holds_only_inside_the_renew(
    store: MemoryStore, renewer: Renewer, mono: FakeClock, bounds: Bounds
) -> None:
    _hold(store, renewer, mono, "k", 10.0)
    mono.advance(4.0)
    renewer.tick()
    assert bounds.seen[-1][1] is not None
    assert LOCK_WAIT.get() is None


def test_nested_bounds_keep_the_shorter_and_none_is_below_zero() -> None:
    with lock_wait(2.0):
        with lock_wait(5.0):
            assert LOCK_WAIT.get() == 2.0
        with lock_wait(-1.0):
            assert LOCK_WAIT.get() == 0.0
        assert LOCK_WAIT.get() == 2.0
    assert LOCK_WAIT.get() is None


@pytest.mark.parametrize(
    ("ttl", "interval", "slack"),
    [(30.0, None, 30 * 0.85 - 10), (10.0, None, 10 * 0.85 - 10 / 3), (10.0, 1.0, 7.5), (3.0, None, 1.55)],
)
def test_renew_slack_is_what_a_renew_on_schedule_may_wait(
    ttl: float, interval: float | None, slack: float
) -> None:
    assert LeasePolicy(ttl, interval).renew_slack == pytest.approx(slack)
