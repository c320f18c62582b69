"""``celery worker --fence-recover``: one worker re-sends abandoned runs periodically (main process)."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import click
from celery import bootsteps

from .recovery import recover_abandoned
from .runtime import runtime_for
from .stores import open_store

__all__ = ["RECOVER_OPTIONS", "FenceRecovery", "add_recovery_step"]

log = logging.getLogger(__name__)

RECOVER_OPTIONS = [
    click.Option(
        ["--fence-recover"],
        is_flag=True,
        default=False,
        help="Re-send fenced runs whose lease expired without completion (celery-fence).",
    ),
    click.Option(
        ["--fence-recover-interval"],
        type=float,
        default=None,
        help="Seconds between recovery passes (default: the lease ttl).",
    ),
]


class FenceRecovery(bootsteps.StartStopStep):  # type: ignore[misc]  # celery ships no type information
    requires: ClassVar[set[str]] = {"celery.worker.components:Timer"}

    def __init__(
        self,
        worker: Any,
        fence_recover: bool = False,
        fence_recover_interval: float | None = None,
        **kwargs: Any,
    ) -> None:
        self.enabled = bool(fence_recover or worker.app.conf.get("fence_recover"))
        self.interval = fence_recover_interval
        self.tref: Any = None

    def start(self, worker: Any) -> None:
        config = runtime_for(worker.app).config
        interval = self.interval or config.policy.ttl
        self.tref = worker.timer.call_repeatedly(interval, self.run, (worker,), priority=10)
        log.info("celery-fence: recovering abandoned runs every %.1fs", interval)

    def stop(self, worker: Any) -> None:
        if self.tref is not None:
            self.tref.cancel()

    def run(self, worker: Any) -> None:
        config = runtime_for(worker.app).config
        store = open_store(config.store_url)  # short-lived: no connection is held when children fork
        try:
            recover_abandoned(worker.app, store, config.policy.ttl, config.max_recoveries)
        except Exception:  # a failed pass is retried at the next interval
            log.exception("celery-fence: recovery pass failed")
        finally:
            store.close()


def add_recovery_step(sender: Any = None, instance: Any = None, **_: Any) -> None:
    """``celeryd_init`` receiver: the worker's blueprint is built after this, so the step joins it."""
    app = getattr(instance, "app", None)
    if app is not None:
        app.steps["worker"].add(FenceRecovery)
