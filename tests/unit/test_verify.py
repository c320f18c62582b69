"""The history verifier: a real history from the memory store is clean; every corruption is named."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from celery_fence.errors import StaleToken
from celery_fence.lease import HistoryEvent
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import FakeClock
from celery_fence.verify import RULES, Violation, verify, verify_store

TTL = 10.0
KEY, OTHER, ADMIN = "invoice:1", "invoice:2", "invoice:3"


@pytest.fixture
def lived(store: MemoryStore, clock: FakeClock) -> MemoryStore:
    """The memory store after a takeover, a release and an admin release, all of them legal."""
    old = store.acquire(KEY, "w1", TTL)
    store.save_step(old, "total", 42)
    clock.advance(TTL + 1)  # w1 pauses past its lease
    new = store.acquire(KEY, "w2", TTL)  # takeover
    with pytest.raises(StaleToken):
        store.complete(old, "stale")  # refused and logged
    store.save_step(new, "charge", "ch_1")
    store.complete(new, 42)

    first = store.acquire(OTHER, "w1", TTL)
    store.release(first)  # an exception: the next attempt acquires at once
    store.complete(store.acquire(OTHER, "w2", TTL), "ok")

    store.acquire(ADMIN, "w1", TTL)
    store.force_release(ADMIN)
    store.complete(store.acquire(ADMIN, "w2", TTL), "ok")
    return store


def at(events: list[HistoryEvent], key: str, event: str, nth: int = 0) -> int:
    """Index of the ``nth`` ``event`` of ``key``."""
    return [i for i, e in enumerate(events) if e.key == key and e.event == event][nth]


def swap_tokens(events: list[HistoryEvent]) -> None:
    a, t = at(events, KEY, "acquire"), at(events, KEY, "takeover")
    events[a], events[t] = (
        dataclasses.replace(events[a], token=events[t].token),
        dataclasses.replace(events[t], token=events[a].token),
    )


def reuse_token_on_other_key(events: list[HistoryEvent]) -> None:
    i = at(events, OTHER, "acquire", 1)
    events[i] = dataclasses.replace(events[i], token=events[at(events, KEY, "acquire")].token)


def stale_complete_after_takeover(events: list[HistoryEvent]) -> None:
    old = events[at(events, KEY, "acquire")]
    events.insert(at(events, KEY, "takeover") + 1, dataclasses.replace(old, event="complete"))


def second_complete(events: list[HistoryEvent]) -> None:
    i = at(events, KEY, "complete")
    events.insert(i + 1, events[i])


def write_after_complete(events: list[HistoryEvent]) -> None:
    i = at(events, KEY, "complete")
    events.insert(i + 1, dataclasses.replace(events[i], event="write"))


def duplicate_step(events: list[HistoryEvent]) -> None:
    i = at(events, KEY, "step", 1)
    events.insert(i + 1, events[i])


def write_after_release(events: list[HistoryEvent]) -> None:
    i = at(events, OTHER, "release")
    events.insert(i + 1, dataclasses.replace(events[i], event="write"))


def write_with_admin_token(events: list[HistoryEvent]) -> None:
    i = at(events, ADMIN, "admin-release")
    events.insert(i + 1, dataclasses.replace(events[i], event="write", owner="w1"))


CORRUPTIONS: list[tuple[Callable[[list[HistoryEvent]], None], str, str]] = [
    (swap_tokens, KEY, "token-not-increasing"),
    (reuse_token_on_other_key, OTHER, "token-reused"),
    (stale_complete_after_takeover, KEY, "stale-write"),
    (second_complete, KEY, "double-complete"),
    (write_after_complete, KEY, "write-after-complete"),
    (duplicate_step, KEY, "step-duplicate"),
    (write_after_release, OTHER, "write-after-release"),
    (write_with_admin_token, ADMIN, "stale-write"),
]


def test_a_real_history_is_clean(lived: MemoryStore) -> None:
    events = lived.history()
    assert [e.event for e in events if e.key == KEY] == [
        "acquire", "step", "takeover", "refused", "step", "complete",
    ]  # fmt: skip
    assert verify(events) == []
    assert verify_store(lived) == []
    assert verify_store(lived, KEY) == []


@pytest.mark.parametrize(("corrupt", "key", "rule"), CORRUPTIONS, ids=[c[0].__name__ for c in CORRUPTIONS])
def test_each_corruption_is_named(
    lived: MemoryStore, corrupt: Callable[[list[HistoryEvent]], None], key: str, rule: str
) -> None:
    events = lived.history()
    corrupt(events)
    found = verify(events)
    assert rule in RULES
    assert (key, rule) in {(v.key, v.rule) for v in found}, found
    assert all(isinstance(v.event, HistoryEvent) and v.detail for v in found)


def test_the_stale_complete_is_the_offending_event(lived: MemoryStore) -> None:
    events = lived.history()
    stale_complete_after_takeover(events)
    old_token = events[at(events, KEY, "acquire")].token
    stale = [v for v in verify(events) if v.rule == "stale-write"]
    assert len(stale) == 1
    assert stale[0].event is not None and stale[0].event.token == old_token
    assert f"token {old_token}" in stale[0].detail


def test_a_committed_step_missing_from_the_history_is_named(lived: MemoryStore) -> None:
    events = [e for e in lived.history() if not (e.key == KEY and e.detail == "charge")]
    steps = {KEY: lived.steps(KEY)}
    assert verify(events, steps) == [
        Violation(KEY, "step-unlogged", "step 'charge' is committed but never logged")
    ]
    assert verify(lived.history(), steps) == []


def test_a_pruned_key_that_runs_again_is_reported_once(store: MemoryStore, clock: FakeClock) -> None:
    first = store.acquire(KEY, "w1", TTL)
    store.save_step(first, "total", 1)
    store.complete(first, 1)
    clock.advance(1)
    assert store.prune(0) == 1
    assert verify_store(store) == []  # the marker alone is clean
    again = store.acquire(KEY, "w2", TTL)  # the broker redelivered the finished run after the prune
    store.save_step(again, "total", 1)  # a new life: its step and complete are not reported again
    store.complete(again, 1)
    found = verify_store(store)
    assert [(v.key, v.rule, v.event) for v in found] == [(KEY, "reopened-after-prune", store.history()[1])]
    assert (
        found[0].detail == f"acquire with token {again.token} after the key was pruned at token {first.token}"
    )


def _events(*names: str) -> list[HistoryEvent]:
    """One key's history: each acquire issues the next token; the other events carry the latest."""
    events, token = [], 0
    for i, name in enumerate(names):
        token += name == "acquire"
        events.append(HistoryEvent(float(i), name, token, None if name == "pruned" else "w", key=KEY))
    return events


