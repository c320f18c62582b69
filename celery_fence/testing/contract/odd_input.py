"""Odd text and odd numbers at every entry point (issue 14, points 5 and 8): every store refuses them the
same way, with ``InvalidArgument`` (never ``StoreUnavailable``, which says "wait and retry", and never a
driver's own exception), and writes nothing.

The rule for odd text is one for all stores: keys, owners, step names and refusal details are refused when
they hold NUL (SQLite's JSON and PostgreSQL's text cannot carry it) or a lone surrogate (not encodable as
UTF-8); any other Unicode is fine.
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_fence import InvalidArgument, Lease
from celery_fence.lease import Abandoned

from .checks import EVERY_ROLE, MAX_TOKEN, TTL, lease_calls, refused_cleanly

REQUIRES = EVERY_ROLE  # dump() reads leases, history and steps

ODD_TEXT = ["a\x00b", "\x00", "\ud800", "x\udfffy"]
HUGE = [10**400, 2**63, 2**64 + 1, 1e308]


def short(value: object) -> str:
    return repr(value)[:24]


@pytest.mark.parametrize("text", ODD_TEXT, ids=ascii)
def test_odd_text_is_refused_everywhere(fence_contract_seeded: Any, text: str) -> None:
    store, live = fence_contract_seeded
    calls = [
        lambda: store.acquire(text, "a", TTL),
        lambda: store.acquire("new", text, TTL),
        lambda: store.get(text),
        lambda: store.steps(text),
        lambda: store.history(text),
        lambda: store.force_release(text),
        lambda: store.renew([Lease(text, live.token, "b")], TTL),
        lambda: store.renew([Lease("live", live.token, text)], TTL),
        lambda: store.complete(Lease("live", live.token, text), 1),
        lambda: store.release(Lease(text, live.token, "b")),
        lambda: store.save_step(live, text, 1),
        lambda: store.refuse(live, text),
        lambda: store.recover(Abandoned(text, live.token, None, 0), 1),
    ]
    for call in calls:
        refused_cleanly(store, call, InvalidArgument)


@pytest.mark.parametrize("key", ["ä/€", "a b\tc", "\u2028", "\U0001d518nicode", "%00", "k/../x"], ids=ascii)
def test_other_unicode_keys_work(fence_contract_store: Any, key: str) -> None:
    store = fence_contract_store
    lease = store.acquire(key, "ö", TTL)
    assert store.renew([lease], TTL) == []
    store.save_step(lease, "ß", key)
    store.complete(lease, key)
    assert (store.get(key).result, store.steps(key)) == (key, {"ß": key})
    assert [e.event for e in store.history(key)] == ["acquire", "step", "complete"]


@pytest.mark.parametrize("number", HUGE, ids=short)
def test_huge_ttls_and_ages_are_refused(fence_contract_seeded: Any, number: Any) -> None:
    store, live = fence_contract_seeded
    for call in (
        lambda: store.acquire("new", "a", number),
        lambda: store.renew([live], number),
        lambda: store.prune(number),
        lambda: store.abandoned(number),
    ):
        refused_cleanly(store, call, InvalidArgument)


@pytest.mark.parametrize("limit", ["x", None, 0, -1, 1.5, True, 10**400], ids=short)
def test_bad_abandoned_limits_are_refused(fence_contract_seeded: Any, limit: Any) -> None:
    store, _ = fence_contract_seeded
    refused_cleanly(store, lambda: store.abandoned(0.0, limit), InvalidArgument)


@pytest.mark.parametrize("token", [MAX_TOKEN + 1, 2**63, 2**64, -(2**63), 10**400], ids=short)
def test_tokens_out_of_range_are_refused(fence_contract_seeded: Any, token: int) -> None:
    store, _ = fence_contract_seeded
    lease = Lease("live", token, "b")
    for call in [*lease_calls(store, lease), lambda: store.recover(Abandoned("live", token, None, 0), 1)]:
        refused_cleanly(store, call, InvalidArgument)


@pytest.mark.parametrize(
    "seen",
    [
        None,
        ("live", 1),
        Abandoned("live", 1, None, -1),
        Abandoned("live", 1, None, 2**63),
        Abandoned("live", 1, None, "0"),  # type: ignore[arg-type]
    ],
    ids=repr,
)
def test_bad_recover_arguments_are_refused(fence_contract_seeded: Any, seen: Any) -> None:
    store, _ = fence_contract_seeded
    refused_cleanly(store, lambda: store.recover(seen, 1), InvalidArgument)


@pytest.mark.parametrize("bound", [-1, 2**63, "3", None, 1.5, 10**400], ids=short)
def test_bad_recovery_bounds_are_refused(fence_contract_seeded: Any, bound: Any) -> None:
    store, live = fence_contract_seeded
    seen = Abandoned("live", live.token, None, 0)
    refused_cleanly(store, lambda: store.recover(seen, bound), InvalidArgument)
    refused_cleanly(store, lambda: store.recover(seen, 1, reason=7), InvalidArgument)
