"""How results and step values are stored: JSON text, like Celery's default serializer."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from .errors import NotSerializable

__all__ = ["MAX_VALUE_BYTES", "Encoded", "dumps", "dumps_mapping", "loads"]

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


class Encoded(Mapping[str, Any]):
    """A read-only mapping encoded once, at construction (raising :class:`NotSerializable` there).

    A run's info is encoded to learn whether JSON can carry its arguments; the store then takes this
    ``text`` (:func:`dumps_mapping`) instead of encoding it a second time on the hot path.
    """

    __slots__ = ("_data", "text")

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)
        self.text = dumps(self._data)

    def __getitem__(self, name: str) -> Any:
        return self._data[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def dumps_mapping(value: Mapping[str, Any] | None) -> str | None:
    """Encode a mapping (``None`` stays ``None``), reusing the text of an :class:`Encoded` one."""
    if value is None:
        return None
    return value.text if isinstance(value, Encoded) else dumps(dict(value))
