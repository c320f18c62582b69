"""A Hypothesis state machine over the memory store (the executable spec), checked against a model.

Invariants after every step: at most one live holder per key; every token issued is above every token issued
before it (globally, so also per key); a write, renew or release with a stale token never takes effect; a done
key keeps its result; each key's history is in store-time order, its grants' tokens strictly increase, and
every accepted write in it carries the token of the latest grant.

It holds the oracle to a model of its own, with no server: tests/contract/test_differential.py then runs the
same rules (and the other roles' calls) on SQLite, PostgreSQL and Redis in lockstep with this memory store,
every answer checked against the memory store's.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, multiple, rule

from celery_fence.errors import AlreadyDone, InvalidArgument, LeaseHeld, StaleToken
from celery_fence.lease import Lease
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import FakeClock

KEYS = ("a", "b", "c")
OWNERS = ("o1", "o2", "o3")
TTLS = (5.0, 10.0)
GRANTS = ("acquire", "takeover", "admin-release")  # events that make a new token current
WRITES = ("complete", "step", "release")  # events that only the current token may cause

RESULTS = st.none() | st.integers() | st.text(max_size=3) | st.lists(st.integers(), max_size=3)


@dataclass
class KeyModel:
    token: int
    owner: str | None
    expires_at: float | None  # None: free
    done: bool = False
    result: Any = None
    steps: dict[str, Any] = field(default_factory=dict)


class FenceMachine(RuleBasedStateMachine):
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.store = MemoryStore(clock=self.clock)
        self.model: dict[str, KeyModel] = {}
        self.issued: list[int] = []  # every token the store issued, in order
        self.granted: list[Lease] = []  # every lease acquire returned
        self.results: dict[str, Any] = {}  # the result each key was first completed with

    # -- model helpers --

    def is_current(self, lease: Lease) -> bool:
        m = self.model.get(lease.key)
        return m is not None and m.token == lease.token and not m.done and m.expires_at is not None

    def record_token(self, token: int) -> None:
        assert token > max(self.issued, default=0), f"token {token} not above {self.issued}"
        self.issued.append(token)

    # -- rules --

    @rule(target=leases, key=st.sampled_from(KEYS), owner=st.sampled_from(OWNERS), ttl=st.sampled_from(TTLS))
    def acquire(self, key: str, owner: str, ttl: float) -> Any:
        now, m = self.clock(), self.model.get(key)
        if m is not None and m.done:
            with pytest.raises(AlreadyDone) as done:
                self.store.acquire(key, owner, ttl)
            assert (done.value.token, done.value.result) == (m.token, m.result)
            return multiple()
        if m is not None and m.expires_at is not None and m.expires_at > now:
            if m.owner == owner:  # the same acquire, retried: the same lease back
                assert self.store.acquire(key, owner, ttl) == Lease(key, m.token, owner)
                return multiple()
            with pytest.raises(LeaseHeld) as held:
                self.store.acquire(key, owner, ttl)
            assert held.value.owner == m.owner
            assert held.value.expires_in == pytest.approx(m.expires_at - now)
            return multiple()
        lease = self.store.acquire(key, owner, ttl)
        assert (lease.key, lease.owner) == (key, owner)
        self.record_token(lease.token)
        last = self.store.history(key)[-1]
        expected = "takeover" if m is not None and m.expires_at is not None else "acquire"
        assert (last.event, last.token, last.owner) == (expected, lease.token, owner)
        self.model[key] = KeyModel(lease.token, owner, now + ttl, steps=m.steps if m else {})
        self.granted.append(lease)
        return lease

    @rule(chosen=st.lists(leases, min_size=1, max_size=4), ttl=st.sampled_from(TTLS))
    def renew(self, chosen: list[Lease], ttl: float) -> None:
        now = self.clock()
        expected_lost = [lease for lease in chosen if not self.is_current(lease)]
        assert Counter(self.store.renew(chosen, ttl)) == Counter(expected_lost)
        for lease in chosen:
            if self.is_current(lease):
                self.model[lease.key].expires_at = now + ttl

    @rule(lease=leases, result=RESULTS)
    def complete(self, lease: Lease, result: Any) -> None:
        m = self.model[lease.key]
        if not self.is_current(lease):
            with pytest.raises(StaleToken) as stale:
                self.store.complete(lease, result)
            assert (stale.value.token, stale.value.current) == (lease.token, m.token)
            return
        self.store.complete(lease, result)
        m.done, m.result, m.expires_at = True, result, None
        self.results.setdefault(lease.key, result)

    @rule(lease=leases)
    def release(self, lease: Lease) -> None:
        before = self.store.get(lease.key)
        self.store.release(lease)
        if self.is_current(lease):
            self.model[lease.key].expires_at = None
        else:
            assert self.store.get(lease.key) == before  # a stale release changes nothing

    @rule(lease=leases, name=st.sampled_from(("s1", "s2")), value=RESULTS)
    def save_step(self, lease: Lease, name: str, value: Any) -> None:
        m = self.model[lease.key]
        if not self.is_current(lease):
            with pytest.raises(StaleToken):
                self.store.save_step(lease, name, value)
        elif name in m.steps:
            with pytest.raises(InvalidArgument):
                self.store.save_step(lease, name, value)
        else:
            self.store.save_step(lease, name, value)
            m.steps[name] = value
        assert self.store.steps(lease.key) == m.steps

    @rule(seconds=st.integers(0, 4) | st.integers(5, 25))
    def advance(self, seconds: int) -> None:
        self.clock.advance(seconds)

    @rule(key=st.sampled_from(KEYS))
    def force_release(self, key: str) -> None:
        m = self.model.get(key)
        if m is None:
            with pytest.raises(InvalidArgument):
                self.store.force_release(key)
            return
        token = self.store.force_release(key)
        self.record_token(token)
        m.token, m.owner, m.expires_at = token, None, None

    # -- invariants --

    @invariant()
    def store_matches_model(self) -> None:
        now = self.clock()
        for key in KEYS:
            state, m = self.store.get(key), self.model.get(key)
            if m is None:
                assert state is None
                continue
            assert state is not None
            assert (state.token, state.owner, state.done) == (m.token, m.owner, m.done)
            if m.expires_at is None:
                assert state.expires_in is None
            else:
                assert state.expires_in == pytest.approx(m.expires_at - now)

    @invariant()
    def at_most_one_live_holder(self) -> None:
        for key in KEYS:
            state = self.store.get(key)
            if state is None or state.done or state.expires_in is None or state.expires_in <= 0:
                continue
            live = {(lease.owner, lease.token) for lease in self.granted if lease.key == key}
            live = {pair for pair in live if pair[1] == state.token}
            assert len(live) == 1

    @invariant()
    def tokens_strictly_increase_and_are_unique(self) -> None:
        assert self.issued == sorted(set(self.issued))
        grants = [e.token for e in self.store.history() if e.event in GRANTS]
        assert grants == self.issued

    @invariant()
    def a_done_key_keeps_its_result(self) -> None:
        for key, result in self.results.items():
            state = self.store.get(key)
            assert state is not None and state.done and state.result == result

    @invariant()
    def history_is_ordered_and_has_no_stale_write(self) -> None:
        for key in KEYS:
            events = self.store.history(key)
            assert [e.at for e in events] == sorted(e.at for e in events)
            grants = [e.token for e in events if e.event in ("acquire", "takeover")]
            assert grants == sorted(set(grants))
            latest = None
            for event in events:
                if event.event in GRANTS:
                    latest = event.token
                elif event.event in WRITES:
                    assert event.token == latest, f"stale {event.event} accepted: {event}"


FenceMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestFenceMachine = FenceMachine.TestCase
