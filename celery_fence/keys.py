"""Which lease key a run takes: a ``fence_key`` message header, else the task's ``fence_key`` option (a
format string over the bound arguments, or a callable), else the task id."""

from __future__ import annotations

import difflib
import inspect
import re
import string
from collections.abc import Iterator
from typing import Any

from .errors import ConfigurationError
from .lease import validate_key

__all__ = ["check_key_template", "derive_key", "key_spec"]


def key_spec(task: Any) -> Any:
    """The task's ``fence_key`` as written: ``None``, a format string or a callable.

    Celery makes decorator options class attributes, so a plain function would come back bound to the
    task: read the attribute as stored, and unwrap a staticmethod.
    """
    spec = inspect.getattr_static(task, "fence_key", None)
    return spec.__func__ if isinstance(spec, staticmethod) else spec


def derive_key(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, bool]:
    """The run's key, and whether it is the task id (so any holder of it is a copy of this very task)."""
    header = getattr(task.request, "fence_key", None)
    if header is not None:
        return validate_key(header), False
    spec = key_spec(task)
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


def check_key_template(task: Any) -> None:
    """Refuse a ``fence_key`` format string naming a field the task's signature cannot fill (the worker's
    startup check: otherwise it shows only when the task runs). A callable is the user's to get right."""
    spec = key_spec(task)
    if spec is None or callable(spec):
        return
    if not isinstance(spec, str):
        raise ConfigurationError(
            f"task {task.name}: fence_key must be a format string or a callable, not {spec!r}"
        )
    parameters = list(inspect.signature(task.run).parameters)
    try:
        fields = list(_fields(spec))
    except ValueError as exc:  # unbalanced braces, say
        raise ConfigurationError(
            f"task {task.name}: fence_key {spec!r} is not a format string: {exc}"
        ) from exc
    for field in fields:
        name = re.split(r"[.\[]", field, maxsplit=1)[0]  # {order.id} and {items[0]} name order, items
        if name not in parameters:
            raise ConfigurationError(_unfit(task.name, spec, name, parameters))


def _fields(template: str) -> Iterator[str]:
    """Every replacement field of ``template``, also those nested in a format spec (``{n:{width}}``)."""
    for _, field, format_spec, _ in string.Formatter().parse(template):
        if field is not None:
            yield field
        if format_spec:
            yield from _fields(format_spec)


def _unfit(task_name: str, spec: str, name: str, parameters: list[str]) -> str:
    if not name or name.isdigit():  # the key is filled from the arguments by name: no position to fill
        what = "a positional field {" + name + "}"
    else:
        close = difflib.get_close_matches(name, parameters, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        what = f"{{{name}}}, which is not a parameter of the task{hint}"
    return (
        f"task {task_name}: fence_key {spec!r} names {what}; its parameters are "
        f"{', '.join(parameters) or 'none'}: name one of them in braces, e.g. 'invoice:{{invoice_id}}'"
    )
