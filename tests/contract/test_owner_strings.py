"""Owner strings that repeat: the store API takes any owner, and identity is the token.

An acquire returns a token above every token issued before, whatever the owner string; the one exception,
the lost-reply resolution, returns only a live lease of that owner (a retried call finds the lease it
created). A released or expired lease is never handed back, also when the acquire meets the lease row
locked (PostgreSQL's ``NOWAIT`` probe) or the lease ends between the acquire and the read that says why it
failed (the SQL store's two statements).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import text

from celery_fence import LeaseHeld, StaleToken, StoreUnavailable, open_store
from celery_fence.testing.contract.checks import TTL, audits

from ..support.harnesses import WITH_TRANSACTIONS
from ..support.racing import in_processes

RACE_TTL = 0.2  # short enough that some acquisitions meet their own expired lease
PROCESSES, WINS = 8, 50  # each process acquires the key WINS times, always under one owner string
RACE_SECONDS = 90.0  # a deadline for the loops on a loaded machine, not a sleep
KEY = "one"
GRANTED = ("acquire", "takeover")


# -- several processes, one owner string each, one key --


def _acquisitions(store: Any, owner: str, seed: int, let_expire: Callable[[], None]) -> list[int]:
    """Acquire ``KEY`` as ``owner`` until it won ``WINS`` times; give each lease back (release) or, now
    and then, let it expire. Never asks again while its own lease is live: that is the lost-reply case."""
    rng, tokens = random.Random(seed), []
    deadline = time.monotonic() + RACE_SECONDS
    while len(tokens) < WINS and time.monotonic() < deadline:
        try:
            lease = store.acquire(KEY, owner, RACE_TTL)
        except (LeaseHeld, StoreUnavailable):  # held; or nothing said (a lease it made expires unseen)
            time.sleep(rng.uniform(0, 0.002))
            continue
        tokens.append(lease.token)
        if rng.random() < 0.1:
            let_expire()
            continue
        try:
            store.release(lease)
        except StoreUnavailable:  # the lease may still be live: wait until it is not
            let_expire()
    return tokens


def _past_the_ttl() -> None:
    time.sleep(RACE_TTL + 0.1)  # a stall of the holder, so that its lease expires (no timing is asserted)


def _in_process(url: str, owner: str, seed: int, out: Any) -> None:
    store = open_store(url)
    try:
        out.put((owner, _acquisitions(store, owner, seed, _past_the_ttl)))
    finally:
        store.close()


def _in_threads(store: Any, owners: list[str], expire: Callable[[], None]) -> list[tuple[str, list[int]]]:
    reports: list[tuple[str, list[int]]] = []

    def run(owner: str, seed: int) -> None:
        reports.append((owner, _acquisitions(store, owner, seed, expire)))

    threads = [threading.Thread(target=run, args=(owner, seed)) for seed, owner in enumerate(owners)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(RACE_SECONDS + 30)
    assert len(reports) == len(owners)
    return reports


def test_processes_that_each_repeat_one_owner_never_get_a_token_twice(
    store: Any, harness: Any, expire: Any
) -> None:
    owners = [f"worker-{n}" for n in range(PROCESSES)]
    if harness.multiprocess:
        reports = in_processes(_in_process, [(store.url, owner, seed) for seed, owner in enumerate(owners)])
    else:  # a store private to this process: threads
        reports = _in_threads(store, owners, expire)
    returned = [token for _, tokens in reports for token in tokens]
    assert len(returned) >= PROCESSES * WINS // 2, "the race hardly ran"
    repeated = len(returned) - len(set(returned))
    assert repeated == 0, f"{repeated} of {len(returned)} acquisitions returned a token returned before"
    for owner, tokens in reports:
        assert all(a < b for a, b in itertools.pairwise(tokens)), f"{owner}: tokens did not strictly increase"
    if audits(store):
        granted = [(e.token, e.owner) for e in store.history(KEY) if e.event in GRANTED]
        in_order = [token for token, _ in granted]
        assert in_order == sorted(set(in_order)), "tokens did not strictly increase in the order granted"
        assert {(t, owner) for owner, tokens in reports for t in tokens} <= set(granted)


# -- one owner string, one process: released, expired, live --


@pytest.mark.parametrize("ends", ["released", "expired"])
def test_an_owner_whose_lease_ended_gets_a_higher_token(store: Any, expire: Any, ends: str) -> None:
    first = store.acquire("k", "o", TTL)
    if ends == "released":
        store.release(first)
    else:
        expire()
    second = store.acquire("k", "o", TTL)
    assert second.token > first.token
    with pytest.raises(StaleToken):
        store.complete(first, "stale")
    store.complete(second, "ok")


def test_an_owner_string_used_again_after_another_owner_gets_a_higher_token(store: Any, expire: Any) -> None:
    first = store.acquire("k", "o", TTL)
    expire()
    other = store.acquire("k", "p", TTL)
    store.release(other)
    again = store.acquire("k", "o", TTL)
    assert first.token < other.token < again.token


def test_a_retried_acquire_finds_the_live_lease_it_created(store: Any) -> None:
    """The lost-reply resolution ``Run`` relies on: the same owner while its lease is live."""
    lease = store.acquire("k", "o", TTL)
    assert store.acquire("k", "o", TTL) == lease
    store.complete(lease, "ok")
    if audits(store):
        assert [e.token for e in store.history("k") if e.event in GRANTED] == [lease.token]


# -- the SQL store: the acquire statement, then a second read that says why it took nothing --


def _release_rows(store: Any) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE fence_leases SET expires_at = NULL"))


# The stores are parametrized here, not chosen by a stores mark, so that its ids name the ending first.
@pytest.mark.parametrize("harness", WITH_TRANSACTIONS, indirect=True)
@pytest.mark.parametrize("ends", ["expires", "is-released"])
def test_a_lease_that_ends_between_the_acquire_and_its_read_is_not_handed_back(
    store: Any, expire: Any, ends: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The acquire statement saw the owner's live lease; it ended before the read that says by whom."""
    first = store.acquire("k", "o", TTL)
    hot, end = store.connections.hot, expire if ends == "expires" else lambda: _release_rows(store)

    def statement_then_end(name: str, params: Any) -> Any:
        rows = hot(name, params)
        if name == "acquire":
            end()
        return rows

    monkeypatch.setattr(store.connections, "hot", statement_then_end)
    with pytest.raises(LeaseHeld):  # as seen by the statement: held (a retry finds the key free)
        store.acquire("k", "o", TTL)
    monkeypatch.undo()
    assert store.acquire("k", "o", TTL).token > first.token


