"""The store contract, fenced commit role (``CommitStore``: ``fence_mode="commit"``, docs/commit-mode.md).

``begin_commit`` opens a run's transaction with a read of the key: a finished key refuses it with
``AlreadyDone`` (the stored result), a live lease with ``LeaseHeld``, a key a run of the same task id
marked failed with ``FailedBefore``; a new key, an expired or released lease, or another stranded key
opens. The handle's ``complete(result)`` claims the key: done with the result, a token above every token
issued before, a ``commit`` event. A claim on a key done meanwhile raises
``StaleToken`` (recorded as ``refused``, detail ``commit``) and commits nothing. (That the writes of a
refused handle's ``block()`` roll back with it needs a SQL database: celery-fence tests it on its SQL
stores, apart from this suite.) A store that declares no fenced commit (``fenced_commit="no"``: Redis,
etcd) is skipped, saying so, as a store lacking a role is.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_fence import AlreadyDone, FailedBefore, LeaseHeld, StaleToken
from celery_fence.lease import ENDED_BY
from celery_fence.stores.base import AuditStore, CommitStore, RecoveryStore, lacking
from celery_fence.stores.capabilities import capabilities_of
from celery_fence.verify import verify

from .checks import TTL

REQUIRES = (CommitStore, AuditStore)
RUN = {"task": "shop.ship", "id": "t-1", "args": [7], "kwargs": {}}


def _claimed(store: Any, key: str, owner: str, result: Any) -> int:
    """Open, claim with ``result``: the key's new token (the handle is closed after its claim)."""
    handle = store.begin_commit(key, owner, TTL, RUN)
    assert handle.open
    handle.complete(result)
    assert not handle.open
    state = store.get(key)
    assert (state.done, state.result, state.owner, state.expires_in) == (True, result, owner, None)
    return int(state.token)


def _last(store: Any, key: str) -> tuple[Any, ...]:
    event = store.history(key)[-1]
    return event.event, event.token, event.owner, event.detail


def _one_writer(store: Any) -> bool:
    """A store whose transaction holds the database's one write lock from its read (SQLite): a second
    handle waits at its read for the first to end, so two handles are never open at once on one thread."""
    return capabilities_of(store).write_lock_wait is not None


def test_a_new_key_opens_and_the_claim_finishes_it_with_a_new_token(fence_contract_store: Any) -> None:
    store = fence_contract_store
    before = store.acquire("other", "a", TTL).token  # a token issued before the claim
    token = _claimed(store, "k", "c1", {"shipped": 7})
    assert token > before
    assert store.get("k").run == RUN
    assert _last(store, "k") == ("commit", token, "c1", None)
    with pytest.raises(AlreadyDone) as info:  # a finished key runs nothing more
        store.begin_commit("k", "c2", TTL)
    assert (info.value.token, info.value.result) == (token, {"shipped": 7})
    assert [e.event for e in store.history("k")] == ["commit"]
    assert verify(store.history()) == []


def test_a_key_a_lease_finished_refuses_to_open_with_its_result(fence_contract_store: Any) -> None:
    store = fence_contract_store
    lease = store.acquire("k", "a", TTL)
    store.complete(lease, "by the lease")
    with pytest.raises(AlreadyDone) as info:
        store.begin_commit("k", "c", TTL)
    assert (info.value.token, info.value.result) == (lease.token, "by the lease")
    assert store.get("k").owner == "a"
    assert verify(store.history()) == []


def test_a_live_lease_refuses_to_open(fence_contract_store: Any) -> None:
    store = fence_contract_store
    lease = store.acquire("k", "a", TTL)
    with pytest.raises(LeaseHeld) as info:
        store.begin_commit("k", "c", TTL)
    assert info.value.owner == "a"
    assert info.value.expires_in is not None and 0 < info.value.expires_in <= TTL
    store.complete(lease, "still the holder's")
    assert verify(store.history()) == []


def test_an_expired_lease_opens_and_the_claim_fences_out_its_holder(
    fence_contract_store: Any, fence_contract_expire: Any
) -> None:
    store, expire = fence_contract_store, fence_contract_expire
    lease = store.acquire("k", "a", TTL)
    expire()
    token = _claimed(store, "k", "c", "claimed")
    assert token > lease.token
    with pytest.raises(StaleToken):
        store.complete(lease, "late")
    assert store.get("k").result == "claimed"
    assert verify(store.history()) == []


