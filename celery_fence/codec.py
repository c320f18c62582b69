"""How results and step values are stored: JSON text in kombu's dialect, the one Celery's default serializer
speaks, so a stored result carries what the task's own JSON message carries (datetime, date, time, UUID,
Decimal and bytes, tagged ``{"__type__": ..., "__value__": ...}``) and a duplicate returns what the first
run returned. What kombu's JSON cannot carry is refused before anything is written."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kombu.utils import json as kombu_json

from .errors import InvalidArgument, NotSerializable

__all__ = ["MAX_VALUE_BYTES", "Encoded", "dumps", "dumps_mapping", "loads"]

# The default limit: results live in lease rows and history replies; a huge one belongs in the user's own
# tables. A store with a smaller request limit declares its own (``Store.max_value_bytes``).
MAX_VALUE_BYTES = 16 * 1024 * 1024


def dumps(value: Any, limit: int | None = None) -> str:
    """Encode ``value``; raise :class:`NotSerializable` (nothing written) if kombu's JSON cannot carry it
    or its text is over ``limit`` bytes (default :data:`MAX_VALUE_BYTES`), :class:`InvalidArgument` if it
    is nested deeper than the encoder can follow."""
    try:
        text: str = kombu_json.dumps(  # type: ignore[no-untyped-call]  # kombu ships no types here
            value, separators=(",", ":"), allow_nan=False
        )
    except RecursionError as exc:
        raise InvalidArgument(
            f"cannot store this {type(value).__name__}: it is nested too deeply for the JSON encoder"
        ) from exc
    except (TypeError, ValueError) as exc:
        raise NotSerializable(
            f"cannot store {type(value).__name__} as JSON ({exc}); return values Celery's JSON carries "
            "(dict, list, str, int, float, bool, None, datetime, date, time, UUID, Decimal, bytes)"
        ) from exc
    check_size(text, MAX_VALUE_BYTES if limit is None else limit)
    return text


def check_size(text: str, limit: int, what: str = "value") -> None:
    """Refuse ``text`` longer than ``limit`` bytes in UTF-8 (counted only when it could be)."""
    if len(text) > limit or (4 * len(text) > limit and len(text.encode()) > limit):
        raise NotSerializable(
            f"{what} of {len(text.encode())} bytes exceeds the {limit}-byte limit of this store; keep large "
            "data in your own tables and return a reference to it"
        )


def loads(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return kombu_json.loads(text)  # type: ignore[no-untyped-call]
    except RecursionError as exc:  # written by another encoder: the same refusal as at dumps
        raise InvalidArgument("a stored value is nested too deeply for the JSON decoder") from exc


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


def dumps_mapping(value: Mapping[str, Any] | None, limit: int | None = None) -> str | None:
    """Encode a run's info (``None`` stays ``None``), reusing the text of an :class:`Encoded` one.

    Over ``limit`` bytes, its arguments and options are left out (the run itself is not refused: only its
    recovery needs them) and ``dropped`` says why, so recovery can tell the operator.
    """
    if value is None:
        return None
    text = value.text if isinstance(value, Encoded) else dumps(dict(value))
    limit = MAX_VALUE_BYTES if limit is None else limit
    try:
        check_size(text, limit, "the run's arguments")
    except NotSerializable as exc:
        kept = {k: v for k, v in value.items() if k in ("task", "id", "fence_key")}
        return dumps({**kept, "args": None, "kwargs": None, "dropped": str(exc)}, limit)
    return text
