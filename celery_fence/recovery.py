"""Broker-independent recovery: send again the runs whose lease expired without completion.

Brokers that never redeliver after a crash (the filesystem broker, early ack) lose the message of a
killed run; its lease row still says what ran. Each abandoned run is claimed atomically at the store (one
recoverer wins), then its message is sent again as it was (same task id, arguments, canvas links, headers
and route: :mod:`celery_fence._delivery`), so it takes over the key and resumes after its last committed step.

The rules:

- A copy is *sent* when claimed and *started* when it acquires the key. Only copies that started and were
  lost again count against ``fence_max_recoveries``; after that many the key is marked dead. A copy still
  waiting in a queue counts for nothing, and the wait before the key is judged again grows with every copy
  that has not started (``lease.recovery_backoff``: 1, 1, 2, 4 ... 32 graces).
- A task this process does not know is sent by name all the same: it may belong to another service's
  workers. Only a run whose message cannot be rebuilt (its arguments were not recorded) is marked dead at
  once, with the reason.
- Load the app's task modules first (:func:`load_tasks`), as a worker does, so the log can say which
  tasks are this app's own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ._delivery import RECOVERED, resend_options
from .lease import Abandoned
from .signals import run_recovered
from .stores.base import Store
from .worker.election import RESERVED_PREFIX

__all__ = ["RecoveryReport", "load_tasks", "recover_abandoned"]

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    resent: list[str] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)  # re-sent by name: no task of that name here


def load_tasks(app: Any) -> None:
    """Import the app's task modules as a worker does: ``imports``, ``include`` and autodiscovery."""
    app.loader.import_default_modules()


def recover_abandoned(
    app: Any, store: Store, grace: float, max_recoveries: int, limit: int = 100
) -> RecoveryReport:
    """One pass: re-send (or give up on) every run abandoned for over ``grace`` seconds."""
    report = RecoveryReport()
    for seen in store.abandoned(grace, limit):
        if seen.key.startswith(RESERVED_PREFIX):  # the library's own leases (the recoverer's): no run
            continue
        problem = _unrecoverable(seen)
        attempt = store.recover(seen, 0 if problem else max_recoveries, problem or "")
        if attempt is None:
            continue  # someone took over, finished or recovered it first
        if attempt == 0:
            log.error("fence: gave up on %s: %s", seen.key, problem or f"{max_recoveries} recoveries failed")
            report.dead.append(seen.key)
            continue
        _resend(app, seen, attempt, report)
    return report


def _resend(app: Any, seen: Abandoned, attempt: int, report: RecoveryReport) -> None:
    run = seen.run or {}
    options = resend_options(run)
    # Marked as a copy: one whose task id ended FAILURE meanwhile is not run again
    # (docs/guarantees.md#every-exit).
    options["headers"] = {**(options.get("headers") or {}), RECOVERED: attempt}
    app.send_task(run["task"], **options)
    copy = f"attempt {attempt}" if not seen.sent else f"attempt {attempt}, copy {seen.sent + 1}"
    if run["task"] not in app.tasks:
        log.warning(
            "fence: re-sent abandoned run %s[%s] by name (%s): no such task in this app, so it is left to "
            "the workers that know it",
            run["task"],
            run["id"],
            copy,
        )
        report.foreign.append(seen.key)
    else:
        log.warning("fence: re-sent abandoned run %s[%s] (%s)", run["task"], run["id"], copy)
    run_recovered.send(sender=app, key=seen.key, task=run["task"], task_id=run["id"], attempt=attempt)
    report.resent.append(seen.key)


def _unrecoverable(seen: Abandoned) -> str | None:
    run = seen.run
    if not run or run.get("args") is None or not run.get("task") or not run.get("id"):
        why = (run or {}).get("dropped") or "not JSON-serializable"
        return f"its arguments were not recorded ({why}): nothing to send again"
    return None
