"""The worker's startup check, on a real ``celery worker``."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text

from celery_fence.testing import Worker

from .workers import CELERY, ROOT
from .world import Cluster

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


def test_a_fatal_start_error_is_printed_once(cluster: Cluster) -> None:
    """The CRITICAL line alone, not followed by a bare copy of it on stderr."""
    done = start_refused(cluster, {"FENCE_IT_STORE": "nosuchstore://host/db"})
    assert done.returncode == 1
    (critical,) = said(done.stderr, "CRITICAL")
    assert done.stderr.count(critical) == 1, done.stderr


# What a new user gets wrong shows when the worker starts, in one line.

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


def test_a_sqlite_file_in_a_missing_directory_stops_the_worker(cluster: Cluster, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "fence.db"
    done = start_refused(cluster, {"FENCE_IT_STORE": f"sqlite:///{missing}"})
    assert done.returncode != 0
    (critical,) = said(done.stderr, "CRITICAL")
    assert f"the directory {missing.parent} does not exist, so SQLite cannot create fence.db" in critical
    assert "ready." not in done.stderr and not missing.parent.exists()


def test_a_redis_database_the_server_does_not_have_stops_the_worker(cluster: Cluster) -> None:
    done = start_refused(cluster, {"FENCE_IT_STORE": "redis://127.0.0.1:6379/99"})
    assert done.returncode != 0
    (critical,) = said(done.stderr, "CRITICAL")
    assert critical.startswith("fence store redis://127.0.0.1:6379/99: no such database")
    assert "ready." not in done.stderr


@pytest.mark.parametrize(
    ("part", "says"),
    [
        ("database", "the database 'fence_no_such_db' does not exist"),
        ("role", "the role 'fence_no_such_role'"),
    ],
)
def test_a_postgresql_database_or_role_that_does_not_exist_stops_the_worker(
    cluster: Cluster, postgres_url: str, part: str, says: str
) -> None:
    """Waiting cannot make them exist: the worker stops at start, as for a Redis database the server
    lacks, instead of making every run wait fence_store_wait and fail."""
    url = make_url(postgres_url)
    wrong = (
        url.set(database="fence_no_such_db") if part == "database" else url.set(username="fence_no_such_role")
    )
    done = start_refused(cluster, {"FENCE_IT_STORE": wrong.render_as_string(hide_password=False)})
    assert done.returncode != 0
    (critical,) = said(done.stderr, "CRITICAL")
    assert says in critical and "fence_store_url" in critical
    assert "ready." not in done.stderr


def _closed_port() -> int:
    with socket.socket() as probe:  # a port nothing listens on once this closes
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.mark.parametrize("scheme", ["redis", "postgresql"])
def test_a_store_that_does_not_answer_is_named_at_start(cluster: Cluster, scheme: str) -> None:
    url = f"{scheme}://127.0.0.1:{_closed_port()}/{'0' if scheme == 'redis' else 'shop'}"
    with started(cluster, f"{scheme}-down", {"FENCE_IT_STORE": url}) as worker:
        warnings = [w for w in said(worker.log_text(), "WARNING") if "at worker start" in w]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"the fence store cannot be used at worker start: fence store {url}")
    assert "Connection refused" in warnings[0] and "fence_store_wait (600s)" in warnings[0]


@pytest.fixture
def role_without_ddl(postgres_url: str) -> Iterator[str]:
    """The test database's URL as a new role that may connect but not create tables (PostgreSQL 15's
    default for the public schema), dropped afterwards."""
    name = f"fence_no_ddl_{uuid.uuid4().hex[:8]}"
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE ROLE "{name}" LOGIN'))
    try:
        yield make_url(postgres_url).set(username=name, password=None).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP ROLE "{name}"'))
        admin.dispose()


def test_tables_this_role_may_not_create_stop_the_worker_naming_migrate(
    cluster: Cluster, role_without_ddl: str
) -> None:
    done = start_refused(cluster, {"FENCE_IT_STORE": role_without_ddl})
    assert done.returncode != 0
    (critical,) = said(done.stderr, "CRITICAL")
    assert "permission denied" in critical and "'celery -A yourapp fence migrate'" in critical
    assert "ready." not in done.stderr


def test_a_metrics_port_out_of_range_is_one_line(cluster: Cluster) -> None:
    done = start_refused(cluster, {}, args=("--fence-metrics-port", "70000"))
    assert done.returncode != 0
    assert said(done.stderr, "CRITICAL") == [
        "--fence-metrics-port must be a TCP port (an int from 1 to 65535) or None, got 70000"
    ]
    assert "Traceback" not in done.stderr


def test_a_metrics_port_in_use_is_one_line(cluster: Cluster) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ("--fence-metrics-port", str(port), "--fence-metrics-addr", "127.0.0.1")
        tmp = cluster.workdir / "tmp-refused"  # the worker's temp dir, where its metrics folder goes
        tmp.mkdir()
        done = start_refused(cluster, {"TMPDIR": str(tmp)}, args=args)
    assert done.returncode != 0
    assert list(tmp.glob("celery-fence-metrics-*")) == []  # the metrics folder it made is gone with it
    assert said(done.stderr, "CRITICAL") == [
        f"fence_metrics_port (--fence-metrics-port) {port}: cannot serve metrics on 127.0.0.1:{port}: "
        "Address already in use; choose a free port"
    ]
    assert "Traceback" not in done.stderr and "OSError" not in done.stderr
    # Reported once, at CRITICAL (it stops the worker); no WARNING copy from the exit.
    assert done.stderr.count("Address already in use") == 1, done.stderr
