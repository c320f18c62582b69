"""The store contract, audit role (``AuditStore``): the history of every key."""

from __future__ import annotations

import math
from typing import Any

from celery_fence.stores.base import AuditStore

from .checks import TTL

REQUIRES = (AuditStore,)


def test_history_is_ordered_by_store_time(fence_contract_store: Any, fence_contract_expire: Any) -> None:
    store, expire = fence_contract_store, fence_contract_expire
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
