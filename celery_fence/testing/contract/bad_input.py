"""Bad input at every public entry point: a clear FenceError subclass, and every store unchanged
(a dump of leases, history and steps is compared before and after)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from celery_fence import (
    InvalidArgument,
    Lease,
    NotSerializable,
)

from .checks import EVERY_ROLE, TTL, lease_calls, refused_cleanly

REQUIRES = EVERY_ROLE  # dump() reads leases, history and steps

BAD_KEYS = ["", "x" * 1025, None, 7, 1.5, b"bytes", ["k"], {"k": 1}]
BAD_TTLS = [0, -1, -0.0, math.nan, math.inf, -math.inf, "5", True, None, [1]]
# bytes are carried, as in Celery's JSON (run_role.py: results ... keep the types)
UNSERIALIZABLE = [object(), {1, 2}, 1 + 2j, math.nan, {"a": object()}, {(1, 2): "tuple key"}]
OVERSIZE = "x" * (16 * 1024 * 1024 + 1)


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_everywhere(fence_contract_seeded: Any, key: Any) -> None:
    store, _ = fence_contract_seeded
    calls = [
        lambda: store.acquire(key, "a", TTL),
        lambda: store.get(key),
        lambda: store.steps(key),
        lambda: store.force_release(key),
    ]
    if key is not None:  # history(None) is every key's history
        calls.append(lambda: store.history(key))
    for call in calls:
        refused_cleanly(store, call, InvalidArgument)


@pytest.mark.parametrize("ttl", BAD_TTLS)
def test_bad_ttls_everywhere(fence_contract_seeded: Any, ttl: Any) -> None:
    store, live = fence_contract_seeded
    refused_cleanly(store, lambda: store.acquire("new", "a", ttl), InvalidArgument)
    refused_cleanly(store, lambda: store.renew([live], ttl), InvalidArgument)


@pytest.mark.parametrize("value", [*UNSERIALIZABLE, OVERSIZE], ids=lambda v: type(v).__name__)
def test_unserializable_and_oversize_values(fence_contract_seeded: Any, value: Any) -> None:
    store, live = fence_contract_seeded
    refused_cleanly(store, lambda: store.complete(live, value), NotSerializable)
    refused_cleanly(store, lambda: store.save_step(live, "s", value), NotSerializable)
    refused_cleanly(
        store, lambda: store.acquire("new", "a", TTL, {"task": "t", "args": [value]}), NotSerializable
    )


@pytest.mark.parametrize(
    "lease",
    [
        None,
        "live",
        ("live", 1),
        Lease("live", 0, "a"),
        Lease("live", -3, "a"),
        Lease("", 1, "a"),
        Lease("live", True, "a"),
        Lease(None, 1, "a"),  # type: ignore[arg-type]
    ],
    ids=repr,
)
def test_bad_leases_everywhere(fence_contract_seeded: Any, lease: Any) -> None:
    store, _ = fence_contract_seeded
    for call in lease_calls(store, lease):
        refused_cleanly(store, call, InvalidArgument)


@pytest.mark.parametrize("name", ["", None, 5, "x" * 201])
def test_bad_step_names(fence_contract_seeded: Any, name: Any) -> None:
    store, live = fence_contract_seeded
    refused_cleanly(store, lambda: store.save_step(live, name, 1), InvalidArgument)


@pytest.mark.parametrize("gap", [0, -1, 1.5, "10", True, None])
def test_bad_advance_gaps(fence_contract_seeded: Any, gap: Any) -> None:
    store, _ = fence_contract_seeded
    refused_cleanly(store, lambda: store.advance(gap), InvalidArgument)


@pytest.mark.parametrize("age", [-1, math.nan, math.inf, "1d", None])
def test_bad_prune_ages(fence_contract_seeded: Any, age: Any) -> None:
    store, _ = fence_contract_seeded
    refused_cleanly(store, lambda: store.prune(age), InvalidArgument)
