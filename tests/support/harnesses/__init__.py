"""One harness per store: how the contract suite opens it, makes time pass, and cleans up. Each store's is
in a module of its own here (``memory``, ``sql``, ``redis``, ...); ``HARNESSES`` names every one the tests
run on by default, and ``run_only`` holds a store with the run role alone.

The suite itself ships in the package (``celery_fence.testing.contract``, run by
tests/contract/test_store_suite.py), as a third party's store runs it. Adding a store to the suite means
adding a harness here and naming it in ``HARNESSES``; the tests are never copied.
"""

from __future__ import annotations

import importlib
import os

from celery_fence.testing import StoreHarness as Harness

from . import memory, sql

__all__ = ["HARNESSES", "WITH_TRANSACTIONS", "Harness"]

HARNESSES: dict[str, Harness] = {
    "memory": memory.HARNESS,
    "sqlite": sql.SQLITE,
    "postgresql": sql.POSTGRESQL,
}

# The harnesses whose stores have ``transactions`` (celery_fence/stores/capabilities.py: a run's transaction
# in the tasks' SQL database), which ``pytest.mark.stores(transactions=True)`` chooses. postgresql-ha is not
# among them: make contract-pg-ha runs on it the tests that choose no stores.
WITH_TRANSACTIONS = ("sqlite", "postgresql")

if os.environ.get("FENCE_TEST_PG_HA"):  # a primary and a standby: make contract-pg-ha, not make test
    HARNESSES["postgresql-ha"] = importlib.import_module(f"{__name__}.postgresql_ha").HARNESS

# Other stores bring their harness in a module of their own: tests/support/harnesses/<store>.py defining
# HARNESS (a Harness); a module that is not there yet simply adds nothing.
for _name in ("redis", "etcd", "etcd_cluster", "redis_cluster"):
    try:
        _module = importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as _exc:
        if _exc.name != f"{__name__}.{_name}":
            raise
    else:
        HARNESSES[_name] = _module.HARNESS
