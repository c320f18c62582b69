"""Replays one program printed by a failing simulation test:
``FENCE_SIM_REPLAY="memory:3.0.1..." .venv/bin/pytest tests/simulation/test_replay.py -s``
(``sqlite:``, ``postgresql:``, ``memory-eager:`` likewise). Skipped when the variable is not set."""

from __future__ import annotations

import os

import pytest

from .runner import replay
from .sim import Simulator

SPEC = os.environ.get("FENCE_SIM_REPLAY", "")


@pytest.fixture
def sim(request: pytest.FixtureRequest) -> Simulator:
    store = SPEC.partition(":")[0].split("-")[0]
    return request.getfixturevalue(f"{store}_sim")  # type: ignore[no-any-return]


@pytest.mark.skipif(not SPEC, reason="set FENCE_SIM_REPLAY to a printed program")
def test_replay(sim: Simulator) -> None:
    replay(sim, SPEC)
