"""The store operations that the reconnect tests run after the server ended a store's idle connections."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery_fence.lease import Lease

TTL = 30.0

OPERATIONS: dict[str, Callable[[Any, Lease], object]] = {
    "acquire": lambda store, lease: store.acquire("other", "b", TTL),
    "renew": lambda store, lease: store.renew([lease], TTL),
    "complete": lambda store, lease: store.complete(lease, "done"),
    "release": lambda store, lease: store.release(lease),
    "save_step": lambda store, lease: store.save_step(lease, "s", 1),
    "steps": lambda store, lease: store.steps("k"),
    "get": lambda store, lease: store.get("k"),
    "history": lambda store, lease: store.history("k"),
    "leases": lambda store, lease: store.leases(),
    "abandoned": lambda store, lease: store.abandoned(0.0),
    "strand": lambda store, lease: store.strand("gave-up", None, "the store was down"),
}


def run_and_check(store: Any, lease: Lease, operation: str) -> None:
    """Run ``operation`` on ``lease`` (of key ``k``) and check that a write took effect."""
    OPERATIONS[operation](store, lease)
    wrote = {"complete": "complete", "release": "release", "save_step": "step"}.get(operation)
    assert wrote is None or store.history("k")[-1].event == wrote
