"""The store faults of the indeterminate-outcome cases: every store call of a run, failing before the store
acts or acting with its reply lost, at most one fault per key.

A soak draws them (each call's two outcomes with probability ``SOAK_RATE`` until one has fired for the key),
so its faults spread over every call. The short form's few keys could all miss a draw (a CI run faulted 1 of
its 4), so there each key also gets a planned fault on a call every run makes, listed first: every key is sure
to meet one, and which call still varies with the draws that come before it.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from .checks import RUNS

OUTCOMES = ("before", "lost")
SOAK_RATE = 0.15
SHORT_RATE = 0.4


@dataclass(frozen=True)
class FaultPlan:
    keys: list[str]
    env: dict[str, str]
    sure: bool  # every key is planned a fault (the short form), else only most of them meet one

    def assert_met(self, faulted: set[str]) -> None:
        print(f"faulted runs: {len(faulted)} of {len(self.keys)}")
        if self.sure:
            assert faulted == set(self.keys)
        else:
            assert len(faulted) >= len(self.keys) // 2  # most runs met a fault


def plan_faults(methods: tuple[str, ...], every_run_calls: tuple[str, ...], log: str) -> FaultPlan:
    """``methods``: the calls to fault; ``every_run_calls``: those a run that meets no fault surely makes."""
    keys = [str(uuid.uuid4()) for _ in range(RUNS)]
    sure = RUNS < 50
    rate = SHORT_RATE if sure else SOAK_RATE
    drawn = [
        {"method": method, "rate": rate, "outcome": outcome, "per_key": True}
        for method in methods
        for outcome in OUTCOMES
    ]
    combos = [(method, outcome) for method in every_run_calls for outcome in OUTCOMES]
    planned = [
        {"method": method, "rate": 1.0, "outcome": outcome, "per_key": True, "keys": [key]}
        for key, (method, outcome) in zip(keys, combos * len(keys), strict=False)  # combos, cycled
    ] if sure else []
    faults = json.dumps(planned + drawn)
    return FaultPlan(keys, {"CELERY_FENCE_STORE_FAULTS": faults, "CELERY_FENCE_STORE_FAULTS_LOG": log}, sure)
