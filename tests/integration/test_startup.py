"""The worker's startup check, on a real ``celery worker``."""

from __future__ import annotations

import os
import subprocess

import pytest

from .conftest import Cluster
from .workers import CELERY, ROOT

pytestmark = pytest.mark.integration


def test_a_renew_interval_that_cannot_work_stops_the_worker(cluster: Cluster) -> None:
    cmd = [CELERY, "-A", "tests.integration.fenced_app", "worker", "-P", "solo", "-Q", cluster.queue]
    env = {**os.environ, **cluster.env, "FENCE_IT_INTERVAL": "1.5", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "fence_renew_interval (1.5s) must be below half of fence_lease_ttl (2.0s)" in done.stderr


def test_risky_settings_are_one_warning_each(cluster: Cluster) -> None:
    safe = cluster.worker("safe", pool="solo")
    risky = cluster.worker("risky", pool="solo", env={"FENCE_IT_VISIBILITY": "1"})
    lines = safe.log_text().splitlines()
    warnings = [line for line in lines if "WARNING" in line and "celery-fence:" in line]
    assert not warnings  # the test app's own settings are the safe ones
    assert risky.log_text().count("celery-fence: broker visibility_timeout (1.0s) is below") == 1


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("nosuchstore://host/db", "unknown fence store scheme 'nosuchstore'"),
        ("postgresql+pg8000://127.0.0.1/nothing", "pip install pg8000"),  # pg8000 is not installed
    ],
)
def test_a_store_url_that_cannot_work_stops_the_worker(cluster: Cluster, url: str, says: str) -> None:
    cmd = [CELERY, "-A", "tests.integration.fenced_app", "worker", "-P", "solo", "-Q", cluster.queue]
    env = {**os.environ, **cluster.env, "FENCE_IT_STORE": url, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0
    assert "CRITICAL/MainProcess] celery-fence: " in done.stderr and says in done.stderr
    assert "ready." not in done.stderr  # it never started consuming
