"""Whether a worker takes part in recovery: ``fence_recover`` (default on), overridden by
``--fence-recover``/``--no-fence-recover``; a step that is not included is never started by Celery."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery

from celery_fence import stores
from celery_fence.worker.bootstep import FenceRecovery


def _worker(conf: dict[str, Any]) -> Any:
    app = Celery("step", broker="memory://", set_as_current=False)
    app.conf.update(conf)
    return SimpleNamespace(app=app)


@pytest.mark.parametrize(
    ("conf", "option", "included"),
    [
        ({}, None, True),  # on by default
        ({"fence_recover": False}, None, False),
        ({"fence_recover": True}, False, False),  # --no-fence-recover wins
        ({"fence_recover": False}, True, True),  # --fence-recover wins
    ],
)
def test_fence_recover_and_the_worker_option_decide_whether_the_step_runs(
    conf: dict[str, Any], option: bool | None, included: bool
) -> None:
    worker = _worker(conf)
    step = FenceRecovery(worker, fence_recover=option)
    assert step.include_if(worker) is included


def test_a_store_without_the_recovery_role_gets_no_recovery_pass(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.support.harnesses.run_only import RunOnlyStore

    monkeypatch.setattr(stores, "entry_points", lambda *, group: [_EntryPoint("runonly", RunOnlyStore)])
    worker = _worker({"fence_store_url": "runonly://"})
    worker.timer = SimpleNamespace(call_repeatedly=lambda *a, **k: pytest.fail("a pass was scheduled"))
    step = FenceRecovery(worker)
    step.start(worker)
    assert step.tref is None
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "celery-fence: no recovery: the store has no recovery role (it lacks abandoned, recover, strand)"
    ]


class _EntryPoint:
    def __init__(self, name: str, target: Any) -> None:
        self.name, self.target, self.module, self.extras = name, target, "third_party", []

    def load(self) -> Any:
        return self.target
