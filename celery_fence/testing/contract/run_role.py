"""The store contract, run role: what a run needs of any store (``RunStore``), built-in or a third party's.
Every store runs these tests unchanged (its ``StoreHarness``); where a test would also read the history, it
does so only on a store that keeps one (``AuditStore``)."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from decimal import Decimal
from typing import Any

import pytest

from celery_fence import (
    AlreadyDone,
    FenceError,
    InvalidArgument,
    Lease,
    LeaseHeld,
    NotSerializable,
    StaleToken,
)
from celery_fence.stores.base import AdminStore, lacking

from .checks import TTL, audits, in_scopes

REQUIRES = ()  # the run role only: every store has it


def test_acquire_free_key(fence_contract_store: Any) -> None:
    store = fence_contract_store
    lease = store.acquire("k", "a", TTL)
    assert (lease.key, lease.owner) == ("k", "a")
    assert lease.token > 0
    state = store.get("k")
    assert (state.token, state.owner, state.done) == (lease.token, "a", False)
    assert 0 < state.expires_in <= TTL


def test_live_lease_is_held(fence_contract_store: Any) -> None:
    store = fence_contract_store
    store.acquire("k", "a", TTL)
    with pytest.raises(LeaseHeld) as info:
        store.acquire("k", "b", TTL)
    assert info.value.owner == "a"
    assert info.value.expires_in is not None and 0 < info.value.expires_in <= TTL


def test_acquire_says_whether_it_took_over(fence_contract_store: Any, fence_contract_expire: Any) -> None:
    """Every store says whether an acquire took over; how long the old lease had been expired is optional."""
    store, expire = fence_contract_store, fence_contract_expire
    first = store.acquire("k", "a", TTL)
    assert first.taken_over is False and first.expired_for is None
    store.release(first)
    assert store.acquire("k", "b", TTL).taken_over is False  # a released lease is free
    expire()
    taken = store.acquire("k", "c", TTL)
    assert taken.taken_over is True
    assert taken.expired_for is None or taken.expired_for >= 0
    assert taken == Lease("k", taken.token, "c")  # neither is identity


def test_tokens_strictly_increase_across_keys_and_takeovers(
    fence_contract_store: Any, fence_contract_expire: Any, fence_contract_harness: Any
) -> None:
    store, expire, harness = fence_contract_store, fence_contract_expire, fence_contract_harness
    issued = [(f"k{i}", store.acquire(f"k{i}", "a", TTL).token) for i in range(3)]
    expire()
    issued += [(f"k{i}", store.acquire(f"k{i}", "b", TTL).token) for i in range(3)]
    for tokens in in_scopes(harness, issued).values():  # the store's one counter, or a cluster slot's
        assert tokens == sorted(tokens)
        assert len(set(tokens)) == len(tokens)


def test_takeover_of_expired_lease_fences_the_old_holder(
    fence_contract_store: Any, fence_contract_expire: Any
) -> None:
    store, expire = fence_contract_store, fence_contract_expire
    old = store.acquire("k", "a", TTL)
    expire()
    new = store.acquire("k", "b", TTL)
    assert new.token > old.token
    with pytest.raises(StaleToken) as info:
        store.complete(old, "stale")
    assert (info.value.token, info.value.current) == (old.token, new.token)
    assert store.get("k").done is False
    store.complete(new, "fresh")
    assert (store.get("k").done, store.get("k").result) == (True, "fresh")
    if audits(store):
        events = [(e.event, e.token) for e in store.history("k")]
        assert ("takeover", new.token) in events
        assert ("refused", old.token) in events


@pytest.mark.parametrize("result", [None, 0, 1.5, "x", [1, "a", None], {"a": {"b": [True, False]}}])
def test_finished_key_answers_already_done_with_its_result(fence_contract_store: Any, result: Any) -> None:
    store = fence_contract_store
    lease = store.acquire("k", "a", TTL)
    store.complete(lease, result)
    with pytest.raises(AlreadyDone) as info:
        store.acquire("k", "b", TTL)
    assert info.value.result == result
    assert info.value.token == lease.token
    state = store.get("k")
    assert (state.done, state.result, state.expires_in) == (True, result, None)


def test_renew_keeps_current_leases_and_reports_lost_ones(
    fence_contract_store: Any, fence_contract_expire: Any, fence_contract_harness: Any
) -> None:
    store, expire, harness = fence_contract_store, fence_contract_expire, fence_contract_harness
    a = store.acquire("a", "w", TTL)
    b = store.acquire("b", "w", TTL)
    assert store.renew([a, b], TTL) == []
    expire()
    taken = store.acquire("b", "other", TTL)
    # on etcd the expired, untaken lease `a` is gone too (its lock expired with its etcd lease)
    assert store.renew([a, b], TTL) == ([b] if harness.expired_lease_survives else [a, b])
    assert store.get("a").token == a.token  # a renew never changes a token
    assert store.get("b").token == taken.token
    if audits(store):
        assert ("renew-failed", b.token) in [(e.event, e.token) for e in store.history("b")]


def test_renew_of_nothing_is_nothing(fence_contract_store: Any) -> None:
    store = fence_contract_store
    assert store.renew([], TTL) == []


def test_renew_of_a_finished_key_is_lost(fence_contract_store: Any) -> None:
    store = fence_contract_store
    lease = store.acquire("k", "a", TTL)
    store.complete(lease, 1)
    assert store.renew([lease], TTL) == [lease]


def test_expired_but_untaken_lease_is_still_current(
    fence_contract_store: Any, fence_contract_expire: Any, fence_contract_harness: Any
) -> None:
    store, expire, harness = fence_contract_store, fence_contract_expire, fence_contract_harness
    if not harness.expired_lease_survives:
        pytest.skip(f"{harness.name}: an expired lease's key is gone (documented store limit)")
    lease = store.acquire("k", "a", TTL)
    expire()
    assert store.renew([lease], TTL) == []
    store.complete(lease, "late but alone")
    assert store.get("k").result == "late but alone"


def test_release_frees_the_key_at_once(fence_contract_store: Any) -> None:
    store = fence_contract_store
    lease = store.acquire("k", "a", TTL)
    store.release(lease)
    assert store.get("k").expires_in is None
    again = store.acquire("k", "b", TTL)
    assert again.token > lease.token
    if audits(store):
        assert [e.event for e in store.history("k")][-2:] == ["release", "acquire"]


def test_stale_release_changes_nothing(fence_contract_store: Any, fence_contract_expire: Any) -> None:
    store, expire = fence_contract_store, fence_contract_expire
    old = store.acquire("k", "a", TTL)
    expire()
    new = store.acquire("k", "b", TTL)
    before = store.get("k")
    store.release(old)
    after = store.get("k")
    assert (after.token, after.owner, after.done) == (before.token, before.owner, before.done)
    assert after.expires_in is not None
    store.complete(new, "ok")


def test_released_lease_cannot_complete(fence_contract_store: Any) -> None:
    store = fence_contract_store
    lease = store.acquire("k", "a", TTL)
    store.release(lease)
    with pytest.raises(StaleToken):
        store.complete(lease, 1)
    assert store.get("k").done is False


def test_reacquire_by_the_same_owner_returns_its_lease(fence_contract_store: Any) -> None:
    """An acquire whose reply was lost is retried with the same per-acquisition owner."""
    store = fence_contract_store
    lease = store.acquire("k", "a:1:uuid", TTL)
    assert store.acquire("k", "a:1:uuid", TTL) == lease


def test_steps_commit_once_and_survive_a_takeover(
    fence_contract_store: Any, fence_contract_expire: Any
) -> None:
    store, expire = fence_contract_store, fence_contract_expire
    old = store.acquire("k", "a", TTL)
    store.save_step(old, "one", {"n": 1})
    assert store.steps("k") == {"one": {"n": 1}}
    with pytest.raises(InvalidArgument):
        store.save_step(old, "one", {"n": 2})
    expire()
    new = store.acquire("k", "b", TTL)
    with pytest.raises(StaleToken):
        store.save_step(old, "two", "stale")
    store.save_step(new, "two", [2])
    assert store.steps("k") == {"one": {"n": 1}, "two": [2]}
    if audits(store):
        assert ("step", new.token, "two") in [(e.event, e.token, e.detail) for e in store.history("k")]


def test_refuse_records_a_refusal(fence_contract_store: Any) -> None:
    store = fence_contract_store
    lease = store.acquire("k", "a", TTL)
    store.refuse(lease, "check")
    assert store.get("k").token == lease.token  # a refusal is a record: the lease is unchanged
    if audits(store):
        last = store.history("k")[-1]
        assert (last.event, last.token, last.owner, last.detail) == ("refused", lease.token, "a", "check")


def test_unknown_key(fence_contract_store: Any) -> None:
    store = fence_contract_store
    assert store.get("nobody") is None
    assert store.steps("nobody") == {}
    if audits(store):
        assert store.history("nobody") == []


BAD_KEYS = ["", "x" * 1025, None, 7, b"bytes"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_are_refused(fence_contract_store: Any, key: Any) -> None:
    store = fence_contract_store
    with pytest.raises(FenceError) as info:
        store.acquire(key, "a", TTL)
    assert isinstance(info.value, (ValueError, TypeError))
    if not lacking(store, AdminStore):
        assert store.leases() == []


@pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf, "5", True, None])
def test_bad_ttls_are_refused(fence_contract_store: Any, ttl: Any) -> None:
    store = fence_contract_store
    with pytest.raises(InvalidArgument):
        store.acquire("k", "a", ttl)
    assert store.get("k") is None


def test_bad_leases_are_refused(fence_contract_store: Any) -> None:
    store = fence_contract_store
    for bad in [None, ("k", 1), Lease("k", 0, "a"), Lease("", 1, "a")]:
        with pytest.raises(InvalidArgument):
            store.complete(bad, 1)
        with pytest.raises(InvalidArgument):
            store.renew([bad], TTL)


def test_unserializable_result_writes_nothing(fence_contract_store: Any) -> None:
    store = fence_contract_store
    lease = store.acquire("k", "a", TTL)
    before = store.history("k") if audits(store) else None
    with pytest.raises(NotSerializable):
        store.complete(lease, object())
    with pytest.raises(NotSerializable):
        store.save_step(lease, "s", {1, 2})
    assert (store.history("k") if audits(store) else None) == before
    assert store.get("k").done is False
    assert store.steps("k") == {}


def test_close_is_idempotent(fence_contract_store: Any) -> None:
    store = fence_contract_store
    store.close()
    store.close()


RICH = {
    "at": dt.datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=dt.timezone.utc),
    "day": dt.date(2026, 12, 1),
    "time": dt.time(23, 59, 58, 1),
    "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "amount": Decimal("1234.5600"),
    "raw": b"\x00\xff binary",
    "nested": [{"when": dt.date(2000, 1, 1), "ids": [uuid.UUID(int=7)], "d": Decimal("-0.1")}],
}


def test_results_and_steps_keep_the_types_celerys_json_carries(fence_contract_store: Any) -> None:
    """What a duplicate delivery returns (AlreadyDone.result) equals what the first run returned."""
    store = fence_contract_store
    lease = store.acquire("k", "a", TTL)
    store.save_step(lease, "s", RICH)
    store.complete(lease, RICH)
    with pytest.raises(AlreadyDone) as info:
        store.acquire("k", "b", TTL)
    assert info.value.result == RICH
    assert store.get("k").result == RICH
    assert store.steps("k") == {"s": RICH}
    assert type(info.value.result["at"]) is dt.datetime and type(info.value.result["raw"]) is bytes


def test_each_store_states_its_limit_and_refuses_a_bigger_value_before_writing(
    fence_contract_store: Any,
) -> None:
    store = fence_contract_store
    limit = store.max_value_bytes
    assert isinstance(limit, int) and limit >= 1024 * 1024
    lease = store.acquire("k", "a", TTL)
    too_big = "x" * limit
    with pytest.raises(NotSerializable, match="limit"):
        store.save_step(lease, "s", too_big)
    with pytest.raises(NotSerializable, match="limit"):
        store.complete(lease, too_big)
    state = store.get("k")
    assert (state.done, state.token, store.steps("k")) == (False, lease.token, {})
    if audits(store):
        assert "complete" not in [e.event for e in store.history("k")]
    store.complete(lease, "small")  # the lease was never touched: the run can still finish
    assert store.get("k").result == "small"


def test_a_value_just_under_the_stated_limit_is_stored(fence_contract_store: Any) -> None:
    """The stated limit is honest: the server itself takes a value of that size (etcd: its request limit)."""
    store = fence_contract_store
    value = "x" * (store.max_value_bytes - 1024)
    lease = store.acquire("k", "a", TTL)
    store.complete(lease, value)
    assert store.get("k").result == value


def test_nesting_deeper_than_the_codec_follows_is_invalid_argument(fence_contract_store: Any) -> None:
    store = fence_contract_store
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    lease = store.acquire("k", "a", TTL)
    with pytest.raises(InvalidArgument, match="nested too deeply"):
        store.complete(lease, deep)
    assert store.get("k").done is False
