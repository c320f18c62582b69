"""The ``stores`` mark (tests/support/harness_fixtures.py) chooses harnesses by name and by the
``transactions`` capability, in name order; no mark is every harness, and a name or option it does not know
is a usage error."""

from __future__ import annotations

import pytest

from tests.support.harness_fixtures import chosen
from tests.support.harnesses import HARNESSES


def test_no_mark_chooses_every_harness() -> None:
    assert chosen(None) == sorted(HARNESSES)


def test_names_and_the_stores_with_transactions_are_chosen_together_in_name_order() -> None:
    assert chosen(pytest.mark.stores("memory", transactions=True).mark) == ["memory", "postgresql", "sqlite"]
    assert chosen(pytest.mark.stores("sqlite", "memory").mark) == ["memory", "sqlite"]
    assert chosen(pytest.mark.stores("run-only").mark) == ["run-only"]


UNKNOWN = [pytest.mark.stores("mysql"), pytest.mark.stores("memory", multiprocess=True)]


@pytest.mark.parametrize("mark", UNKNOWN, ids=["name", "option"])
def test_a_name_or_option_the_mark_does_not_know_is_a_usage_error(mark: pytest.MarkDecorator) -> None:
    with pytest.raises(pytest.UsageError, match="stores"):
        chosen(mark.mark)
