"""The store contract: every store runs these tests unchanged (see harness.py)."""

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

from .checks import in_scopes

TTL = 30.0


def test_acquire_free_key(store: Any) -> None:
    lease = store.acquire("k", "a", TTL)
    assert (lease.key, lease.owner) == ("k", "a")
    assert lease.token > 0
    state = store.get("k")
    assert (state.token, state.owner, state.done) == (lease.token, "a", False)
    assert 0 < state.expires_in <= TTL


def test_live_lease_is_held(store: Any) -> None:
    store.acquire("k", "a", TTL)
    with pytest.raises(LeaseHeld) as info:
        store.acquire("k", "b", TTL)
    assert info.value.owner == "a"
    assert 0 < info.value.expires_in <= TTL


def test_acquire_says_whether_it_took_over(store: Any, expire: Any) -> None:
    """Every store says whether an acquire took over; how long the old lease had been expired is optional."""
    first = store.acquire("k", "a", TTL)
    assert first.taken_over is False and first.expired_for is None
    store.release(first)
    assert store.acquire("k", "b", TTL).taken_over is False  # a released lease is free
    expire()
    taken = store.acquire("k", "c", TTL)
    assert taken.taken_over is True
    assert taken.expired_for is None or taken.expired_for >= 0
    assert taken == Lease("k", taken.token, "c")  # neither is identity


def test_tokens_strictly_increase_across_keys_and_takeovers(store: Any, expire: Any, harness: Any) -> None:
    issued = [(f"k{i}", store.acquire(f"k{i}", "a", TTL).token) for i in range(3)]
    expire()
    issued += [(f"k{i}", store.acquire(f"k{i}", "b", TTL).token) for i in range(3)]
    for tokens in in_scopes(harness, issued).values():  # the store's one counter, or a cluster slot's
        assert tokens == sorted(tokens)
        assert len(set(tokens)) == len(tokens)


def test_takeover_of_expired_lease_fences_the_old_holder(store: Any, expire: Any) -> None:
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
    events = [(e.event, e.token) for e in store.history("k")]
    assert ("takeover", new.token) in events
    assert ("refused", old.token) in events


@pytest.mark.parametrize("result", [None, 0, 1.5, "x", [1, "a", None], {"a": {"b": [True, False]}}])
def test_finished_key_answers_already_done_with_its_result(store: Any, result: Any) -> None:
    lease = store.acquire("k", "a", TTL)
    store.complete(lease, result)
    with pytest.raises(AlreadyDone) as info:
        store.acquire("k", "b", TTL)
    assert info.value.result == result
    assert info.value.token == lease.token
    state = store.get("k")
    assert (state.done, state.result, state.expires_in) == (True, result, None)


def test_renew_keeps_current_leases_and_reports_lost_ones(store: Any, expire: Any, harness: Any) -> None:
    a = store.acquire("a", "w", TTL)
    b = store.acquire("b", "w", TTL)
    assert store.renew([a, b], TTL) == []
    expire()
    taken = store.acquire("b", "other", TTL)
    # on etcd the expired, untaken lease `a` is gone too (its lock expired with its etcd lease)
    assert store.renew([a, b], TTL) == ([b] if harness.expired_lease_survives else [a, b])
    assert store.get("a").token == a.token  # a renew never changes a token
    assert store.get("b").token == taken.token
    assert ("renew-failed", b.token) in [(e.event, e.token) for e in store.history("b")]


def test_renew_of_nothing_is_nothing(store: Any) -> None:
    assert store.renew([], TTL) == []


def test_renew_of_a_finished_key_is_lost(store: Any) -> None:
    lease = store.acquire("k", "a", TTL)
    store.complete(lease, 1)
    assert store.renew([lease], TTL) == [lease]


def test_expired_but_untaken_lease_is_still_current(store: Any, expire: Any, harness: Any) -> None:
    if not harness.expired_lease_survives:
        pytest.skip(f"{harness.name}: an expired lease's key is gone (documented store limit)")
    lease = store.acquire("k", "a", TTL)
    expire()
    assert store.renew([lease], TTL) == []
    store.complete(lease, "late but alone")
    assert store.get("k").result == "late but alone"


def test_release_frees_the_key_at_once(store: Any) -> None:
    lease = store.acquire("k", "a", TTL)
    store.release(lease)
    assert store.get("k").expires_in is None
    again = store.acquire("k", "b", TTL)
    assert again.token > lease.token
    assert [e.event for e in store.history("k")][-2:] == ["release", "acquire"]


