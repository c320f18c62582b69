"""A store whose server is down says so, as StoreUnavailable, from every operation, and works again once
the server is back: the server crashed with the store's connections idle (so each has to be replaced, and
replacing it fails while the server is down)."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from celery_fence import ConfigurationError, Lease, StoreUnavailable, open_store

from ..servers.restartable import RESTARTABLE, restartable_store
from ..support.reconnect import OPERATIONS, TTL, run_and_check


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


@pytest.mark.parametrize(
    ("store_name", "wrong", "says"),
    [
        ("postgresql", {"database": "fence_no_such_db"}, "the database 'fence_no_such_db' does not exist"),
        ("postgresql", {"username": "fence_no_such_role"}, "the role 'fence_no_such_role' does not exist"),
        ("redis", {"database": "99"}, "no such database"),
    ],
)
def test_what_no_wait_can_heal_is_a_configuration_error_from_every_operation(
    store_name: str, wrong: dict[str, str], says: str, request: pytest.FixtureRequest
) -> None:
    """A database, or role, the server does not have: waiting cannot make it, so it is not
    StoreUnavailable (which a run waits out for fence_store_wait) but ConfigurationError, naming it."""
    url = make_url(
        request.getfixturevalue("postgres_url" if store_name == "postgresql" else "redis_server_url")
    )
    store = open_store(url.set(**wrong).render_as_string(hide_password=False))
    try:
        for operation in sorted(OPERATIONS):
            with pytest.raises(ConfigurationError, match=says):
                OPERATIONS[operation](store, Lease("k", 1, "a"))
    finally:
        store.close()
