"""The store faults of the indeterminate-outcome cases: every store call of a run, failing before the store
acts or acting with its reply lost, at most one fault per key.

A soak draws them (each call's two outcomes with probability ``SOAK_RATE`` until one has fired for the key),
so its faults spread over every call. The short form's few keys could all miss a draw (a CI run faulted 1 of
its 4), so there each key also gets a planned fault on a call every run makes, listed first: every key is sure
to meet one, and which call still varies with the draws that come before it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from celery_fence.testing import Fault, store_faults_env
from celery_fence.testing._indeterminate import LOG_ENV

from .checks import RUNS
from .sending import BATCH

OUTCOMES = ("before", "lost")
SOAK_RATE = 0.15
SHORT_RATE = 0.4


@dataclass(frozen=True)
class FaultPlan:
    keys: list[str]
    faults: list[Fault]
    log: Path  # one line per fault fired: ``key method outcome``
    sure: bool  # every key is planned a fault (the short form), else only most of them meet one

    @property
    def env(self) -> dict[str, str]:
        """A worker's environment that makes its store calls meet these faults."""
        return {**store_faults_env(*self.faults), LOG_ENV: str(self.log)}

    def batches(self) -> Iterator[list[str]]:
        """The keys, a batch at a time: one run per pool process."""
        for start in range(0, len(self.keys), BATCH):
            yield self.keys[start:start + BATCH]

    def assert_met(self) -> None:
        """Every key met a fault (the short form), or most did (a soak)."""
        faulted = {line.split()[0] for line in self.log.read_text().splitlines()} & set(self.keys)
        print(f"faulted runs: {len(faulted)} of {len(self.keys)}")
        if self.sure:
            assert faulted == set(self.keys)
        else:
            assert len(faulted) >= len(self.keys) // 2  # most runs met a fault


def plan_faults(methods: tuple[str, ...], every_run_calls: tuple[str, ...], log: Path) -> FaultPlan:
    """``methods``: the calls to fault; ``every_run_calls``: those a run that meets no fault surely makes."""
    keys = [str(uuid.uuid4()) for _ in range(RUNS)]
    sure = RUNS < 50
    rate = SHORT_RATE if sure else SOAK_RATE
    drawn = [Fault(outcome, method, rate=rate, per_key=True) for method in methods for outcome in OUTCOMES]
    combos = [(method, outcome) for method in every_run_calls for outcome in OUTCOMES]
    planned = [
        Fault(outcome, method, rate=1.0, per_key=True, keys=[key])
        for key, (method, outcome) in zip(keys, combos * len(keys), strict=False)  # combos, cycled
    ] if sure else []
    return FaultPlan(keys, planned + drawn, log, sure)
