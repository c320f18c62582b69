"""Exactly once per key when an attempt wrote and then did not complete.

The writes of ``self.fence.transaction()`` commit together with the run's completion (docs/guarantees.md
"The rule of `transaction()`"): an attempt that wrote and then called ``self.retry()``, raised into
``autoretry_for``, was SIGKILLed, or returned a value its result codec cannot carry leaves none of its
writes. Real workers, PostgreSQL and SQLite lease stores (the two that hold the user's tables).
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from .fenced_app import write_then
from .workers import marks, wait_for
from .world import Cluster


def writes(cluster: Cluster, task_id: str) -> int:
    """How many attempts of ``task_id`` wrote (committed or not)."""
    return len(list(cluster.workdir.glob(f"{task_id}.*.wrote-*")))

pytestmark = pytest.mark.integration

SQL_STORES = [pytest.param({"store": s, "ttl": "2"}, id=s) for s in ("postgresql", "sqlite")]


@pytest.mark.parametrize("cluster", SQL_STORES, indirect=True)
@pytest.mark.parametrize("how", ["retry", "raise"])
def test_a_write_then_a_retry_leaves_one_effect(cluster: Cluster, how: str) -> None:
    cluster.worker("a")
    result = write_then.apply_async(("x", how))
    assert result.get(timeout=60)["item"] == "x"
    assert writes(cluster, result.id) == 2  # both attempts wrote...
    effects = cluster.effects(result.id)
    assert [e[1] for e in effects] == [result.get()["token"]]  # ...the completed one's write alone stayed
    events = [e for e, _ in cluster.events(result.id)]
    assert events.count("write") == 1 and events.count("complete") == 1


@pytest.mark.parametrize("cluster", SQL_STORES, indirect=True)
def test_a_worker_killed_after_its_write_leaves_one_effect(cluster: Cluster) -> None:
    cluster.worker("a")
    result = write_then.apply_async(("killed", "pause"), {"pause": 60.0})
    ((pid, _),) = wait_for(lambda: marks(cluster.workdir, result.id, "wrote-0"), what="the first write")
    os.kill(pid, signal.SIGKILL)  # acks_late + reject_on_worker_lost: the broker delivers it again
    assert result.get(timeout=60)["item"] == "killed"
    assert writes(cluster, result.id) == 2
    assert len(cluster.effects(result.id)) == 1


@pytest.mark.parametrize("cluster", SQL_STORES, indirect=True)
def test_a_result_that_cannot_be_stored_leaves_no_write(cluster: Cluster) -> None:
    cluster.worker("a")
    result = write_then.apply_async(("odd", "unserializable"))
    with pytest.raises(Exception, match="cannot store set"):
        result.get(timeout=60)
    assert result.state == "FAILURE"
    assert cluster.effects(result.id) == []
    state = cluster.store.get(result.id)
    assert state is not None and not state.done and state.expires_in is None  # released: may run again


@pytest.mark.parametrize("cluster", SQL_STORES, indirect=True)
@pytest.mark.parametrize("outcome", ["lost", "before"])
def test_a_completion_whose_reply_was_lost_ends_success(cluster: Cluster, outcome: str) -> None:
    """The commit happened (``lost``) or not (``before``); either way the caller gets
    SUCCESS with the result, one effect, and the history holds no refusal and no failed renew."""
    faults = json.dumps([{"method": "commit", "nth": 1, "outcome": outcome}])
    cluster.worker("a", env={"CELERY_FENCE_STORE_FAULTS": faults})
    result = write_then.apply_async(("lost", "none"))
    value = result.get(timeout=60)
    assert result.state == "SUCCESS" and value["item"] == "lost"
    assert len(cluster.effects(result.id)) == 1
    events = [e for e, _ in cluster.events(result.id)]
    assert "refused" not in events and "renew-failed" not in events, events
    assert events.count("complete") == 1
    if outcome == "lost":  # committed: the stored result is the answer, the body ran once
        assert writes(cluster, result.id) == 1
