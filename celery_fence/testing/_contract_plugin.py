"""The store contract suite's fixtures, part of the pytest plugin: ``fence_contract_harness`` (yours to
define), and the store, expiry and seeded store that the suite's tests take from it."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ..stores.base import CommitStore, lacking
from ..stores.capabilities import capabilities_of
from ..stores.front import checked
from ._harness import StoreHarness


@pytest.fixture
def fence_contract_harness() -> StoreHarness:
    """Your store under the contract suite: define this fixture (parametrize it for several stores)."""
    pytest.fail(
        "the store contract suite needs a fence_contract_harness fixture returning a "
        "celery_fence.testing.StoreHarness for your store (docs/stores.md, 'A store of your own')",
        pytrace=False,
    )


@pytest.fixture
def fence_contract_store(
    fence_contract_harness: StoreHarness, request: pytest.FixtureRequest
) -> Iterator[Any]:
    """A fresh store from the harness, behind the checked front ``open_store`` puts it behind; a test of a
    role the store does not have is skipped."""
    opened = fence_contract_harness.open(request)
    store = checked(next(opened))
    try:
        needed = getattr(sys.modules[request.function.__module__], "REQUIRES", ())
        missing = [role.__name__ for role in needed if _lacks(store, role)]
        if missing:
            pytest.skip(f"{fence_contract_harness.name} has no {', '.join(missing)} role")
        yield store
    finally:
        for _ in opened:  # the harness's cleanup, after its yield
            pass


def _lacks(store: Any, role: type) -> bool:
    """Whether ``store`` lacks ``role``: a method of it, or (``CommitStore``) the capability it declares
    (``fenced_commit="no"``: a store with the methods, such as Django's, may still not fence a commit)."""
    if lacking(store, role):
        return True
    return role is CommitStore and capabilities_of(store).fenced_commit == "no"


@pytest.fixture
def fence_contract_expire(
    fence_contract_harness: StoreHarness, fence_contract_store: Any
) -> Callable[[], None]:
    """Call it and every live lease of ``fence_contract_store`` has expired (by store time)."""
    return lambda: fence_contract_harness.expire_all(fence_contract_store)


@pytest.fixture
def fence_contract_seeded(fence_contract_store: Any, fence_contract_expire: Callable[[], None]) -> Any:
    """``(store, live lease)``: a store holding a live lease, a finished key, a step and a refusal."""
    from .contract.checks import seed  # the suite (and hypothesis) only once a test asks for it

    return seed(fence_contract_store, fence_contract_expire)
