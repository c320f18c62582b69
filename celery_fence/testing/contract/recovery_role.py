"""The store contract, recovery role (``RecoveryStore``): abandoned runs found and claimed once."""

from __future__ import annotations

from typing import Any

from celery_fence.stores.base import AuditStore, RecoveryStore

from .checks import TTL, abandon

REQUIRES = (RecoveryStore, AuditStore)


def test_abandoned_runs_are_found_and_claimed_once(
    fence_contract_store: Any, fence_contract_expire: Any
) -> None:
    store, expire = fence_contract_store, fence_contract_expire
    run = {"task": "shop.charge", "id": "t1", "args": [1], "kwargs": {}}
    lease = store.acquire("k", "a", TTL, run)
    store.acquire("live", "a", TTL)
    finished = store.acquire("done", "a", TTL)
    store.complete(finished, 1)
    assert store.abandoned(0.0) == []
    expire()
    store.acquire("live", "b", TTL)  # taken over: not abandoned
    (seen,) = store.abandoned(0.0)
    assert (seen.key, seen.token, seen.run, seen.recoveries) == ("k", lease.token, run, 0)
    assert store.recover(seen, max_recoveries=2) == 1
    assert store.recover(seen, max_recoveries=2) is None  # a second recoverer loses
    assert store.abandoned(10_000.0) == []  # recovered a moment ago: quiet for the grace period
    assert ("recovered", lease.token, "1") in [(e.event, e.token, e.detail) for e in store.history("k")]


def test_recovery_gives_up_after_the_bound(fence_contract_store: Any, fence_contract_expire: Any) -> None:
    store, expire = fence_contract_store, fence_contract_expire
    seen = abandon(store, expire)
    assert store.recover(seen, max_recoveries=0, reason="unknown task 't'") == 0
    assert store.get("k").dead == "unknown task 't'"
    assert store.abandoned(0.0) == []
    assert [e.event for e in store.history("k")][-1] == "dead"
    again = store.acquire("k", "b", TTL)  # a fresh delivery may still run a dead key
    assert store.get("k").dead is None
    store.complete(again, "ok")


def test_a_takeover_makes_a_seen_abandoned_run_stale(
    fence_contract_store: Any, fence_contract_expire: Any
) -> None:
    store, expire = fence_contract_store, fence_contract_expire
    seen = abandon(store, expire)
    store.acquire("k", "b", TTL)
    assert store.recover(seen, max_recoveries=3) is None


def test_only_a_recovery_copy_that_started_counts_against_the_bound(
    fence_contract_store: Any, fence_contract_expire: Any
) -> None:
    """A copy is counted as sent when claimed; the acquire that starts it makes it count. Copies still in
    a queue never make the key dead, however many were sent."""
    store, expire = fence_contract_store, fence_contract_expire
    store.acquire("k", "a", TTL, {"task": "t", "id": "1", "args": [], "kwargs": {}})
    expire()
    for sent in range(3):  # max_recoveries=1, yet three copies that never started
        (seen,) = store.abandoned(0.0)
        assert (seen.recoveries, seen.sent) == (0, sent)
        assert store.recover(seen, max_recoveries=1) == 1  # still attempt 1: nothing started
        assert store.recover(seen, max_recoveries=1) is None  # one recoverer wins, every time
    state = store.get("k")
    assert (state.dead, state.recoveries, state.recovery_sent) == (None, 0, 3)
    copy = store.acquire("k", "copy", TTL)  # one copy starts...
    state = store.get("k")
    assert (state.recoveries, state.recovery_sent) == (1, 0)
    assert copy.token > seen.token
    expire()  # ...and is lost: now the bound is reached
    (seen,) = store.abandoned(0.0)
    assert (seen.recoveries, seen.sent) == (1, 0)
    assert store.recover(seen, max_recoveries=1) == 0
    assert store.get("k").dead == "gave up after 1 recoveries"


def test_a_started_copy_that_completes_leaves_nothing_to_recover(
    fence_contract_store: Any, fence_contract_expire: Any
) -> None:
    store, expire = fence_contract_store, fence_contract_expire
    seen = abandon(store, expire)
    assert store.recover(seen, max_recoveries=3) == 1
    store.complete(store.acquire("k", "copy", TTL), "ok")
    assert store.abandoned(0.0) == []
    assert store.get("k").done
