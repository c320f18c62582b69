"""The startup check's look at each fenced task, since a task's own options override the app's: its
``fence_*`` attributes (a typo names the closest valid option), how its messages are acknowledged (a
task's ``acks_late`` over the app's ``task_acks_late``), and its ``fence_key`` template (refused when it
names a field the task's signature cannot fill)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery import Task

from .._delivery import check_key_template
from .spelling import PREFIX, unknown_task_options

__all__ = ["Acks", "acks_warnings", "task_warnings"]

SHOWN_TASKS = 5  # a warning names this many tasks, then counts the rest


@dataclass(frozen=True)
class Acks:
    """What decides whether a run whose worker dies comes back: when its message is acknowledged."""

    task: str | None  # None: the app's defaults, for a check without tasks
    late: bool
    on_worker_lost: bool  # rejected or retried (not acked) when its worker process dies

    @classmethod
    def of_conf(cls, conf: Mapping[str, Any]) -> Acks:
        lost = conf.get("task_reject_on_worker_lost") or conf.get("task_retry_on_worker_lost")
        return cls(None, bool(conf.get("task_acks_late")), bool(lost))

    @classmethod
    def of_task(cls, task: Any) -> Acks:
        """Celery gives a bound task the app's setting for each option the task did not set itself."""
        lost = task.reject_on_worker_lost or getattr(task, "retry_on_worker_lost", None)
        return cls(task.name, bool(task.acks_late), bool(lost))


def acks_warnings(acks: Sequence[Acks]) -> list[str]:
    """One warning for the tasks whose runs are lost with a dead worker, one for those acked as failed."""
    early = [a for a in acks if not a.late]
    unguarded = [a for a in acks if a.late and not a.on_worker_lost]
    warnings = []
    if early:
        warnings.append(
            f"task_acks_late is off{_naming(early)}: a run whose worker dies is lost with its message; set "
            "task_acks_late=True (or acks_late=True on the task), or re-send abandoned runs with "
            "'celery fence recover'"
        )
    if unguarded:
        warnings.append(
            f"task_acks_late without task_reject_on_worker_lost or task_retry_on_worker_lost"
            f"{_naming(unguarded)}: a run whose worker process dies is acked as failed and never comes "
            "back; set one of them (or reject_on_worker_lost=True on the task)"
        )
    return warnings


def _naming(acks: Sequence[Acks]) -> str:
    names = [a.task for a in acks if a.task is not None]
    if not names:
        return ""
    more = f" and {len(names) - SHOWN_TASKS} more" if len(names) > SHOWN_TASKS else ""
    return f" for {', '.join(names[:SHOWN_TASKS])}{more}"


def task_warnings(tasks: Sequence[Any]) -> list[str]:
    """The warnings for ``tasks`` (fenced, bound); ``ConfigurationError`` for a ``fence_key`` that cannot
    work."""
    warnings: list[str] = []
    for task in tasks:
        check_key_template(task)
        warnings += unknown_task_options(task.name, _own_fence_names(task))
    return warnings + acks_warnings([Acks.of_task(task) for task in tasks])


def _own_fence_names(task: Any) -> set[str]:
    """The ``fence_*`` names the task sets: on its instance, or on its classes below Celery's ``Task``
    (Celery turns ``@app.task(...)`` keywords into attributes of a class made for the task). ``FencedTask``
    is one of them: it declares the task options, each ``None``, and nothing else named ``fence_*``."""
    names = {name for name in vars(task) if name.lower().startswith(PREFIX)}
    for cls in type(task).__mro__:
        if cls is Task:
            break
        names.update(name for name in vars(cls) if name.lower().startswith(PREFIX))
    return names