def _locked(store: Any, key: str) -> Any:
    """A transaction that holds ``key``'s lease row locked, as a concurrent acquire's statement does."""
    conn = store.engine.connect()
    conn.begin()
    conn.execute(text("SELECT 1 FROM fence_leases WHERE key = :key FOR UPDATE"), {"key": key})
    return conn


@pytest.mark.stores("postgresql")
def test_a_locked_row_never_hands_back_a_released_lease(store: Any) -> None:
    first = store.acquire("k", "o", TTL)
    store.release(first)
    with _locked(store, "k"), pytest.raises(LeaseHeld):
        store.acquire("k", "o", TTL)
    assert store.acquire("k", "o", TTL).token > first.token


@pytest.mark.stores("postgresql")
def test_a_locked_row_never_hands_back_an_expired_lease(store: Any, expire: Any) -> None:
    first = store.acquire("k", "o", TTL)
    expire()
    # its run's transaction is still open (an expired lease nobody took over is current): the row is locked
    with store.transaction(first), pytest.raises(LeaseHeld):
        store.acquire("k", "o", TTL)
    assert store.acquire("k", "o", TTL).token > first.token


@pytest.mark.stores("postgresql")
def test_a_locked_row_still_gives_a_retried_acquire_its_live_lease(store: Any) -> None:
    lease = store.acquire("k", "o", TTL)
    with _locked(store, "k"):
        assert store.acquire("k", "o", TTL) == lease
