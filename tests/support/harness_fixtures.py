"""The fixtures that put a test on a store harness (tests/support/harnesses/), shared by tests/contract,
tests/stores and tests/run: each of their conftests imports them, and ``pytest_generate_tests``, which gives
``harness`` the stores a test chooses with the ``stores`` mark (every harness without one). ``store`` and
``expire`` come from the shipped plugin's ``fence_contract_*``.

``pytest.mark.stores(*names, transactions=False)``: the harnesses named, and with ``transactions=True`` the
stores whose runs have a transaction in the tasks' SQL database (``Capabilities.transactions``). On a module
(``pytestmark``) it chooses for every test there; on a test, for that test. A test that parametrizes
``harness`` itself (``indirect=True``) keeps its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from tests.support.harnesses import HARNESSES, WITH_TRANSACTIONS, Harness
from tests.support.harnesses.run_only import RUN_ONLY

# What a stores mark may name: every store's harness, and the store with the run role alone.
NAMED: dict[str, Harness] = {**HARNESSES, RUN_ONLY.name: RUN_ONLY}


def chosen(mark: pytest.Mark | None) -> list[str]:
    """The harness names a ``stores`` mark chooses, in name order; every harness without a mark."""
    if mark is None:
        return sorted(HARNESSES)
    options = dict(mark.kwargs)
    transactions = options.pop("transactions", False)
    unknown = [name for name in mark.args if name not in NAMED]
    if options or unknown:
        wrong = f"no harness {unknown} and no option {sorted(options)}"
        raise pytest.UsageError(f"{mark}: {wrong} (harnesses: {sorted(NAMED)})")
    return sorted({*mark.args, *(WITH_TRANSACTIONS if transactions else ())})


def _argnames(mark: pytest.Mark) -> Sequence[str]:
    names = mark.args[0] if mark.args else mark.kwargs["argnames"]
    return [name.strip() for name in names.split(",")] if isinstance(names, str) else names


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    own = any("harness" in _argnames(mark) for mark in metafunc.definition.iter_markers("parametrize"))
    if "harness" not in metafunc.fixturenames or own:
        return
    names = chosen(metafunc.definition.get_closest_marker("stores"))
    params = [pytest.param(name, marks=NAMED[name].marks) for name in names]
    metafunc.parametrize("harness", params, indirect=True)


@pytest.fixture
def harness(request: pytest.FixtureRequest) -> Harness:
    return NAMED[request.param]


@pytest.fixture
def fence_contract_harness(harness: Harness) -> Harness:
    """The shipped contract suite (test_store_suite.py) on this directory's harnesses: every store."""
    return harness


@pytest.fixture
def store(fence_contract_store: Any) -> Any:
    return fence_contract_store


@pytest.fixture
def expire(fence_contract_expire: Any) -> Any:
    return fence_contract_expire
