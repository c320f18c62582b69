"""``atomic_step`` on the SQL stores: a worker killed after ``fn``'s writes and before the step record leaves
neither, and the attempt that takes over does the effect once (README, guarantees.md; claims.md C5)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from celery_fence import open_store
from celery_fence.fence import Fence
from tests.support.forked import exit_code_of
from tests.support.harnesses import Harness

EFFECTS = "fence_test_atomic_effects"


pytestmark = pytest.mark.stores(transactions=True)


@pytest.fixture
def table(store: Any) -> Iterator[str]:
    with store.engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {EFFECTS} (key TEXT, token BIGINT)"))
    yield EFFECTS
    with store.engine.begin() as conn:
        conn.execute(text(f"DROP TABLE {EFFECTS}"))


def _pay(conn: Any, key: str, token: int, die: bool) -> int:
    conn.execute(text(f"INSERT INTO {EFFECTS} VALUES (:k, :t)"), {"k": key, "t": token})
    if die:  # the write is sent, the step record not yet: the worker dies here
        os.kill(os.getpid(), signal.SIGKILL)
    return token


def _attempt(url: str, die: bool) -> None:
    store = open_store(url)
    fence = Fence(store, store.acquire("order:1", f"worker-{os.getpid()}", 30.0))
    fence.atomic_step("pay", _pay, fence.key, fence.token, die)
    store.close()


def _rows(store: Any) -> list[tuple[str, int]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(f"SELECT key, token FROM {EFFECTS}"))]


def test_a_worker_killed_between_the_writes_and_the_step_record_leaves_one_effect(
    store: Any, harness: Harness, table: str
) -> None:
    assert exit_code_of(_attempt, store.url, True) == -signal.SIGKILL
    assert _rows(store) == [] and "pay" not in store.steps("order:1")  # neither the write nor the record
    harness.expire_all(store)  # its lease expires; the next attempt takes over
    assert exit_code_of(_attempt, store.url, False) == 0
    token = store.get("order:1").token
    assert _rows(store) == [("order:1", token)] and store.steps("order:1") == {"pay": token}
    harness.expire_all(store)
    later = Fence(store, store.acquire("order:1", "third", 30.0))  # a later attempt reuses the step
    assert later.atomic_step("pay", _pay, "order:1", later.token, False) == token
    assert len(_rows(store)) == 1
