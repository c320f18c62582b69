"""The value codec: JSON text, refused values raise NotSerializable, a size limit."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from celery_fence import codec
from celery_fence.errors import NotSerializable

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


@pytest.mark.parametrize(
    "value",
    [{1, 2}, object(), Decimal("1.5"), b"bytes", math.nan, math.inf, -math.inf, [1, math.nan], {"k": {3}}],
)
def test_values_json_cannot_carry_are_refused(value: object) -> None:
    with pytest.raises(NotSerializable) as info:
        codec.dumps(value)
    assert isinstance(info.value, TypeError)
    assert "JSON" in str(info.value)
    assert isinstance(info.value.__cause__, (TypeError, ValueError))


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