def test_stale_release_changes_nothing(store: Any, expire: Any) -> None:
    old = store.acquire("k", "a", TTL)
    expire()
    new = store.acquire("k", "b", TTL)
    before = store.get("k")
    store.release(old)
    after = store.get("k")
    assert (after.token, after.owner, after.done) == (before.token, before.owner, before.done)
    assert after.expires_in is not None
    store.complete(new, "ok")


def test_released_lease_cannot_complete(store: Any) -> None:
    lease = store.acquire("k", "a", TTL)
    store.release(lease)
    with pytest.raises(StaleToken):
        store.complete(lease, 1)
    assert store.get("k").done is False


def test_reacquire_by_the_same_owner_returns_its_lease(store: Any) -> None:
    """An acquire whose reply was lost is retried with the same per-acquisition owner."""
    lease = store.acquire("k", "a:1:uuid", TTL)
    assert store.acquire("k", "a:1:uuid", TTL) == lease


def test_steps_commit_once_and_survive_a_takeover(store: Any, expire: Any) -> None:
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
    assert ("step", new.token, "two") in [(e.event, e.token, e.detail) for e in store.history("k")]


def test_refuse_records_a_refusal(store: Any) -> None:
    lease = store.acquire("k", "a", TTL)
    store.refuse(lease, "check")
    last = store.history("k")[-1]
    assert (last.event, last.token, last.owner, last.detail) == (
        "refused",
        lease.token,
        "a",
        "check",
    )


def test_history_is_ordered_by_store_time(store: Any, expire: Any) -> None:
    first = store.acquire("k", "a", TTL)
    expire()
    second = store.acquire("k", "b", TTL)
    store.complete(second, 1)
    events = store.history("k")
    assert [(e.event, e.token) for e in events] == [
        ("acquire", first.token),
        ("takeover", second.token),
        ("complete", second.token),
    ]
    assert all(isinstance(e.at, float) and math.isfinite(e.at) for e in events)
    assert [e.at for e in events] == sorted(e.at for e in events)
    assert {e.key for e in store.history()} >= {"k"}


def test_unknown_key(store: Any) -> None:
    assert store.get("nobody") is None
    assert store.history("nobody") == []
    assert store.steps("nobody") == {}


def test_force_release_fences_out_the_holder(store: Any) -> None:
    lease = store.acquire("k", "a", TTL)
    token = store.force_release("k")
    assert token > lease.token
    with pytest.raises(StaleToken):
        store.complete(lease, 1)
    assert store.acquire("k", "b", TTL).token > token
    with pytest.raises(InvalidArgument):
        store.force_release("nobody")


def test_prune_never_rewinds_tokens(store: Any) -> None:
    lease = store.acquire("k", "a", TTL)
    store.complete(lease, 1)
    assert store.prune(0.0) >= 1
    assert store.get("k") is None
    assert store.acquire("k", "b", TTL).token > lease.token


def test_advance_moves_the_counter_forward(store: Any) -> None:
    lease = store.acquire("a", "w", TTL)
    floor = store.advance(1000)
    assert floor >= lease.token + 1000
    assert store.acquire("b", "w", TTL).token > floor


def test_leases_lists_every_key(store: Any) -> None:
    store.acquire("b", "w", TTL)
    done = store.acquire("a", "w", TTL)
    store.complete(done, 1)
    states = {s.key: s for s in store.leases()}
    assert states["a"].done and not states["b"].done


