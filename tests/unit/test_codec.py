"""The value codec: kombu's JSON (what Celery's JSON carries), refused values raise NotSerializable, a size
limit, and nesting the encoder cannot follow is InvalidArgument."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_fence import codec
from celery_fence.errors import InvalidArgument, NotSerializable

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(JSON)
def test_json_values_round_trip(value: object) -> None:
    assert codec.loads(codec.dumps(value)) == value


@pytest.mark.parametrize(
    "value", [None, True, 0, -7, 2**80, 1.5, "", "ünïcödé ✓", [1, [2, {}]], {"a": {"b": [None, False]}}]
)
def test_examples_round_trip(value: object) -> None:
    text = codec.dumps(value)
    assert isinstance(text, str)
    assert codec.loads(text) == value


def test_dumps_is_compact_json() -> None:
    assert codec.dumps({"a": [1, 2]}) == '{"a":[1,2]}'


def test_loads_none_is_none() -> None:
    assert codec.loads(None) is None
    assert codec.loads("null") is None


def test_tuples_come_back_as_lists() -> None:
    assert codec.loads(codec.dumps((1, (2, 3)))) == [1, [2, 3]]


RICH = {
    "at": dt.datetime(2026, 12, 1, 9, 30, 15, 123456, tzinfo=dt.timezone.utc),
    "naive": dt.datetime(2026, 12, 1, 9, 30),
    "day": dt.date(2026, 12, 1),
    "time": dt.time(23, 59, 58, 1),
    "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "amount": Decimal("1234.5600"),
    "raw": b"\x00\xff binary",
    "text_bytes": b"plain",
    "nested": [{"when": dt.date(2000, 1, 1), "ids": [uuid.UUID(int=7)], "d": Decimal("-0.1")}],
}


@pytest.mark.parametrize("name", sorted(RICH))
def test_what_celerys_json_carries_round_trips_with_its_type(name: str) -> None:
    value = RICH[name]
    back = codec.loads(codec.dumps(value))
    assert back == value
    assert type(back) is type(value)


def test_a_stored_value_equals_what_kombus_json_gives_the_caller() -> None:
    from kombu.utils import json as kombu_json

    assert codec.loads(codec.dumps(RICH)) == kombu_json.loads(kombu_json.dumps(RICH)) == RICH


@pytest.mark.parametrize(
    "value", [{1, 2}, object(), math.nan, math.inf, -math.inf, [1, math.nan], {"k": {3}}]
)
def test_values_json_cannot_carry_are_refused(value: object) -> None:
    with pytest.raises(NotSerializable) as info:
        codec.dumps(value)
    assert isinstance(info.value, TypeError)
    assert "JSON" in str(info.value)
    assert isinstance(info.value.__cause__, (TypeError, ValueError))


def _nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


def test_nesting_deeper_than_the_encoder_follows_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="nested too deeply"):
        codec.dumps(_nested(100_000))


def test_stored_text_nested_too_deeply_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgument, match="nested too deeply"):
        codec.loads("[" * 100_000 + "]" * 100_000)


def test_a_limit_smaller_than_the_default_is_honoured() -> None:
    assert codec.dumps("x" * 8, limit=10) == '"' + "x" * 8 + '"'
    with pytest.raises(NotSerializable, match="exceeds the 10-byte limit"):
        codec.dumps("x" * 9, limit=10)


def test_a_run_record_over_the_limit_keeps_its_name_and_says_why_its_arguments_were_left_out() -> None:
    run = {"task": "t", "id": "i", "args": ["x" * 1000], "kwargs": {}, "options": {}}
    kept = codec.loads(codec.dumps_mapping(run, limit=800))
    assert (kept["task"], kept["id"], kept["args"], kept["kwargs"]) == ("t", "i", None, None)
    assert "exceeds the 800-byte limit" in kept["dropped"]


def test_non_str_dict_keys_are_refused() -> None:
    with pytest.raises(NotSerializable):
        codec.dumps({(1, 2): "tuple key"})


def test_the_size_limit_is_16_mib() -> None:
    assert codec.MAX_VALUE_BYTES == 16 * 1024 * 1024


def test_a_value_at_the_limit_is_accepted_and_one_above_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "MAX_VALUE_BYTES", 10)
    assert codec.dumps("x" * 8) == '"' + "x" * 8 + '"'  # 10 bytes with the quotes
    with pytest.raises(NotSerializable, match="exceeds the 10-byte limit"):
        codec.dumps("x" * 9)


def test_a_value_over_the_real_limit_is_refused() -> None:
    with pytest.raises(NotSerializable, match="byte limit"):
        codec.dumps("x" * codec.MAX_VALUE_BYTES)


def test_the_limit_counts_encoded_text_not_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "MAX_VALUE_BYTES", 10)
    with pytest.raises(NotSerializable):
        codec.dumps("é" * 3)  # 3 characters, but JSON-escaped to "\u00e9" each: 20 bytes
