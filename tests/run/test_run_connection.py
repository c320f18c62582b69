"""The connection of a run's transaction on the SQL stores, through the run's handle (``Fence``): a
hand-made ``rollback()`` is refused and leaves the run's transaction whole (claim C3), and on PostgreSQL its
session ends a paused holder's transaction after one lease ttl, not later (claim C47). Each test fails when
the line that makes its claim true is changed (docs/reliability.md, "Mutation testing")."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from celery_fence import LeaseHeld, StoreUnavailable, UsageError
from celery_fence.fence import Fence
from celery_fence.testing import wait_for

pytestmark = pytest.mark.stores(transactions=True)


def test_a_hand_made_rollback_is_refused_and_the_runs_transaction_stays_whole(store: Any) -> None:
    fence = Fence(store, store.acquire("rolls-back", "a", 30.0), None, 30.0)
    with fence.transaction() as conn:  # the guard records "write" in the run's transaction
        with pytest.raises(UsageError, match=r"rollback\(\)"):
            conn.rollback()
        conn.execute(text("SELECT 1"))  # the connection is still the run's
    fence.step("after", lambda: 2)  # joins the run's transaction: it is still open
    fence.commit("done")
    assert [e.event for e in store.history("rolls-back")] == ["acquire", "write", "step", "complete"]
    assert store.steps("rolls-back") == {"after": 2}  # the refused rollback undid nothing


@pytest.mark.stores("postgresql")
def test_a_paused_holders_session_gives_up_its_transaction_after_one_ttl(store: Any) -> None:
    ttl = 1.5
    fence = Fence(store, store.acquire("paused-bound", "a", ttl), None, ttl)
    try:
        with fence.transaction() as conn:
            setting = conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar()
        assert setting == "1500ms"  # the run's session ends an idle transaction after the lease ttl

        def taken_over() -> Any:  # the holder stays quiet; a taker polls
            try:
                return store.acquire("paused-bound", "b", 30.0)
            except LeaseHeld:
                return None

        # A deadline, not a measurement: the order on the store's clock is test_paused_holder.py's.
        wait_for(taken_over, 3 * ttl + 10, "the paused holder's session to give its row up")
        with pytest.raises(StoreUnavailable):  # the server ended its session: nothing of it commits
            fence.commit("a's result")
    finally:
        fence.abort()  # a failed test leaves no open transaction behind