def test_a_released_lease_opens_and_is_claimed(fence_contract_store: Any) -> None:
    store = fence_contract_store
    lease = store.acquire("k", "a", TTL)
    store.release(lease)
    token = _claimed(store, "k", "c", "claimed")
    assert token > lease.token
    assert [e.event for e in store.history("k")] == ["acquire", "release", "commit"]
    assert verify(store.history()) == []


def test_a_key_stranded_by_another_task_id_opens_and_the_claim_clears_dead(fence_contract_store: Any) -> None:
    store = fence_contract_store
    if lacking(store, RecoveryStore):
        pytest.skip("the store has no RecoveryStore role: nothing strands a key")
    assert store.strand("k", {**RUN, "id": "t-0"}, "gave up waiting out the store") is True
    token = _claimed(store, "k", "c", "claimed")
    assert token > 0 and store.get("k").dead is None
    assert [e.event for e in store.history("k")] == ["gave-up", "commit"]
    assert verify(store.history()) == []


def test_a_key_marked_failed_by_the_claims_own_task_id_refuses_it(fence_contract_store: Any) -> None:
    """A run of this task id ended FAILURE and marked the key with its run record (``strand``): a copy of
    the same task id claims nothing after it (one ending per task id), and the refusal is recorded; a copy
    that opens after it meets ``FailedBefore`` with the mark's reason; a second mark of the task id is not
    made (its first FAILURE is the ending); another task id opens and claims."""
    store = fence_contract_store
    if lacking(store, RecoveryStore):
        pytest.skip("the store has no RecoveryStore role: nothing strands a key")
    reason = "shop.ship[t-1] ended FAILURE (RuntimeError)"
    opened_before = None if _one_writer(store) else store.begin_commit("k", "copy", TTL, RUN)
    assert store.strand("k", {**RUN, ENDED_BY: "first"}, reason) is True
    if opened_before is not None:  # a copy that ran beside the failed run
        with pytest.raises(StaleToken):
            opened_before.complete("late")
    with pytest.raises(FailedBefore) as info:  # a copy sent later: the FAILURE is its ending
        store.begin_commit("k", "later", TTL, RUN)
    assert (info.value.key, info.value.reason) == ("k", reason)
    with pytest.raises(StaleToken):
        store.claim("k", "copy", "late", RUN)
    assert store.strand("k", {**RUN, ENDED_BY: "second"}, "again") is False
    state = store.get("k")
    assert (state.done, state.dead, state.run[ENDED_BY]) == (False, reason, "first")
    refusals = 2 if opened_before is not None else 1
    assert [(e.event, e.detail) for e in store.history("k")][1:] == [("refused", "commit")] * refusals
    other = {**RUN, "id": "t-2"}
    store.begin_commit("k", "other", TTL, other).complete("other's")
    assert (store.get("k").done, store.get("k").owner) == (True, "other")


def test_a_claim_on_a_done_key_is_refused_recorded_and_commits_nothing(fence_contract_store: Any) -> None:
    """The claim alone (a run whose only ``transaction()`` block was undone), and a second handle's claim
    where two are open at once (on a one-writer store the second waits at its read: ``AlreadyDone``)."""
    store = fence_contract_store
    token = _claimed(store, "k", "first", "first's")
    with pytest.raises(StaleToken) as info:
        store.claim("k", "second", "second's", RUN)
    assert info.value.recorded and info.value.current == token
    assert _last(store, "k") == ("refused", 0, "second", "commit")
    if not _one_writer(store):
        first, second = store.begin_commit("j", "first", TTL), store.begin_commit("j", "second", TTL)
        first.complete("first's")
        with pytest.raises(StaleToken) as info:
            second.complete("second's")
        assert info.value.recorded and not second.open
        assert _last(store, "j") == ("refused", 0, "second", "commit")
    for key in ("k", "j") if not _one_writer(store) else ("k",):
        state = store.get(key)
        assert (state.owner, state.result, state.done) == ("first", "first's", True)
        assert [e.event for e in store.history(key) if e.event == "commit"] == ["commit"]
    assert verify(store.history()) == []
