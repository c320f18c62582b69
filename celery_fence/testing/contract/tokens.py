"""Tokens (issue 14, points 1 to 3): one range on every store, an ``advance`` that cannot race an acquire,
and a forged token that can never wedge a store."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from typing import Any

import pytest

from celery_fence import ConfigurationError, InvalidArgument, Lease, StaleToken, StoreUnavailable, open_store
from celery_fence.stores.base import AdminStore

from .checks import MAX_TOKEN, TTL, dump, in_processes, in_scopes, keys_in_one_scope

REQUIRES = (AdminStore,)

RACE_SECONDS = 2.0  # how long the acquirers race the advancer (a deadline for the loops, not a sleep)


def test_an_advance_out_of_the_range_is_refused_and_changes_nothing(fence_contract_store: Any) -> None:
    store = fence_contract_store
    first = store.acquire("a", "w", TTL)
    before = dump(store)
    for gap in (MAX_TOKEN, 2**62, 2**63 + 5):
        with pytest.raises(InvalidArgument):
            store.advance(gap)
        assert dump(store) == before
    assert store.acquire("b", "w", TTL).token < first.token + 1000  # the counter did not move


def test_large_advances_keep_tokens_exact_and_unique(
    fence_contract_store: Any, fence_contract_harness: Any
) -> None:
    store, harness = fence_contract_store, fence_contract_harness
    phases = [[("k0", store.acquire("k0", "w", TTL).token)]]
    for i in range(2):  # two large advances used to turn SQLite's counter into a REAL
        store.advance(2**51)
        phases.append([(f"k{i}-{j}", store.acquire(f"k{i}-{j}", "w", TTL).token) for j in range(3)])
    tokens = [t for phase in phases for _, t in phase]
    assert all(type(t) is int and 0 < t <= MAX_TOKEN for t in tokens)
    for scoped in in_scopes(harness, [pair for phase in phases for pair in phase]).values():
        assert scoped == sorted(set(scoped))
    for before, after in itertools.pairwise(phases):  # every token after an advance is above every one before
        assert max(t for _, t in before) < min(t for _, t in after)
    assert tokens[-1] > 2**52
    for state in store.leases():
        assert type(state.token) is int and state.token in tokens


def test_the_top_of_the_range_is_refused_for_good_never_crossed(
    fence_contract_store: Any, fence_contract_harness: Any, fence_contract_expire: Any
) -> None:
    """Brought next to the top (by ``advance``, or the harness where a store keeps headroom), the counter
    issues its last tokens, then every acquire (a new key, a takeover) answers ``ConfigurationError``
    (permanent: not ``StoreUnavailable``, which a worker would wait out) and changes nothing, for good."""
    store, harness = fence_contract_store, fence_contract_harness
    *tops, after = keys_in_one_scope(harness, "top", 9, like="k")  # one counter: it runs out for them all
    start = store.acquire("k", "w", TTL).token
    if harness.near_the_top is None:
        store.advance(MAX_TOKEN - start - 3)
    else:
        harness.near_the_top(store, 3)
    issued = []
    for top in tops:
        try:
            issued.append(store.acquire(top, "w", TTL).token)
        except ConfigurationError:
            break
    assert issued and issued == sorted(set(issued)) and issued[-1] <= MAX_TOKEN
    fence_contract_expire()  # "k" may be taken over: that would draw a token too
    before = dump(store)
    for key in (after, "k", after):
        with pytest.raises(ConfigurationError, match=r"2\*\*53 - 1"):
            store.acquire(key, "w", TTL)
        assert dump(store) == before


FORGED = [Lease("k", MAX_TOKEN, "a"), Lease("k", MAX_TOKEN - 7, "forger"), Lease("nobody", 2**52, "f")]


@pytest.mark.parametrize("call", ["renew", "complete", "release", "save_step", "refuse"])
@pytest.mark.parametrize("forged", FORGED, ids=["top", "near-top", "unknown-key"])
def test_a_forged_token_is_refused_and_never_moves_the_counter(
    fence_contract_store: Any, call: str, forged: Lease, fence_contract_harness: Any
) -> None:
    store, harness = fence_contract_store, fence_contract_harness
    [other] = keys_in_one_scope(harness, "other", 1, like="k")  # its token comes from k's counter
    real = store.acquire("k", "a", TTL)
    calls = {
        "renew": lambda: store.renew([forged], TTL) == [forged],
        "complete": lambda: store.complete(forged, "forged"),
        "release": lambda: store.release(forged),
        "save_step": lambda: store.save_step(forged, "s", "forged"),
        "refuse": lambda: store.refuse(forged, "forged"),
    }
    with contextlib.suppress(StaleToken):  # complete and save_step refuse loudly
        assert calls[call]() in (True, None)
    state = store.get("k")
    assert (state.token, state.done, store.steps("k")) == (real.token, False, {})
    after = store.acquire(other, "b", TTL)  # every later acquire still works, with a token of the
    assert real.token < after.token < real.token + 1000  # counter, not one above the forged token
    assert store.renew([real], TTL) == []
    store.complete(real, "real")
    assert store.get("k").result == "real"


# -- advance racing acquires: several processes (threads on a store private to one process) --


def _acquire_until(store: Any, prefix: str, deadline: float) -> list[tuple[str, int]]:
    tokens, i = [], 0
    while time.monotonic() < deadline:
        i += 1
        try:
            tokens.append((f"{prefix}{i}", store.acquire(f"{prefix}{i}", "w", TTL).token))
        except StoreUnavailable:  # etcd: an advance spoiled every attempt; nothing was written
            continue
    return tokens


def _advance_until(store: Any, deadline: float) -> list[int]:
    floors = []
    while time.monotonic() < deadline:
        try:
            floors.append(store.advance(1))  # small gaps: a move back would hand out an issued token again
        except StoreUnavailable:  # etcd: the acquires kept changing the revision; nothing was written
            continue
    return floors


def _run(store: Any, role: str, deadline: float) -> list[Any]:
    return _advance_until(store, deadline) if role == "advance" else _acquire_until(store, role, deadline)


def _in_process(url: str, role: str, deadline: float, out: Any) -> None:
    store = open_store(url)
    try:
        out.put((role, _run(store, role, deadline)))
    finally:
        store.close()


def _race_threads(store: Any, roles: list[str], deadline: float) -> list[tuple[str, list[Any]]]:
    reports: list[tuple[str, list[Any]]] = []

    def run(role: str) -> None:
        reports.append((role, _run(store, role, deadline)))

    threads = [threading.Thread(target=run, args=(role,)) for role in roles]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(reports) == len(roles)
    return reports


def test_advance_never_moves_back_under_concurrent_acquires(
    fence_contract_store: Any, fence_contract_harness: Any
) -> None:
    store, harness = fence_contract_store, fence_contract_harness
    roles = ["a", "b", "c", "advance", "advance"]
    deadline = time.monotonic() + RACE_SECONDS
    if harness.multiprocess:
        reports = in_processes(_in_process, [(store.url, role, deadline) for role in roles])
    else:
        reports = _race_threads(store, roles, deadline)
    acquired = [(key, t) for role, tokens in reports if role != "advance" for key, t in tokens]
    assert acquired, "no acquire ran"
    for tokens in in_scopes(harness, acquired).values():  # the store's one counter, or a cluster slot's
        assert len(tokens) == len(set(tokens)), "a token was issued twice"
    held = in_scopes(harness, [(state.key, state.token) for state in store.leases()])
    assert all(len(set(tokens)) == len(tokens) for tokens in held.values())
