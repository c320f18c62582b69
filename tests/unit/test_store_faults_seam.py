"""The fault kit's lost replies reach a worker through the runtime's seam: the runtime
never imports the kit; a worker the kit starts with ``CELERY_FENCE_STORE_FAULTS`` loads
``celery_fence.testing._in_worker``, whose ``worker_init`` receiver wraps every store the app's runtimes open.
A memory store: no worker process, no network (tests/integration/test_once_per_key.py runs a real one)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_fence._runtime import runtime_for
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import Fault, IndeterminateStore, Outcome, Worker, store_faults_env
from celery_fence.testing._in_worker import install_store_faults

FAULTS = store_faults_env(Fault(Outcome.LOST, method="complete"))


@pytest.fixture
def app() -> Any:
    app = Celery("seam", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.fence_store_url = "memory://"
    yield app
    runtime_for(app).close()


def test_a_worker_whose_environment_names_faults_wraps_the_store_of_every_runtime(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(*next(iter(FAULTS.items())))
    install_store_faults(sender=SimpleNamespace(app=app))  # Celery's worker_init, sent by the worker
    first = runtime_for(app).store
    assert isinstance(first, IndeterminateStore)
    assert isinstance(first.store, MemoryStore)
    assert [(f.method, f.outcome) for f in first.faults] == [("complete", Outcome.LOST)]

    runtime_for(app).forget_after_fork()  # a forked pool process makes a runtime of its own
    second = runtime_for(app).store
    assert isinstance(second, IndeterminateStore)
    assert second is not first and second.faults is not first.faults  # each process counts its own calls


def test_a_worker_without_faults_in_its_environment_keeps_its_store(
    app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(next(iter(FAULTS)), raising=False)
    install_store_faults(sender=SimpleNamespace(app=app))
    assert isinstance(runtime_for(app).store, MemoryStore)


@pytest.mark.parametrize(
    ("env", "loads"), [(FAULTS, True), ({}, False), ({**FAULTS, **dict.fromkeys(FAULTS, "")}, False)]
)
def test_the_kit_starts_a_worker_that_loads_the_seam_only_when_faults_are_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: dict[str, str], loads: bool
) -> None:
    started: list[list[str]] = []

    class Recorded:  # the command line is the point here, not a worker
        def __init__(self, command: list[str], **_: Any) -> None:
            started.append(command)

    monkeypatch.delenv(next(iter(FAULTS)), raising=False)
    monkeypatch.setattr(subprocess, "Popen", Recorded)
    Worker("tests.app", "w", tmp_path, env=env).launch()
    (command,) = started
    assert ("-I" in command and "celery_fence.testing._in_worker" in command) is loads