BAD_KEYS = ["", "x" * 1025, None, 7, b"bytes"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_are_refused(store: Any, key: Any) -> None:
    with pytest.raises(FenceError) as info:
        store.acquire(key, "a", TTL)
    assert isinstance(info.value, (ValueError, TypeError))
    assert store.leases() == []


@pytest.mark.parametrize("ttl", [0, -1, math.nan, math.inf, "5", True, None])
def test_bad_ttls_are_refused(store: Any, ttl: Any) -> None:
    with pytest.raises(InvalidArgument):
        store.acquire("k", "a", ttl)
    assert store.get("k") is None


def test_bad_leases_are_refused(store: Any) -> None:
    for bad in [None, ("k", 1), Lease("k", 0, "a"), Lease("", 1, "a")]:
        with pytest.raises(InvalidArgument):
            store.complete(bad, 1)
        with pytest.raises(InvalidArgument):
            store.renew([bad], TTL)


def test_unserializable_result_writes_nothing(store: Any) -> None:
    lease = store.acquire("k", "a", TTL)
    before = store.history("k")
    with pytest.raises(NotSerializable):
        store.complete(lease, object())
    with pytest.raises(NotSerializable):
        store.save_step(lease, "s", {1, 2})
    assert store.history("k") == before
    assert store.get("k").done is False
    assert store.steps("k") == {}


def test_close_is_idempotent(store: Any) -> None:
    store.close()
    store.close()


def test_abandoned_runs_are_found_and_claimed_once(store: Any, expire: Any) -> None:
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


def test_recovery_gives_up_after_the_bound(store: Any, expire: Any) -> None:
    store.acquire("k", "a", TTL, {"task": "t", "id": "1", "args": [], "kwargs": {}})
    expire()
    (seen,) = store.abandoned(0.0)
    assert store.recover(seen, max_recoveries=0, reason="unknown task 't'") == 0
    assert store.get("k").dead == "unknown task 't'"
    assert store.abandoned(0.0) == []
    assert [e.event for e in store.history("k")][-1] == "dead"
    again = store.acquire("k", "b", TTL)  # a fresh delivery may still run a dead key
    assert store.get("k").dead is None
    store.complete(again, "ok")


def test_a_takeover_makes_a_seen_abandoned_run_stale(store: Any, expire: Any) -> None:
    store.acquire("k", "a", TTL, {"task": "t", "id": "1", "args": [], "kwargs": {}})
    expire()
    (seen,) = store.abandoned(0.0)
    store.acquire("k", "b", TTL)
    assert store.recover(seen, max_recoveries=3) is None


def test_only_a_recovery_copy_that_started_counts_against_the_bound(store: Any, expire: Any) -> None:
    """A copy is counted as sent when claimed; the acquire that starts it makes it count. Copies still in
    a queue never make the key dead, however many were sent."""
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


def test_a_started_copy_that_completes_leaves_nothing_to_recover(store: Any, expire: Any) -> None:
    store.acquire("k", "a", TTL, {"task": "t", "id": "1", "args": [], "kwargs": {}})
    expire()
    (seen,) = store.abandoned(0.0)
    assert store.recover(seen, max_recoveries=3) == 1
    store.complete(store.acquire("k", "copy", TTL), "ok")
    assert store.abandoned(0.0) == []
    assert store.get("k").done


RICH = {
    "at": dt.datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=dt.timezone.utc),
    "day": dt.date(2026, 12, 1),
    "time": dt.time(23, 59, 58, 1),
    "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "amount": Decimal("1234.5600"),
    "raw": b"\x00\xff binary",
    "nested": [{"when": dt.date(2000, 1, 1), "ids": [uuid.UUID(int=7)], "d": Decimal("-0.1")}],
}


def test_results_and_steps_keep_the_types_celerys_json_carries(store: Any) -> None:
    """What a duplicate delivery returns (AlreadyDone.result) equals what the first run returned."""
    lease = store.acquire("k", "a", TTL)
    store.save_step(lease, "s", RICH)
    store.complete(lease, RICH)
    with pytest.raises(AlreadyDone) as info:
        store.acquire("k", "b", TTL)
    assert info.value.result == RICH
    assert store.get("k").result == RICH
    assert store.steps("k") == {"s": RICH}
    assert type(info.value.result["at"]) is dt.datetime and type(info.value.result["raw"]) is bytes


def test_each_store_states_its_limit_and_refuses_a_bigger_value_before_writing(store: Any) -> None:
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
    assert "complete" not in [e.event for e in store.history("k")]
    store.complete(lease, "small")  # the lease was never touched: the run can still finish
    assert store.get("k").result == "small"


def test_a_value_just_under_the_stated_limit_is_stored(store: Any) -> None:
    """The stated limit is honest: the server itself takes a value of that size (etcd: its request limit)."""
    value = "x" * (store.max_value_bytes - 1024)
    lease = store.acquire("k", "a", TTL)
    store.complete(lease, value)
    assert store.get("k").result == value


def test_nesting_deeper_than_the_codec_follows_is_invalid_argument(store: Any) -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    lease = store.acquire("k", "a", TTL)
    with pytest.raises(InvalidArgument, match="nested too deeply"):
        store.complete(lease, deep)
    assert store.get("k").done is False
