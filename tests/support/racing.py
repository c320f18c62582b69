"""Processes racing for keys on one real store: each opens its own store by URL after fork."""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from celery_fence import AlreadyDone, LeaseHeld, StaleToken, open_store
from celery_fence.lease import new_owner
from celery_fence.testing.contract.checks import in_processes


@dataclass
class RaceResult:
    tokens: list[list[int]] = field(default_factory=list)  # per process, in acquisition order
    completions: dict[str, int] = field(default_factory=dict)
    refused: int = 0

    def check_tokens(self) -> None:
        every = [t for per_process in self.tokens for t in per_process]
        assert len(every) == len(set(every)), "a token was issued twice"
        for per_process in self.tokens:
            assert per_process == sorted(per_process), "tokens went backwards within one process"


def _racer(url: str, keys: list[str], rounds: int, seed: int, out: Any) -> None:
    rng = random.Random(seed)
    store = open_store(url)
    tokens, completed, refused = [], [], 0
    with_effects = hasattr(store, "transaction")
    for _ in range(rounds):
        key = rng.choice(keys)
        try:
            lease = store.acquire(key, new_owner(), 0.2)
        except (LeaseHeld, AlreadyDone):
            continue
        tokens.append(lease.token)
        if rng.random() < 0.3:
            time.sleep(0.25)  # stall past the ttl: another process may take over
        try:
            if with_effects:
                from sqlalchemy import text

                with store.transaction(lease) as conn:  # type: ignore[attr-defined]
                    conn.execute(
                        text("INSERT INTO fence_test_effects VALUES (:k, :t, 'racer')"),
                        {"k": key, "t": lease.token},
                    )
            store.complete(lease, {"token": lease.token})
            completed.append(key)
        except StaleToken:
            refused += 1
    store.close()
    out.put((tokens, completed, refused))


def race(url: str, keys: list[str], processes: int, rounds: int) -> RaceResult:
    reports = in_processes(_racer, [(url, keys, rounds, seed) for seed in range(processes)])
    result = RaceResult()
    counts: Counter[str] = Counter()
    for tokens, completed, refused in reports:
        result.tokens.append(tokens)
        counts.update(completed)
        result.refused += refused
    # keys nobody finished (every attempt was busy) are completed here, so each key is checked once
    store = open_store(url)
    for key in keys:
        if counts[key] == 0:
            try:
                store.complete(store.acquire(key, new_owner(), 5.0), "late")
                counts[key] += 1
            except AlreadyDone:
                pass
    store.close()
    result.completions = dict(counts)
    return result
