"""A Hypothesis sweep of bad input over every public store method, on every store (issue 14, point 10).

Each example calls one method with arguments drawn from odd values (text with NUL and lone surrogates, huge
and negative numbers, NaN and infinities, wrong types, leases and abandoned runs built from them) mixed with
good ones. The store may accept a call (its state may then change), or refuse it; a refusal must be a
``FenceError`` and must leave ``leases()``, ``history()`` and every key's steps unchanged (a ``StaleToken``
only adds its ``refused`` line to the history, as the contract says). Bounded: a fixed
number of examples per store, no deadline (store latency varies), the store shared across examples.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_fence import FenceError, Lease, StaleToken
from celery_fence.lease import Abandoned

from .checks import EVERY_ROLE, MAX_TOKEN, dump

REQUIRES = EVERY_ROLE  # dump() reads leases, history and steps

EXAMPLES = 120

odd_text = st.one_of(
    st.sampled_from(["live", "done", "k", "", "a\x00b", "\ud800", "x" * 1025, "ä/€", "%00"]),
    st.text(st.characters(codec=None, categories=None), max_size=12),  # any code point, surrogates too
)
odd_number = st.one_of(
    st.sampled_from([0, -1, 1, 2, 30, MAX_TOKEN, MAX_TOKEN + 1, 2**63, -(2**63), 10**400, True]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(),
)
wrong_type = st.sampled_from([None, b"bytes", [1], {"k": 1}, object(), (1, 2)])
anything = st.one_of(odd_text, odd_number, wrong_type)
value = st.one_of(
    st.none(), st.integers(), odd_text, st.just(math.nan), st.just(object()), st.lists(st.integers())
)
lease = st.one_of(
    st.builds(
        Lease, key=st.one_of(odd_text, wrong_type), token=odd_number, owner=st.one_of(odd_text, wrong_type)
    ),
    wrong_type,
)
seen = st.one_of(
    st.builds(Abandoned, key=odd_text, token=odd_number, run=st.none(), recoveries=odd_number), wrong_type
)
age = st.one_of(odd_number, wrong_type, st.just(3600.0))

CALLS = {
    "acquire": st.tuples(
        anything, anything, anything, st.one_of(st.none(), st.dictionaries(odd_text, value))
    ),
    "renew": st.tuples(st.one_of(st.lists(lease, max_size=3), wrong_type, odd_text), anything),
    "complete": st.tuples(lease, value),
    "release": st.tuples(lease),
    "save_step": st.tuples(lease, anything, value),
    "steps": st.tuples(anything),
    "refuse": st.tuples(lease, anything),
    "get": st.tuples(anything),
    "history": st.tuples(anything),
    "force_release": st.tuples(anything),
    "prune": st.tuples(age),
    "advance": st.tuples(anything),
    "abandoned": st.tuples(age, anything),
    "recover": st.tuples(seen, anything, anything),
    "strand": st.tuples(anything, st.one_of(st.none(), st.dictionaries(odd_text, value)), anything),
}
call = st.sampled_from(sorted(CALLS)).flatmap(lambda name: st.tuples(st.just(name), CALLS[name]))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=call)
def test_bad_input_sweep(fence_contract_seeded: Any, drawn: tuple[str, tuple[Any, ...]]) -> None:
    store, _ = fence_contract_seeded
    name, args = drawn
    before = dump(store)
    try:
        getattr(store, name)(*args)
    except StaleToken:  # a well-formed but stale write: refused, and the refusal recorded by contract
        states, _, steps = dump(store)
        assert (states, steps) == (before[0], before[2]), f"a refused {name}{args!r} changed the store"
    except FenceError:
        assert dump(store) == before, f"a refused {name}{args!r} changed the store"
