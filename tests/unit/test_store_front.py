"""The checked front ``open_store`` puts every store behind: a store registered under the entry point group
with no argument check of its own refuses bad input as the built-in stores do, and the front hides nothing
of the store (its roles, its attributes, its class)."""

from __future__ import annotations

from typing import Any

import pytest

from celery_fence import stores
from celery_fence.errors import InvalidArgument
from celery_fence.lease import Abandoned, Lease
from celery_fence.stores.base import AdminStore, AuditStore, RecoveryStore, RunStore, lacking
from celery_fence.stores.memory import MemoryStore

RUN_METHODS = ("migrate", "acquire", "renew", "complete", "release", "save_step", "steps", "refuse", "get")


class Unchecked(MemoryStore):
    """A third party's store that checks nothing: every call reaching it is recorded."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.reached: list[str] = []

    def acquire(self, *args: Any, **kwargs: Any) -> Lease:
        self.reached.append("acquire")
        return super().acquire(*args, **kwargs)

    def prune(self, older_than: float) -> int:
        self.reached.append("prune")
        return super().prune(older_than)


class RunOnly:
    """A third party's store with the run's role only."""

    def __init__(self, url: str) -> None:
        inner = MemoryStore()
        self.url, self.max_value_bytes = url, inner.max_value_bytes
        for name in (*RUN_METHODS, "close"):
            setattr(self, name, getattr(inner, name))


class _EntryPoint:
    def __init__(self, name: str, target: Any) -> None:
        self.name, self.target, self.module, self.extras = name, target, "third_party", []

    def load(self) -> Any:
        return self.target


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    points = [_EntryPoint("unchecked", Unchecked), _EntryPoint("runonly", RunOnly)]
    monkeypatch.setattr(stores, "entry_points", lambda *, group: points)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: s.acquire("", "o", 1), "a lease key must have 1 to 1024 characters, got 0"),
        (lambda s: s.acquire("k", "o\x00", 1), "an owner name must not contain NUL"),
        (lambda s: s.acquire("k", "o", float("nan")), "ttl must be a positive number of seconds"),
        (lambda s: s.renew("not leases", 1), "expected a sequence of Leases, not str"),
        (lambda s: s.complete(Lease("k", 0, "o"), 1), "a lease token is an int from 1 to 2**53 - 1"),
        (lambda s: s.save_step(Lease("k", 1, "o"), "", 1), "a step name is a str of 1 to 200 characters"),
        (lambda s: s.refuse(Lease("k", 1, "o"), "\ud800"), "what was refused must be valid Unicode"),
        (lambda s: s.history(7), "a lease key must be a str, not int"),
        (lambda s: s.prune(-1), "an age is a number of seconds from 0 to"),
        (lambda s: s.advance(0), "gap must be a positive int up to 2**53 - 1"),
        (lambda s: s.abandoned(1, limit=0), "limit must be an int from 1 to"),
        (lambda s: s.recover(Abandoned("k", 1, None, 0), -1), "max_recoveries must be an int from 0 to"),
        (lambda s: s.strand("k", None, "a\x00"), "a give-up reason must not contain NUL"),
    ],
)
def test_a_store_that_checks_nothing_refuses_bad_input_through_open_store(
    registered: None, call: Any, message: str
) -> None:
    store = stores.open_store("unchecked://")
    with pytest.raises(InvalidArgument) as info:
        call(store)
    assert message in str(info.value)
    assert store.inner.reached == [] and store.history() == []  # refused before the store saw it


def test_the_front_passes_checked_calls_and_hides_nothing_of_the_store(registered: None) -> None:
    store = stores.open_store("unchecked://")
    lease = store.acquire("k", "o", 30)
    assert store.prune(0) == 0 and store.inner.reached == ["acquire", "prune"]
    assert isinstance(store, Unchecked) and store.url == "unchecked://" and store.get("k") is not None
    assert lease.token == 1


def test_a_role_the_store_lacks_is_lacking_on_the_front_too(registered: None) -> None:
    store = stores.open_store("runonly://")
    assert lacking(store, RunStore) == []
    assert lacking(store, AdminStore) == ["leases", "force_release", "prune", "advance"]
    assert lacking(store, RecoveryStore) == ["abandoned", "recover", "strand"]
    assert lacking(store, AuditStore) == ["history"]
    assert not hasattr(store, "transaction")
