"""Every exit of a run ends right on real ``celery worker`` processes: what the body does around
the store, not only what the store answers."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text

from .fenced_app import insert_if_absent, send_parcel
from .workers import marks, wait_for
from .world import Cluster, effects_engine

pytestmark = pytest.mark.integration

SQL_STORES = [pytest.param({"store": name}, id=name) for name in ("postgresql", "sqlite")]


@pytest.mark.parametrize("cluster", SQL_STORES, indirect=True)
def test_a_body_that_catches_its_first_blocks_failure_completes(cluster: Cluster) -> None:
    """Finding 1: the first transaction() block raises IntegrityError (the row exists), the body catches it
    and returns. That block rolled the run's transaction back and nothing else was in it: the run completes
    (it used to be re-queued as an unknown outcome by every copy until the key was dead)."""
    engine = effects_engine(cluster.store, cluster.user_db)
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE fence_it_unique (key TEXT PRIMARY KEY)"))
        conn.execute(text("INSERT INTO fence_it_unique (key) VALUES ('there')"))
    try:
        cluster.worker("a")
        fresh, existing = insert_if_absent.delay("new"), insert_if_absent.delay("there")
        assert fresh.get(timeout=30)["item"] == "new"
        assert existing.get(timeout=30)["item"] == "there" and existing.state == "SUCCESS"
        for result in (fresh, existing):
            state = cluster.store.get(result.id)
            assert state is not None and state.done
            assert [e for e, _ in cluster.events(result.id)].count("acquire") == 1  # never re-queued
        assert len(marks(cluster.workdir, existing.id, "existed")) == 1
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT key FROM fence_it_unique ORDER BY key")).scalars().all()
        assert rows == ["new", "there"]
    finally:
        with engine.begin() as conn:
            conn.execute(text("DROP TABLE fence_it_unique"))


@pytest.mark.parametrize("cluster", SQL_STORES[:1], indirect=True)
def test_a_step_does_not_start_once_the_run_knows_its_lease_is_lost(cluster: Cluster) -> None:
    """Finding 7: an operator's release fences the run out; the renewer reports the lease lost; the body
    then calls step("send", ...): the function must not run in the stale run (it did, and the copy sent
    the parcel again). The copy sends it once."""
    cluster.worker("a")
    task_id = str(uuid.uuid4())
    result = send_parcel.apply_async(("p-1",), task_id=task_id)
    wait_for(lambda: marks(cluster.workdir, task_id, "started"), what="the run to start")
    cluster.store.force_release(task_id)
    assert result.get(timeout=30) == "sent p-1"
    assert len(marks(cluster.workdir, task_id, "knows-lost")) == 1
    sent = [p for p in cluster.workdir.glob(f"{task_id}.*.sent-*")]
    assert len(sent) == 1, sent
    state = cluster.store.get(task_id)
    assert state is not None and state.done
