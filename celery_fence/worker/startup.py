"""The worker's startup check: what cannot work stops the worker; what is merely risky is one warning
naming the setting to change."""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from ..config import FenceConfig
from ..errors import ConfigurationError
from ..lease import LeasePolicy
from ..stores import Capabilities, capabilities_for
from .spelling import unknown_settings
from .store_probe import probe_store
from .task_checks import Acks, acks_warnings, task_warnings

__all__ = ["check_settings", "check_worker_at_start", "stop_worker"]

log = logging.getLogger(__name__)


def check_settings(
    conf: Mapping[str, Any],
    pool: str = "prefork",
    tasks: Sequence[Any] | None = None,
    namespace: str | None = None,
) -> list[str]:
    """Warnings for ``conf``; raises ``ConfigurationError`` for settings that cannot work. Without I/O.

    ``tasks`` (the app's fenced tasks) are checked each, their own options over the app's; without them,
    the acknowledgement settings are judged by the app's defaults. ``namespace``: the app's settings
    namespace (``CELERY`` for Django's ``CELERY_*`` settings).
    """
    config = FenceConfig.from_conf(conf)
    store = capabilities_for(config.store_url)  # refuses a bad URL, unknown scheme or missing driver too
    ttl, warnings = config.policy.ttl, unknown_settings(conf, namespace)
    warnings += [w for w in [store.ttl_warning(ttl)] if w]
    if store.write_lock_wait is not None:
        warnings += _lock_warning(store, config.policy, conf.get("fence_renew_interval"))
    visibility = (conf.get("broker_transport_options") or {}).get("visibility_timeout")
    if visibility is not None and visibility < ttl:
        warnings.append(
            f"broker visibility_timeout ({visibility}s) is below fence_lease_ttl ({ttl}s): every run longer "
            "than it is delivered again; the copies are refused, but raise visibility_timeout above your "
            "longest task"
        )
    warnings += acks_warnings([Acks.of_conf(conf)]) if tasks is None else task_warnings(tasks)
    time_limit = conf.get("task_time_limit")
    if time_limit is not None and time_limit < ttl:
        warnings.append(
            f"task_time_limit ({time_limit}s) is below fence_lease_ttl ({ttl}s): a run killed at its time "
            "limit keeps its key leased until the ttl passes; lower fence_lease_ttl to retry sooner"
        )
    warnings += _mode_warnings(store, config, tasks)
    if config.interrupt and pool in ("gevent", "eventlet"):
        warnings.append(
            f"fence_interrupt cannot interrupt a {pool} greenlet; bodies stop at self.fence.check()"
        )
    return warnings


def _mode_warnings(store: Capabilities, config: FenceConfig, tasks: Sequence[Any] | None) -> list[str]:
    """``fence_mode="commit"`` (the app's, or a task's own) on a store that cannot do it stops the worker;
    on one that only emulates it (memory), one warning."""
    modes = {"the app": config.mode} if tasks is None else {
        task.name: getattr(task, "fence_mode", None) or config.mode for task in tasks
    }
    committing = sorted(name for name, mode in modes.items() if mode == "commit")
    for name in committing:
        refusal = store.commit_mode_refusal(name)
        if refusal is not None:
            raise ConfigurationError(refusal)
    if committing and store.fenced_commit == "emulated":
        return [
            f"fence_mode='commit' on {store.name} is emulated ({', '.join(committing)}): its claim is "
            "atomic, but there is no database transaction for the task's writes to commit with"
        ]
    return []


def _lock_warning(store: Capabilities, policy: LeasePolicy, interval: float | None) -> list[str]:
    """A renew waits for the store's one write lock (SQLite's) only as long as it can still land before
    the lease's local deadline (``LeasePolicy.renew_slack``); any other write waits up to the store's lock
    wait. Below it, a transaction the store tolerates (another process's) costs healthy leases."""
    busy, slack = store.write_lock_wait or 0.0, policy.renew_slack
    if slack >= busy:
        return []
    start = math.ceil(policy.ttl)
    enough = next(t for t in itertools.count(start) if LeasePolicy(t, interval).renew_slack >= busy)
    return [
        f"fence_lease_ttl={policy.ttl}s with a renew every {policy.interval:.1f}s leaves a renew "
        f"{slack:.2f}s to wait for {store.name}'s write lock before the lease's local deadline (0.85 x ttl - "
        f"interval), less than {store.name}'s busy timeout ({busy:.0f}s), for which any write waits: another "
        "process's transaction that holds the lock that long (a slow task's fenced transaction, a stopped "
        f"worker) makes healthy leases count as lost; raise fence_lease_ttl to {enough}s or more"
    ]


def check_worker_at_start(sender: Any = None, instance: Any = None, *, fenced: type, **_: Any) -> None:
    """``celeryd_after_setup`` receiver: the worker's main process, logging set up, no child forked yet.
    ``fenced`` is ``FencedTask``, given by the receiver ``task.py`` connects (this package never imports
    ``task.py``, which imports it): the app's tasks of that class are checked."""
    worker = instance if instance is not None else sender
    app: Any = getattr(worker, "app", None)
    tasks = [] if app is None else _fenced_tasks(app, fenced)
    if not tasks:
        return
    pool = getattr(getattr(worker, "pool_cls", None), "__module__", "").rsplit(".", 1)[-1]
    try:
        _log_warnings(check_settings(app.conf, pool, tasks, getattr(app, "namespace", None)))
        _log_warnings(probe_store(FenceConfig.from_conf(app.conf)))  # settings first: no bad URL opened
    except ConfigurationError as exc:
        stop_worker(exc)


def stop_worker(exc: ConfigurationError) -> NoReturn:
    """Stop a starting worker on a setting that cannot work: one ``CRITICAL`` line, no traceback. Celery's
    signals swallow exceptions, and a bootstep's would come with a traceback: exit ourselves. The exit
    carries a status, not the message: Python prints a message given to ``SystemExit`` on stderr, which
    the worker has by then redirected to its log (a ``WARNING`` copy of the line), or not (a bare copy)."""
    log.critical("celery-fence: %s", exc)
    raise SystemExit(1) from exc


def _log_warnings(warnings: list[str]) -> None:
    for warning in warnings:
        log.warning("celery-fence: %s", warning)


def _fenced_tasks(app: Any, fenced: type) -> list[Any]:
    return [task for task in app.tasks.values() if isinstance(task, fenced)]
