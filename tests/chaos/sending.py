"""How the chaos cases choose their stores and send their runs: in batches of ``BATCH``, one run per pool
process, and what a case that killed each run once then expects of every key."""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

from tests.integration.fenced_app import chaos
from tests.integration.world import ALL_STORES, Cluster, on_rabbitmq

# Runs faulted at once, one per pool process: `make soak` raises it so 1,000 runs per case take minutes.
BATCH = int(os.environ.get("FENCE_SOAK_BATCH", "4"))


def every_store(*names: str, **options: str) -> list[Any]:
    return [pytest.param({"store": name, **options}, id=name) for name in names or ALL_STORES]


# The cases where the broker's redelivery matters also run on RabbitMQ, with one store.
AND_RABBITMQ = on_rabbitmq()


def batches(runs: int) -> list[int]:
    return [min(BATCH, runs - start) for start in range(0, runs, BATCH)]


def send(queue: str, count: int, pause: float, hold: bool = False) -> list[str]:
    ids = [str(uuid.uuid4()) for _ in range(count)]
    for task_id in ids:
        chaos.apply_async((task_id,), {"pause": pause, "hold": hold}, task_id=task_id, queue=queue)
    return ids


def assert_every_key_ran_twice(cluster: Cluster, keys: list[str]) -> None:
    """The killed run and the one after it: two owners leased each key (by a takeover once the ttl passed,
    or at once when the worker's main process released the dead process's lease)."""
    owners: dict[str, set[Any]] = {key: set() for key in keys}
    for event in cluster.store.history():
        if event.key in owners and event.event in ("acquire", "takeover"):
            owners[event.key].add(event.owner)
    assert all(len(found) >= 2 for found in owners.values()), owners


def all_started(cluster: Cluster, ids: list[str]) -> bool:
    return all(any(cluster.workdir.glob(f"{i}.*.started")) for i in ids)
