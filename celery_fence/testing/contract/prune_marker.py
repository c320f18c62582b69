"""Prune leaves a marker (issue 13, point 5), on every store: a pruned key's history becomes one ``pruned``
event, so ``verify`` can tell when a redelivered message runs a finished key again; a later prune drops old
markers, so they stay bounded."""

from __future__ import annotations

from typing import Any

from celery_fence.stores.base import AdminStore, AuditStore
from celery_fence.verify import verify_store

from .checks import TTL

REQUIRES = (AdminStore, AuditStore)


def finish(store: Any, key: str) -> int:
    lease = store.acquire(key, "w", TTL)
    store.save_step(lease, "s", 1)
    store.complete(lease, 1)
    token: int = lease.token
    return token


def test_prune_leaves_one_marker_per_pruned_key(fence_contract_store: Any) -> None:
    store = fence_contract_store
    tokens = {key: finish(store, key) for key in ("a", "b")}
    live = store.acquire("live", "w", TTL)
    assert store.prune(0.0) == len(tokens)
    for key, token in tokens.items():
        [marker] = store.history(key)
        assert (marker.event, marker.token, marker.owner, marker.key) == ("pruned", token, None, key)
        assert store.get(key) is None and store.steps(key) == {}
    assert [e.event for e in store.history("live")] == ["acquire"]
    assert sorted(e.key for e in store.history() if e.event == "pruned") == ["a", "b"]
    assert verify_store(store) == []
    store.complete(live, 2)


def test_an_acquire_after_the_prune_is_a_violation(fence_contract_store: Any) -> None:
    store = fence_contract_store
    token = finish(store, "a")
    finish(store, "b")
    assert store.prune(0.0) == 2  # noqa: PLR2004
    again = store.acquire("a", "w2", TTL)  # the broker's copy of the finished run, redelivered
    assert again.token > token
    store.complete(again, 1)
    found = verify_store(store)
    assert [(v.key, v.rule) for v in found] == [("a", "reopened-after-prune")]
    assert found[0].event is not None and found[0].event.token == again.token
    assert [v.rule for v in verify_store(store, "a")] == ["reopened-after-prune"]
    assert verify_store(store, "b") == []


def test_a_later_prune_drops_markers_older_than_its_age(fence_contract_store: Any) -> None:
    store = fence_contract_store
    finish(store, "a")
    assert store.prune(0.0) == 1
    assert store.prune(3600.0) == 0
    assert [e.event for e in store.history("a")] == ["pruned"]  # younger than an hour: kept
    token = finish(store, "b")
    assert store.prune(0.0) == 1  # drops a's marker (older than 0 s), then leaves b's
    assert store.history("a") == []
    assert [(e.key, e.event, e.token) for e in store.history()] == [("b", "pruned", token)]


def test_a_key_pruned_twice_keeps_one_marker(fence_contract_store: Any) -> None:
    store = fence_contract_store
    finish(store, "a")
    assert store.prune(3600.0) == 0
    assert store.prune(0.0) == 1
    again = store.acquire("a", "w", TTL)
    store.complete(again, 2)
    assert store.prune(0.0) == 1
    [marker] = store.history("a")
    assert (marker.event, marker.token) == ("pruned", again.token)


def test_the_marker_carries_the_keys_last_token(fence_contract_store: Any) -> None:
    store = fence_contract_store
    finish(store, "a")
    admin = store.force_release("a")  # an admin release of a finished key bumps its token
    assert store.prune(0.0) == 1
    assert [(e.event, e.token) for e in store.history("a")] == [("pruned", admin)]
    assert store.acquire("a", "w", TTL).token > admin
