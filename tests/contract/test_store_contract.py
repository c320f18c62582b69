"""The run role of the shipped store contract (``celery_fence.testing.contract.run_role``) on a store with
that role only (run_only.py): a run needs nothing more of a store. test_store_suite.py runs the same tests
on every built-in store."""

from __future__ import annotations

import pytest

from celery_fence.stores.base import AdminStore, AuditStore, RecoveryStore, RunStore, lacking
from celery_fence.testing.contract.run_role import *  # noqa: F403

from ..support.harnesses.run_only import RUN_ONLY

pytestmark = pytest.mark.stores(RUN_ONLY.name)


def test_the_run_only_store_has_the_run_role_and_no_other() -> None:
    """So the run-role tests, passing on it, show what a third party's minimal store must do."""
    store = next(RUN_ONLY.open(None))  # type: ignore[arg-type]
    assert isinstance(store, RunStore)
    assert [role.__name__ for role in (AuditStore, AdminStore, RecoveryStore) if lacking(store, role)] == [
        "AuditStore",
        "AdminStore",
        "RecoveryStore",
    ]