def test_an_acquire_after_the_prune_marker_is_reopened() -> None:
    assert verify(_events("acquire", "complete", "pruned")) == []
    assert verify(_events("pruned")) == []  # what a store keeps: the marker replaced the history
    for events in (_events("acquire", "complete", "pruned", "acquire"), _events("pruned", "acquire")):
        assert [v.rule for v in verify(events)] == ["reopened-after-prune"], events


def test_an_acquire_after_a_complete_without_a_prune_is_named() -> None:
    found = verify(_events("acquire", "complete", "acquire", "complete"))
    assert [v.rule for v in found] == ["acquire-after-complete"]
    assert found[0].detail == "acquire with token 2 after complete with token 1, never pruned"


def test_a_token_after_the_prune_marker_must_be_above_it() -> None:
    events = [HistoryEvent(0.0, "pruned", 7, None, key=KEY), HistoryEvent(1.0, "acquire", 7, "w", key=KEY)]
    assert {v.rule for v in verify(events)} == {"reopened-after-prune", "token-not-increasing"}


def test_an_empty_history_is_clean(store: MemoryStore) -> None:
    assert verify([]) == []
    assert verify_store(store) == []


def test_transaction_writes_committed_under_two_tokens_are_a_repeated_write() -> None:
    """``transaction()`` writes commit with the completion, so one life of a
    key holds the writes of one token; two attempts' writes both kept is a repeated effect (what an
    attempt that wrote and then retried left behind before its writes joined the completion)."""
    assert verify(_events("acquire", "write", "write", "complete")) == []  # two blocks of one run
    retried = _events("acquire", "write", "release", "acquire", "write", "complete")
    assert [v.rule for v in verify(retried)] == ["repeated-write"]
    assert verify(_events("acquire", "write", "release", "acquire", "complete")) == []


def test_a_run_that_gave_up_before_it_acquired_is_no_violation(store: MemoryStore) -> None:
    """A ``gave-up`` event (``strand``) issues no token and accepts no write: token 0 on a new key, the
    released token after a release; the next acquire starts a normal run."""
    assert store.strand(KEY, None, "the store was down") is True  # token 0, before any acquire
    first = store.acquire(KEY, "w1", TTL)
    store.release(first)
    assert store.strand(KEY, None, "the store was down again") is True  # the released token
    store.complete(store.acquire(KEY, "w2", TTL), "ok")
    events = store.history(KEY)
    assert [(e.event, e.token) for e in events] == [
        ("gave-up", 0), ("acquire", first.token), ("release", first.token),
        ("gave-up", first.token), ("acquire", first.token + 1), ("complete", first.token + 1),
    ]  # fmt: skip
    assert verify(events) == [] and verify_store(store) == []
