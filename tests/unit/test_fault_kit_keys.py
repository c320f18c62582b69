"""The fault kit's ``keys``: a fault that hits only the calls on the keys it names, so a short test can give
each of its keys a fault it is sure to meet (tests/chaos' short form), instead of a draw that may miss."""

from __future__ import annotations

import pytest

from celery_fence import InvalidArgument, StoreUnavailable
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import Fault, IndeterminateStore, Outcome


def test_a_fault_with_keys_hits_only_the_calls_on_those_keys() -> None:
    store = IndeterminateStore(MemoryStore(), [Fault(Outcome.BEFORE, method="acquire", rate=1.0, keys=["b"])])
    store.acquire("a", "w1", 30.0)
    with pytest.raises(StoreUnavailable):
        store.acquire("b", "w1", 30.0)
    assert store.hits == [(2, "acquire", Outcome.BEFORE)]


def test_per_key_faults_planned_for_each_key_fire_once_on_each() -> None:
    plan = [Fault(Outcome.BEFORE, method="acquire", rate=1.0, per_key=True, keys=[k]) for k in ("a", "b")]
    store = IndeterminateStore(MemoryStore(), plan)
    for key in ("a", "b"):
        with pytest.raises(StoreUnavailable):
            store.acquire(key, "w1", 30.0)
        store.acquire(key, "w1", 30.0)  # its one fault fired: the next call goes through
    assert [method for _, method, _ in store.hits] == ["acquire", "acquire"]


@pytest.mark.parametrize("keys", ["order:1", [1, 2]])
def test_keys_that_are_not_a_list_of_key_strings_are_refused(keys: object) -> None:
    with pytest.raises(InvalidArgument, match="list of lease keys"):
        Fault(Outcome.BEFORE, method="acquire", keys=keys)  # type: ignore[arg-type]
