"""``strand`` on PostgreSQL (the rest of its contract ships in ``celery_fence.testing.contract.strand``, run
by test_store_suite.py on every store): a row that a run's transaction locks is a leased key."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from celery_fence.fence import Fence
from celery_fence.testing.contract.checks import TTL
from celery_fence.testing.contract.strand import REASON, RUN


@pytest.mark.stores("postgresql")
def test_a_row_a_runs_transaction_locks_is_left_alone(store: Any) -> None:
    """The statement does not wait behind the holder's open transaction: a locked row is a leased key."""
    lease = store.acquire("k", "a", TTL)
    fence = Fence(store, lease, None, TTL)
    with fence.transaction() as conn:
        conn.execute(text("SELECT 1"))  # the guard locked the row until the run's completion
        assert store.strand("k", RUN, REASON) is False
    fence.commit("ok")
    assert [e.event for e in store.history("k")] == ["acquire", "write", "complete"]
