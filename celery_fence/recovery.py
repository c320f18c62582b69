"""Broker-independent recovery: send again the runs whose lease expired without completion.

Brokers that never redeliver after a crash (the filesystem broker, early acks) lose the message of a
killed run; its lease row still says what ran. Each abandoned run is claimed atomically at the store (one
recoverer wins), then sent again with the same task id, so it takes over the key and resumes after its
last committed step. After ``fence_max_recoveries`` attempts the key is marked dead with its reason.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from .lease import Abandoned
from .signals import run_recovered
from .stores.base import Store

__all__ = ["RecoveryReport", "recover_abandoned"]

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    resent: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)


def recover_abandoned(
    app: Any, store: Store, grace: float, max_recoveries: int, limit: int = 100
) -> RecoveryReport:
    """One pass: re-send (or give up on) every run abandoned for over ``grace`` seconds."""
    report = RecoveryReport()
    for seen in store.abandoned(grace, limit):
        problem = _unrecoverable(app, seen)
        attempt = store.recover(seen, 0 if problem else max_recoveries, problem or "")
        if attempt is None:
            continue  # someone took over, finished or recovered it first
        if attempt == 0:
            log.error("fence: gave up on %s: %s", seen.key, problem or f"{max_recoveries} recoveries failed")
            report.dead.append(seen.key)
            continue
        run = seen.run or {}
        options = {"queue": run["queue"]} if run.get("queue") else {}
        if run.get("fence_key"):
            options["headers"] = {"fence_key": run["fence_key"]}
        app.send_task(run["task"], args=run["args"], kwargs=run["kwargs"], task_id=run["id"], **options)
        log.warning("fence: re-sent abandoned run %s[%s] (attempt %d)", run["task"], run["id"], attempt)
        run_recovered.send(sender=app, key=seen.key, task=run["task"], task_id=run["id"], attempt=attempt)
        report.resent.append(seen.key)
    return report


def _unrecoverable(app: Any, seen: Abandoned) -> str | None:
    run = seen.run
    if not run or run.get("args") is None:
        return "its arguments were not recorded (not JSON-serializable)"
    if run.get("task") not in app.tasks:
        return f"unknown task {run.get('task')!r}"
    return None
