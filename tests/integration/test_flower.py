"""Flower 2.2, started for real against the test broker, shows what the task-fence-* events say."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from celery_fence.testing import free_port

from .fenced_app import record, sleeper
from .workers import CELERY, ROOT, marks, wait_for
from .world import Cluster

pytestmark = pytest.mark.integration


@pytest.fixture
def flower(cluster: Cluster) -> Iterator[str]:
    pytest.importorskip("flower")
    port = free_port()
    env = {**os.environ, **cluster.env, "PYTHONPATH": str(ROOT), "FLOWER_UNAUTHENTICATED_API": "true"}
    cmd = [CELERY, "-A", "tests.integration.fenced_app", "flower", f"--port={port}", "--address=127.0.0.1"]
    with open(cluster.workdir / "flower.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _get(f"{url}/api/workers") is not None, 60, "flower")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return json.loads(reply.read())
    except OSError:
        return None


def _state(url: str, task_id: str) -> str | None:
    info = _get(f"{url}/api/task/info/{task_id}")
    return None if not info else info.get("state")


def test_flower_shows_a_lost_lease_and_a_refused_run(cluster: Cluster, flower: str) -> None:
    cluster.worker("a", concurrency=2)
    lost = record.apply_async(("lost",), {"pause": 30.0})
    refused = sleeper.apply_async((60.0,))
    for result in (lost, refused):
        wait_for(lambda r=result: marks(cluster.workdir, r.id, "started"), what="run started")
        cluster.store.force_release(result.id)  # an operator fences both runs out...
        copy = {"task": "copy", "id": result.id, "args": [], "kwargs": {}}  # ...and a copy takes each
        cluster.store.acquire(result.id, "copy", 60.0, copy)  # over (else a refused run runs again)
    assert wait_for(lambda: _state(flower, lost.id) == "FENCE-LOST", 30, "FENCE-LOST in Flower")
    assert wait_for(lambda: _state(flower, refused.id) == "FENCE-REFUSED", 30, "FENCE-REFUSED in Flower")
    info = _get(f"{flower}/api/task/info/{refused.id}")
    assert "lease lost" in (info.get("exception") or "")
    states = {result.id[:8]: _state(flower, result.id) for result in (lost, refused)}
    print(f"\nFlower states: {states}")
    print(f"refused task exception field: {info.get('exception')}")
