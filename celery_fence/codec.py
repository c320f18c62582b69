"""How results and step values are stored: JSON text, like Celery's default serializer."""

from __future__ import annotations

import json
from typing import Any

from .errors import NotSerializable

__all__ = ["MAX_VALUE_BYTES", "dumps", "loads"]

# Results live in lease rows and history replies; a huge one belongs in the user's own tables.
MAX_VALUE_BYTES = 16 * 1024 * 1024


def dumps(value: Any) -> str:
    """Encode ``value``; raise :class:`NotSerializable` (nothing written) if JSON cannot carry it."""
    try:
        text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise NotSerializable(
            f"cannot store {type(value).__name__} as JSON ({exc}); return JSON-compatible values "
            "(dict, list, str, int, float, bool, None)"
        ) from exc
    if len(text) > MAX_VALUE_BYTES:
        raise NotSerializable(f"value of {len(text)} bytes exceeds the {MAX_VALUE_BYTES}-byte limit")
    return text


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)
