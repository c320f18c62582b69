"""Names that look like celery-fence's and are not: nothing reads a misspelt ``fence_*`` setting or task
option, so without a word at worker start the typo silently runs with the default. Standard library only."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

from ..config import DEFAULTS, TASK_OPTIONS

__all__ = ["unknown_settings", "unknown_task_options"]

PREFIX = "fence_"


def _looks_ours(name: object) -> bool:
    return isinstance(name, str) and name.lower().startswith(PREFIX)


def _did_you_mean(name: str, valid: Iterable[str]) -> str:
    """The closest valid name, judged on what follows the shared ``fence_`` (which alone makes every pair
    look alike), else on the whole name by a stricter bar (``fence_ttl`` is ``fence_lease_ttl`` cut short)."""
    names, wanted = list(valid), name.lower()
    by_rest = {n[len(PREFIX) :]: n for n in names}
    match = difflib.get_close_matches(wanted[len(PREFIX) :], list(by_rest), n=1, cutoff=0.6)
    found = [by_rest[m] for m in match] or difflib.get_close_matches(wanted, names, n=1, cutoff=0.75)
    return f" (did you mean {found[0]}?)" if found else ""


def unknown_settings(conf: Mapping[str, Any]) -> list[str]:
    """One warning per ``fence_*`` key of ``conf`` that celery-fence does not read (case counts: Celery
    keeps an upper-case key apart from the lower-case one)."""
    names = sorted(name for name in conf if _looks_ours(name) and name not in DEFAULTS)
    return [
        f"unknown setting {name}{_did_you_mean(name, DEFAULTS)}: celery-fence ignores it" for name in names
    ]


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
