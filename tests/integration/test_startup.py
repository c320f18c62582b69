"""The worker's startup check, on a real ``celery worker``."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator

import pytest

from celery_fence.testing import Worker

from .conftest import Cluster
from .workers import CELERY, ROOT

pytestmark = pytest.mark.integration

FENCED_APP = "tests.integration.fenced_app"


def start_refused(
    cluster: Cluster, env: dict[str, str], app: str = FENCED_APP, args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """A worker that must stop while it starts: its exit status and output."""
    cmd = [CELERY, "-A", app, "worker", "-P", "solo", "-Q", cluster.queue, *args]
    env = {**os.environ, **cluster.env, **env, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def test_a_renew_interval_that_cannot_work_stops_the_worker(cluster: Cluster) -> None:
    done = start_refused(cluster, {"FENCE_IT_INTERVAL": "1.5"})
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
    done = start_refused(cluster, {"FENCE_IT_STORE": url})
    assert done.returncode != 0
    assert "CRITICAL/MainProcess] celery-fence: " in done.stderr and says in done.stderr
    assert "ready." not in done.stderr  # it never started consuming


# Issue 15 ("the first hour"): what a new user gets wrong shows when the worker starts, in one line.

STARTUP_APP = "tests.integration.startup_app"


@contextlib.contextmanager
def started(cluster: Cluster, name: str, env: dict[str, str]) -> Iterator[Worker]:
    """A worker of ``startup_app`` that reached ``ready.``, stopped at the end."""
    env = {**cluster.env, **env}
    worker = Worker(STARTUP_APP, name, cluster.workdir, queues=cluster.queue, pool="solo", env=env, cwd=ROOT)
    try:
        yield worker.start()
    finally:
        worker.stop()


def said(text: str, level: str) -> list[str]:
    """What celery-fence logged at ``level`` in the worker's main process."""
    mark = f"{level}/MainProcess] celery-fence: "
    return [line.split(mark, 1)[1] for line in text.splitlines() if mark in line]


def test_misspelt_settings_and_task_options_warn_naming_the_closest(cluster: Cluster) -> None:
    conf = json.dumps({"fence_lease_tll": 60, "fence_on_bussy": "ignore"})
    with started(cluster, "typos", {"FENCE_IT_CONF": conf, "FENCE_IT_TASKS": "plain,typo"}) as worker:
        warnings = said(worker.log_text(), "WARNING")
    assert warnings == [
        "unknown setting fence_lease_tll (did you mean fence_lease_ttl?): celery-fence ignores it",
        "unknown setting fence_on_bussy (did you mean fence_on_busy?): celery-fence ignores it",
        "task startup.typo: unknown option fence_ttl (did you mean fence_lease_ttl?): "
        "celery-fence ignores it",
    ]


def test_acks_late_is_judged_per_task(cluster: Cluster) -> None:
    app_off = json.dumps({"task_acks_late": False})
    with started(cluster, "on-the-task", {"FENCE_IT_CONF": app_off, "FENCE_IT_TASKS": "acks_late"}) as worker:
        assert said(worker.log_text(), "WARNING") == []  # the task's own acks_late=True is what counts
    with started(cluster, "off-on-a-task", {"FENCE_IT_TASKS": "plain,acks_early"}) as worker:
        (warning,) = said(worker.log_text(), "WARNING")
    assert warning.startswith("task_acks_late is off for startup.acks_early: a run whose worker dies is lost")


def test_a_fence_key_naming_no_argument_stops_the_worker(cluster: Cluster) -> None:
    done = start_refused(cluster, {"FENCE_IT_TASKS": "plain,bad_key"}, app=STARTUP_APP)
    assert done.returncode != 0
    assert said(done.stderr, "CRITICAL") == [
        "task startup.bad_key: fence_key 'item:{itme}' names {itme}, which is not a parameter of the task "
        "(did you mean item?); its parameters are item: name one of them in braces, "
        "e.g. 'invoice:{invoice_id}'"
    ]
    assert "ready." not in done.stderr
