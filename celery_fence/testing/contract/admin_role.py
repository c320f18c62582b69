"""The store contract, administration role (``AdminStore``): leases, force_release, prune, advance."""

from __future__ import annotations

from typing import Any

import pytest

from celery_fence import (
    InvalidArgument,
    StaleToken,
)
from celery_fence.stores.base import AdminStore

from .checks import TTL

REQUIRES = (AdminStore,)


def test_force_release_fences_out_the_holder(fence_contract_store: Any) -> None:
    store = fence_contract_store
    lease = store.acquire("k", "a", TTL)
    token = store.force_release("k")
    assert token > lease.token
    with pytest.raises(StaleToken):
        store.complete(lease, 1)
    assert store.acquire("k", "b", TTL).token > token
    with pytest.raises(InvalidArgument):
        store.force_release("nobody")


def test_prune_never_rewinds_tokens(fence_contract_store: Any) -> None:
    store = fence_contract_store
    lease = store.acquire("k", "a", TTL)
    store.complete(lease, 1)
    assert store.prune(0.0) >= 1
    assert store.get("k") is None
    assert store.acquire("k", "b", TTL).token > lease.token


def test_advance_moves_the_counter_forward(fence_contract_store: Any) -> None:
    store = fence_contract_store
    lease = store.acquire("a", "w", TTL)
    floor = store.advance(1000)
    assert floor >= lease.token + 1000
    assert store.acquire("b", "w", TTL).token > floor


def test_leases_lists_every_key(fence_contract_store: Any) -> None:
    store = fence_contract_store
    store.acquire("b", "w", TTL)
    done = store.acquire("a", "w", TTL)
    store.complete(done, 1)
    states = {s.key: s for s in store.leases()}
    assert states["a"].done and not states["b"].done
