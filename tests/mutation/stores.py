"""A pytest plugin for the mutation runs (``-p tests.mutation.stores``): the contract tests run on the stores
named in ``FENCE_MUTATION_STORES`` only (default ``memory,sqlite``: no server to start, no network), so one
pass of the backing tests takes about a minute. Tests that are not parametrised by store are all kept."""

from __future__ import annotations

import os

import pytest

STORES = frozenset(os.environ.get("FENCE_MUTATION_STORES", "memory,sqlite").split(","))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    kept, dropped = [], []
    for item in items:
        harness = getattr(getattr(item, "callspec", None), "params", {}).get("harness")
        (dropped if harness is not None and harness not in STORES else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
