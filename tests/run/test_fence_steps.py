"""The run's handle on the SQL stores, where the mutation run found fence.py untested (docs/reliability.md,
"Mutation testing"): an ``atomic_step`` outside and inside the run's transaction (its arguments, its writes
and record committed together, its value reused and never shared), a step's value never shared with the
caller, the renewer's pin while the transaction is open, and a transaction begun again after a failed
first block."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from celery_fence import LeaseLost, StaleToken
from celery_fence.fence import Fence
from celery_fence.lease import Lease
from tests.support.harnesses import Harness

PAID = "fence_test_step_payments"


pytestmark = pytest.mark.stores(transactions=True)


@pytest.fixture
def paid(store: Any) -> Iterator[Any]:
    """The payments written (``what`` of each row), read in a connection of its own."""
    with store.engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {PAID} (key TEXT, what TEXT)"))

    def read() -> list[str]:
        with store.engine.connect() as conn:
            return list(conn.execute(text(f"SELECT what FROM {PAID} ORDER BY what")).scalars())

    yield read
    with store.engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {PAID}"))


def pay(conn: Any, amount: int, *, note: str) -> dict[str, list[int]]:
    conn.execute(text(f"INSERT INTO {PAID} VALUES ('k', :w)"), {"w": f"{amount}:{note}"})
    return {"paid": [amount]}


class Beat:
    """The renewer as the handle sees it: a local deadline for its own lease only, and its pins."""

    def __init__(self, lease: Lease, deadline: float) -> None:
        self.lease, self._deadline, self.calls = lease, deadline, []

    def deadline(self, lease: Lease) -> float | None:
        return self._deadline if lease == self.lease else None

    def pin(self, lease: Lease) -> None:
        self.calls.append(("pin", lease))

    def unpin(self, lease: Lease) -> None:
        self.calls.append(("unpin", lease))


def _reused(fence: Fence, name: str, stored: Any) -> None:
    """The step ``name`` comes back as ``stored``, however the caller changed what it got before."""
    for _ in range(2):
        again = fence.atomic_step(name, pay, 99, note="never")
        assert again == stored
        again["paid"].append(-1)  # callers may mutate what they get: the next call must not see it


def test_an_atomic_step_commits_its_writes_with_its_record_and_runs_once(store: Any, paid: Any) -> None:
    fence = Fence(store, store.acquire("k", "a", 30.0), None, 30.0)
    got = fence.atomic_step("pay", pay, 5, note="x")
    assert got == {"paid": [5]} and paid() == ["5:x"]  # committed at once, with the arguments given
    got["paid"].append(-1)
    _reused(fence, "pay", {"paid": [5]})
    assert paid() == ["5:x"] and store.steps("k") == {"pay": {"paid": [5]}}
    assert [(e.event, e.detail) for e in store.history("k")] == [("acquire", None), ("step", "pay")]
    later = Fence(store, store.acquire("k", "a", 30.0), None, 30.0)  # a later attempt of the same owner
    assert later.atomic_step("pay", pay, 6, note="y") == {"paid": [5]} and paid() == ["5:x"]


def test_an_atomic_step_in_the_runs_transaction_commits_with_the_completion(store: Any, paid: Any) -> None:
    fence = Fence(store, store.acquire("k", "a", 30.0), None, 30.0)
    with fence.transaction() as conn:
        conn.execute(text(f"INSERT INTO {PAID} VALUES ('k', 'first')"))
    got = fence.atomic_step("ledger", pay, 7, note="j")
    assert got == {"paid": [7]}  # joined: it commits with the completion (SQLite: the run holds its lock)
    got["paid"].append(-1)
    _reused(fence, "ledger", {"paid": [7]})
    fence.commit("done")
    assert paid() == ["7:j", "first"] and store.steps("k") == {"ledger": {"paid": [7]}}
    history = [(e.event, e.detail) for e in store.history("k")]
    assert history == [("acquire", None), ("write", None), ("step", "ledger"), ("complete", None)]


def test_a_stale_completion_is_refused_and_recorded_as_one(store: Any, harness: Harness) -> None:
    fence = Fence(store, store.acquire("k", "a", 30.0), None, 30.0)
    harness.expire_all(store)
    store.acquire("k", "b", 30.0)  # taken over: a's completion must not commit
    with pytest.raises(StaleToken):
        fence.commit("a's result")
    assert [(e.event, e.owner, e.detail) for e in store.history("k")][-1] == ("refused", "a", "complete")
    state = store.get("k")
    assert state is not None and not state.done and state.owner == "b"


def test_a_steps_value_is_never_shared_with_its_caller(store: Any) -> None:
    fence = Fence(store, store.acquire("k", "a", 30.0), None, 30.0)
    first = fence.step("total", lambda: {"items": [1]})
    first["items"].append(2)
    second = fence.step("total", lambda: {"items": ["not run"]})
    second["items"].append(3)
    assert fence.step("total", lambda: {"items": ["not run"]}) == {"items": [1]}


def test_the_renewer_is_pinned_while_the_runs_transaction_is_open(store: Any) -> None:
    lease = store.acquire("k", "a", 30.0)
    beat = Beat(lease, time.monotonic() + 3600)
    fence = Fence(store, lease, beat, 30.0)
    with fence.transaction() as conn:
        conn.execute(text("SELECT 1"))
    assert beat.calls == [("pin", lease)]
    fence.abort()
    assert beat.calls == [("pin", lease), ("unpin", lease)]


def test_the_local_deadline_of_its_own_lease_fences_the_run(store: Any) -> None:
    lease = store.acquire("k", "a", 30.0)
    fence = Fence(store, lease, Beat(lease, time.monotonic() - 0.001), 30.0)
    with pytest.raises(LeaseLost, match="no successful renew before the local deadline"):
        fence.check()


def test_a_failed_first_block_is_begun_again(store: Any, paid: Any) -> None:
    fence = Fence(store, store.acquire("k", "a", 30.0), None, 30.0)
    with pytest.raises(ZeroDivisionError), fence.transaction() as conn:
        conn.execute(text(f"INSERT INTO {PAID} VALUES ('k', 'undone')"))
        _ = 1 / 0
    with fence.transaction() as conn:  # nothing was lost: a new transaction, not a refusal
        conn.execute(text(f"INSERT INTO {PAID} VALUES ('k', 'again')"))
    fence.commit("done")
    assert paid() == ["again"] and store.get("k").done
