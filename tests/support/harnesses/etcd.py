"""The etcd harness, on a private ``etcd`` (tests/servers/etcd.py), never the system one on 2379.

The server is the session's ``private_etcd`` fixture. Each test
opens its store under a prefix of its own, carried in the URL (``etcd://127.0.0.1:PORT/<prefix>/``) so other
processes reach the same keys; its etcd leases are revoked and its keys deleted afterwards. "Every live
lease expires now" is a revoke of the store's etcd leases: their lock keys are gone, as after a ttl.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_fence.lease import MAX_TOKEN
from celery_fence.stores.etcd import EtcdStore
from celery_fence.stores.etcd.gateway import put
from celery_fence.testing import StoreHarness as Harness

from ...servers.etcd import EtcdServer, open_store_at


def shared_server(request: pytest.FixtureRequest) -> EtcdServer:
    """The session's private etcd (the ``private_etcd`` fixture), started on first use."""
    server: EtcdServer = request.getfixturevalue("private_etcd")
    return server


def open_etcd_store(request: pytest.FixtureRequest) -> Iterator[EtcdStore]:
    """A store under a fresh prefix on the shared server; its leases and keys are gone afterwards."""
    yield from open_store_at(shared_server(request).url(f"t{uuid.uuid4().hex[:12]}/"))


def _open(request: pytest.FixtureRequest) -> Iterator[Any]:
    yield from open_etcd_store(request)


def _expire(store: Any) -> None:
    store.etcd_leases.revoke_all()


def near_the_top(store: EtcdStore, left: int) -> None:
    """The token offset moved as ``advance`` would, past its headroom check (2**32 below the top, which only
    2**32 more revisions would cross): the next revision's token is ``left`` below 2**53 - 1."""
    space = store.space
    revision, epochs = space.read([]).revision, space.epochs
    _, value = epochs.advanced(MAX_TOKEN - left - (revision + 1) - epochs.offset)
    assert space.gateway.txn([space.offset_is(epochs)], [put(space.offset_key, value)]).succeeded
    space.read([])  # the store's cached epochs: the new one


HARNESS = Harness(
    "etcd", _open, _expire, expired_lease_survives=False, multiprocess=True, near_the_top=near_the_top
)
