"""What the store contract suite (``celery_fence.testing.contract``) needs to know about a store: how to
open one, how to make every live lease expire now, and what the store honestly cannot do."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

__all__ = ["StoreHarness"]


def _one_scope(key: str) -> object:
    return None


@dataclass(frozen=True)
class StoreHarness:
    """One store under the contract suite; return it from your ``fence_contract_harness`` fixture.

    ``open(request)`` is a generator: it yields a fresh, empty store for one test and cleans up after the
    ``yield`` (``request`` is the test's, for ``tmp_path`` or a server fixture). ``expire_all(store)`` makes
    every live lease of that store expire now, by moving the store's own clock or stored expiry into the
    past (never by sleeping). ``expired_lease_survives``: renewing or completing an expired lease that
    nobody took over still succeeds (False on etcd, whose expired lock key is gone). ``multiprocess``:
    other processes open the same store with ``open_store(store.url)`` (a store registered under the
    ``celery_fence.stores`` entry point), so the token race runs in processes, else in threads on the one
    store. ``token_scope(key)``: the keys whose tokens one counter orders (the whole store by default; a
    Redis Cluster's slot). ``marks``: pytest marks for a parametrized fixture's ``pytest.param``.
    ``near_the_top(store, left)``: set the store's counter ``left`` tokens below 2**53 - 1 where its own
    ``advance`` refuses to (etcd keeps headroom for the revisions still to come); ``None``: by ``advance``.
    """

    name: str
    open: Callable[[pytest.FixtureRequest], Iterator[Any]]
    expire_all: Callable[[Any], None]
    expired_lease_survives: bool = True
    multiprocess: bool = True
    marks: tuple[Any, ...] = ()
    token_scope: Callable[[str], object] = _one_scope
    near_the_top: Callable[[Any, int], None] | None = None
