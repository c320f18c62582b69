"""A store whose server is down says so, as StoreUnavailable, from every operation, and works again once
the server is back: the server crashed with the store's connections idle (so each has to be replaced, and
replacing it fails while the server is down)."""

from __future__ import annotations

import pytest

from celery_fence import StoreUnavailable

from .reconnect import OPERATIONS, TTL, run_and_check
from .restartable import RESTARTABLE, restartable_store


@pytest.mark.parametrize("name", RESTARTABLE)
def test_every_operation_is_store_unavailable_while_the_server_is_down(
    name: str, request: pytest.FixtureRequest
) -> None:
    with restartable_store(name, request) as (store, server):
        lease = store.acquire("k", "a", TTL)
        store.renew([lease], TTL)
        store.history("k")  # every connection the store keeps: opened, then idle
        server.crash()
        failures = {}
        for operation in sorted(OPERATIONS):
            with pytest.raises(StoreUnavailable) as raised:
                OPERATIONS[operation](store, lease)
            failures[operation] = raised.value
        assert len(failures) == len(OPERATIONS)
        server.start()
        run_and_check(store, store.acquire("k2", "b", TTL), "renew")
        run_and_check(store, lease, "complete")
