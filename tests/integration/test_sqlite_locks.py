"""The admin commands and the worker's recovery pass while another process is stopped inside a SQLite
transaction: reads go on (WAL), writes give up after a short bounded wait and say why."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from celery import Celery

from celery_fence.stores.sql import SQLStore
from celery_fence.worker.bootstep import FenceRecovery
from celery_fence.worker.election import Election
from tests.servers.sqlite_holder import holding_write_lock

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CELERY = Path(sys.executable).with_name("celery")
CAUSE = "the SQLite database is locked by another process's open transaction (a stopped or slow worker?)"
APP = """\
from celery import Celery

app = Celery("lockapp", broker="memory://")
app.conf.fence_store_url = {!r}
"""


@pytest.fixture
def path(tmp_path: Path) -> str:
    store = SQLStore(f"sqlite:///{tmp_path / 'fence.db'}")
    store.migrate()
    store.acquire("abandoned", "gone", 0.05)  # its owner died: recovery will want to write
    store.acquire("live", "worker", 300.0)
    store.close()
    (tmp_path / "lockapp.py").write_text(APP.format(f"sqlite:///{tmp_path / 'fence.db'}"))
    return str(tmp_path / "fence.db")


def _fence(path: str, *args: str) -> subprocess.CompletedProcess[str]:
    workdir = Path(path).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(workdir)])}
    return subprocess.run(  # the timeout only stops a hang: each command ends in a few seconds
        [str(CELERY), "-A", "lockapp", "fence", *args],
        check=False,
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args",
    [("recover", "--grace", "0"), ("release", "live", "--yes"), ("prune", "--older-than", "0", "--force")],
)
def test_a_writing_admin_command_fails_fast_naming_the_cause(path: str, args: tuple[str, ...]) -> None:
    with holding_write_lock(path, stopped=True):
        done = _fence(path, *args)
    assert done.returncode == 2, done.stderr
    assert CAUSE in done.stderr
    assert f"fuser {path}" in done.stderr


@pytest.mark.parametrize("args", [("leases", "--all"), ("show", "live"), ("verify",)])
def test_a_reading_admin_command_is_not_held_by_the_lock(path: str, args: tuple[str, ...]) -> None:
    with holding_write_lock(path, stopped=True):
        done = _fence(path, *args)
    assert done.returncode == 0, done.stderr
    assert "live" in done.stdout or "no violations" in done.stdout


def test_the_workers_recovery_pass_gives_up_naming_the_cause(
    path: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = Celery("lockapp", broker="memory://", set_as_current=False)
    app.conf.fence_store_url = f"sqlite:///{path}"
    worker = SimpleNamespace(app=app)
    step = FenceRecovery(worker)
    step.election = Election(ttl=30.0)
    caplog.set_level(logging.WARNING, logger="celery_fence.worker.bootstep")
    with holding_write_lock(path, stopped=True):
        thread = threading.Thread(target=step.run, args=(worker,), daemon=True)  # the worker's timer
        thread.start()
        thread.join(30)  # a poll bound: the pass ends within the short admin wait
        assert not thread.is_alive(), "the recovery pass is held behind the stopped process"
    skipped = [r for r in caplog.records if "recovery pass skipped" in r.getMessage()]
    assert len(skipped) == 1 and CAUSE in skipped[0].getMessage()
    assert skipped[0].levelno == logging.WARNING and skipped[0].exc_info is None
