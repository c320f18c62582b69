"""Names that look like celery-fence's and are not: nothing reads a misspelt ``fence_*`` setting or task
option, so without a word at worker start the typo silently runs with the default. Standard library only."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..config import DEFAULTS, TASK_OPTIONS

__all__ = ["unknown_settings", "unknown_task_options"]

PREFIX = "fence_"


def _looks_ours(name: object) -> bool:
    return isinstance(name, str) and name.lower().startswith(PREFIX)


def _closest(name: str, valid: Iterable[str]) -> str | None:
    """The closest valid name, judged on what follows the shared ``fence_`` (which alone makes every pair
    look alike), else on the whole name by a stricter bar (``fence_ttl`` is ``fence_lease_ttl`` cut short)."""
    names, wanted = list(valid), name.lower()
    by_rest = {n[len(PREFIX) :]: n for n in names}
    match = difflib.get_close_matches(wanted[len(PREFIX) :], list(by_rest), n=1, cutoff=0.6)
    found = [by_rest[m] for m in match] or difflib.get_close_matches(wanted, names, n=1, cutoff=0.75)
    return found[0] if found else None


def _did_you_mean(name: str, valid: Iterable[str], written: Callable[[str], str] = str) -> str:
    found = _closest(name, valid)
    return f" (did you mean {written(found)}?)" if found else ""


def unknown_settings(conf: Mapping[str, Any], namespace: str | None = None) -> list[str]:
    """One warning per ``fence_*`` key of ``conf`` that celery-fence does not read (case counts: Celery
    keeps an upper-case key apart from the lower-case one). With the app's ``namespace`` (Django's
    ``config_from_object("django.conf:settings", namespace="CELERY")``), ``CELERY_FENCE_*`` keys too,
    which Celery reads as ``fence_*``; they are named as written."""
    warnings = []
    for name in sorted(conf):
        if _looks_ours(name) and name not in DEFAULTS:
            warnings.append(f"unknown setting {name}{_did_you_mean(name, DEFAULTS)}: celery-fence ignores it")
        rest = _namespaced(name, namespace)
        if rest is not None and rest.lower() not in DEFAULTS:
            hint = _did_you_mean(rest, DEFAULTS, lambda found: f"{namespace}_{found.upper()}")
            warnings.append(f"unknown setting {name}{hint}: celery-fence ignores it")
    return warnings


def _namespaced(name: object, namespace: str | None) -> str | None:
    """``FENCE_LEASE_TTL`` of ``CELERY_FENCE_LEASE_TTL`` in namespace ``CELERY``, else None."""
    if not namespace or not isinstance(name, str) or not name.startswith(f"{namespace}_"):
        return None
    rest = name[len(namespace) + 1 :]
    return rest if _looks_ours(rest) else None


def unknown_task_options(task_name: str, names: Iterable[str]) -> list[str]:
    """One warning per ``fence_*`` attribute of a fenced task that is no task option: a typo, or an app
    setting that has no per-task form (read from ``app.conf`` only)."""
    warnings = []
    for name in sorted(n for n in names if _looks_ours(n) and n not in TASK_OPTIONS):
        if name in DEFAULTS:
            warnings.append(
                f"task {task_name}: {name} is an app setting with no per-task form; set "
                f"app.conf.{name} instead (the task's own is ignored)"
            )
        else:
            hint = _did_you_mean(name, TASK_OPTIONS)
            warnings.append(f"task {task_name}: unknown option {name}{hint}: celery-fence ignores it")
    return warnings
