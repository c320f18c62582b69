"""A store with the run role only (``RunStore``): what a third party's minimal store looks like. It keeps
its leases in a memory store and exposes nothing else, so the run-role contract shows that a run needs no
history, administration or recovery."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest

from celery_fence import Lease, LeaseState
from celery_fence.stores.memory import MemoryStore
from celery_fence.testing import FakeClock
from celery_fence.testing import StoreHarness as Harness


class RunOnlyStore:
    url = "run-only://"

    def __init__(self) -> None:
        self._leases = MemoryStore(clock=FakeClock())
        self.max_value_bytes = self._leases.max_value_bytes

    def migrate(self) -> None:
        self._leases.migrate()

    def acquire(self, key: str, owner: str, ttl: float, run: Mapping[str, Any] | None = None) -> Lease:
        return self._leases.acquire(key, owner, ttl, run)

    def renew(self, leases: Sequence[Lease], ttl: float) -> list[Lease]:
        return self._leases.renew(leases, ttl)

    def complete(self, lease: Lease, result: Any) -> None:
        self._leases.complete(lease, result)

    def release(self, lease: Lease) -> None:
        self._leases.release(lease)

    def save_step(self, lease: Lease, name: str, value: Any) -> None:
        self._leases.save_step(lease, name, value)

    def steps(self, key: str) -> dict[str, Any]:
        return self._leases.steps(key)

    def refuse(self, lease: Lease, what: str) -> None:
        self._leases.refuse(lease, what)

    def get(self, key: str) -> LeaseState | None:
        return self._leases.get(key)

    def close(self) -> None:
        self._leases.close()

    def expire_all(self) -> None:
        assert isinstance(self._leases.clock, FakeClock)
        self._leases.clock.advance(10_000)


def _open(request: pytest.FixtureRequest) -> Iterator[Any]:
    yield RunOnlyStore()


RUN_ONLY = Harness("run-only", _open, RunOnlyStore.expire_all, multiprocess=False)
