"""Which lease key a run takes: a ``fence_key`` message header, else the task's ``fence_key`` option (a
format string over the bound arguments, or a callable), else the task id."""

from __future__ import annotations

import inspect
from typing import Any

from .errors import ConfigurationError
from .lease import validate_key

__all__ = ["derive_key"]


def derive_key(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, bool]:
    """The run's key, and whether it is the task id (so any holder of it is a copy of this very task)."""
    header = getattr(task.request, "fence_key", None)
    if header is not None:
        return validate_key(header), False
    # Celery makes decorator options class attributes, so a plain function would come back bound to the
    # task: read the attribute as stored, and unwrap a staticmethod.
    spec = inspect.getattr_static(task, "fence_key", None)
    if isinstance(spec, staticmethod):
        spec = spec.__func__
    if spec is None:
        return validate_key(task.request.id), True
    if callable(spec):
        return validate_key(spec(*args, **kwargs)), False
    if not isinstance(spec, str):
        raise ConfigurationError(
            f"{task.name}: fence_key must be a format string or a callable, not {spec!r}"
        )
    try:
        bound = inspect.signature(task.run).bind(*args, **kwargs)
        bound.apply_defaults()
        key = spec.format(**bound.arguments)
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"{task.name}: fence_key {spec!r} does not fit the task's arguments ({exc!r}); "
            "name the task's parameters in braces, e.g. 'invoice:{invoice_id}'"
        ) from exc
    return validate_key(key), False
