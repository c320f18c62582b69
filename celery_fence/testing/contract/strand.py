"""``strand``: the record of a run that gave up before it acquired (it waited out an unavailable store), on
every store. Only a free key is marked (new, or released and not done); a finished or leased key, live or
expired, is left as it is; the next acquire starts a normal run."""

from __future__ import annotations

from typing import Any

import pytest

from celery_fence import InvalidArgument, NotSerializable, StaleToken
from celery_fence.stores.base import AdminStore, AuditStore, RecoveryStore
from celery_fence.verify import verify_store

from .checks import TTL, abandon, keys_in_one_scope, refused_cleanly

RUN = {"task": "shop.charge", "id": "t-1", "args": [7], "kwargs": {"currency": "EUR"}}
REQUIRES = (RecoveryStore, AuditStore, AdminStore)
REASON = "shop.charge[t-1] gave up waiting out the unavailable store"


def _last(store: Any, key: str) -> tuple[Any, ...]:
    event = store.history(key)[-1]
    return event.event, event.token, event.owner, event.detail


def test_a_new_key_is_marked_dead_with_token_0_and_the_run_kept(fence_contract_store: Any) -> None:
    store = fence_contract_store
    assert store.strand("k", RUN, REASON) is True
    state = store.get("k")
    assert (state.token, state.owner, state.expires_in, state.done) == (0, None, None, False)
    assert state.dead == REASON
    assert state.run == RUN
    events = [(e.event, e.token, e.owner, e.detail) for e in store.history("k")]
    assert events == [("gave-up", 0, None, REASON)]
    assert [s.key for s in store.leases()] == ["k"]
    assert store.abandoned(0.0) == []  # nothing for recovery: no lease ever expired
    assert verify_store(store) == []


def test_a_released_key_keeps_its_token_and_loses_its_owner(fence_contract_store: Any) -> None:
    store = fence_contract_store
    lease = store.acquire("k", "a", TTL, {"task": "shop.charge", "id": "t-0", "args": [], "kwargs": {}})
    store.release(lease)
    assert store.strand("k", RUN, REASON) is True
    state = store.get("k")
    assert (state.token, state.owner, state.expires_in, state.dead, state.run) == (
        lease.token,
        None,
        None,
        REASON,
        RUN,
    )
    assert _last(store, "k") == ("gave-up", lease.token, None, REASON)
    with pytest.raises(StaleToken):  # the released lease stays fenced out
        store.complete(lease, "late")
    assert verify_store(store) == []


def test_a_stranded_key_can_be_stranded_again(fence_contract_store: Any) -> None:
    store = fence_contract_store
    assert store.strand("k", RUN, "first") is True
    assert store.strand("k", None, "second") is True
    state = store.get("k")
    assert (state.token, state.dead, state.run) == (0, "second", None)
    assert [e.detail for e in store.history("k")] == ["first", "second"]


def test_a_finished_key_is_left_alone(fence_contract_store: Any) -> None:
    store = fence_contract_store
    store.complete(store.acquire("k", "a", TTL), "ok")
    before = store.get("k"), store.history("k")
    assert store.strand("k", RUN, REASON) is False
    assert (store.get("k"), store.history("k")) == before


def test_a_live_lease_is_left_alone(fence_contract_store: Any) -> None:
    store = fence_contract_store
    lease = store.acquire("k", "a", TTL)
    history = store.history("k")
    assert store.strand("k", RUN, REASON) is False
    state = store.get("k")
    assert (state.token, state.owner, state.dead) == (lease.token, "a", None)
    assert store.history("k") == history
    store.complete(lease, "ok")  # still the holder's


def test_an_expired_lease_is_left_to_recovery(fence_contract_store: Any, fence_contract_expire: Any) -> None:
    store, expire = fence_contract_store, fence_contract_expire
    lease = store.acquire("k", "a", TTL, {"task": "t", "id": "1", "args": [], "kwargs": {}})
    expire()
    history = store.history("k")
    assert store.strand("k", RUN, REASON) is False
    assert store.get("k").dead is None and store.history("k") == history
    assert [(seen.key, seen.token) for seen in store.abandoned(0.0)] == [("k", lease.token)]


def test_a_key_recovery_marked_dead_is_left_alone(
    fence_contract_store: Any, fence_contract_expire: Any
) -> None:
    store, expire = fence_contract_store, fence_contract_expire
    seen = abandon(store, expire)
    assert store.recover(seen, max_recoveries=0, reason="lost") == 0
    assert store.strand("k", RUN, REASON) is False
    assert store.get("k").dead == "lost"


@pytest.mark.parametrize("key", ["", "x" * 1025, None, 7, b"k", "a\x00b", "\ud800"])
def test_a_bad_key_is_refused_and_changes_nothing(fence_contract_seeded: Any, key: Any) -> None:
    store, _ = fence_contract_seeded
    refused_cleanly(store, lambda: store.strand(key, RUN, REASON), InvalidArgument)


@pytest.mark.parametrize("reason", [None, 7, b"why", "a\x00b", "\ud800"])
def test_a_bad_reason_is_refused_and_changes_nothing(fence_contract_seeded: Any, reason: Any) -> None:
    store, _ = fence_contract_seeded
    refused_cleanly(store, lambda: store.strand("new", RUN, reason), InvalidArgument)


def test_a_run_json_cannot_carry_is_refused_and_changes_nothing(fence_contract_seeded: Any) -> None:
    store, _ = fence_contract_seeded
    run = {"task": "t", "id": "1", "args": [object()], "kwargs": {}}
    refused_cleanly(store, lambda: store.strand("new", run, REASON), NotSerializable)


def test_the_run_is_kept_as_acquire_keeps_it(fence_contract_store: Any) -> None:
    """Over the store's limit for a run record (etcd's), both keep it without its arguments, saying why."""
    store = fence_contract_store
    big = {"task": "t", "id": "1", "args": ["x" * 600_000], "kwargs": {}}
    store.complete(store.acquire("acquired", "a", TTL, big), "ok")
    assert store.strand("k", big, REASON) is True
    assert store.get("k").run == store.get("acquired").run


def test_the_next_acquire_clears_dead_and_runs_normally(
    fence_contract_store: Any, fence_contract_harness: Any
) -> None:
    store, harness = fence_contract_store, fence_contract_harness
    [name] = keys_in_one_scope(harness, "other", 1, like="k")  # its token ordered with k's
    other = store.acquire(name, "a", TTL)  # a token was issued before
    assert store.strand("k", RUN, REASON) is True
    lease = store.acquire("k", "b", TTL, {"task": "t", "id": "2", "args": [], "kwargs": {}})
    assert lease.token > other.token and lease.taken_over is False
    state = store.get("k")
    assert (state.token, state.owner, state.dead, state.done) == (lease.token, "b", None, False)
    assert state.run == {"task": "t", "id": "2", "args": [], "kwargs": {}}
    assert store.renew([lease], TTL) == []
    store.save_step(lease, "s", 1)
    store.complete(lease, "ok")
    assert [e.event for e in store.history("k")] == ["gave-up", "acquire", "step", "complete"]
    assert verify_store(store) == []
    assert store.prune(0.0) >= 1 and store.get("k") is None


def test_an_admin_release_of_a_stranded_key_issues_a_new_token(fence_contract_store: Any) -> None:
    store = fence_contract_store
    assert store.strand("k", RUN, REASON) is True
    token = store.force_release("k")
    assert token > 0 and store.get("k").token == token
    assert verify_store(store) == []
