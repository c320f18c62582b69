"""Renew cost with 1, 100 and 10,000 leases held in one process: store round trips and time per interval.

The process holds K live leases (ttl 30 s), taken by ``store.acquire`` in 8 threads. Each measured pass is
what the library's renewer sends at each interval when every lease it holds is due and all share one ttl:
one ``store.renew(leases, ttl)`` (the renewer makes one such call per distinct ttl), counted at the driver
boundary (:mod:`benchmarks.instrument`) and timed. The renewer's own bookkeeping around that call (picking
the due leases, setting their new deadlines) is not in the figure: the benchmarks use public names only,
and the renewer is internal.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from celery_fence import Lease, LeasePolicy, Store

from .instrument import count_round_trips
from .services import pg_schema
from .stats import summary
from .stores import STORES, lease_store, opened
from .workers import retrying

SIZES = (1, 100, 10_000)
POLICY = LeasePolicy(30.0)
PASSES = 3


def _hold(store: Store, n: int) -> list[Lease]:
    owner, prefix = "bench-renew", f"renew-{uuid.uuid4().hex[:8]}"
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda i: store.acquire(f"{prefix}-{i}", owner, POLICY.ttl), range(n)))


def _pass(store: Store, leases: list[Lease], counter: Any) -> tuple[int, float, int]:
    """One renew of every lease, as the renewer sends it: (round trips, seconds, leases lost)."""
    before = sum(counter.values())
    started = time.perf_counter()
    lost = store.renew(leases, POLICY.ttl)
    elapsed = time.perf_counter() - started
    return sum(counter.values()) - before, elapsed, len(lost)


def _one_store(url: str, log: Any, kind: str) -> dict[str, Any]:
    counter = count_round_trips(url)
    out: dict[str, Any] = {}
    with opened(url) as store:
        for n in SIZES:
            leases = retrying(lambda: _hold(store, n))  # noqa: B023
            _pass(store, leases, counter)  # warm-up
            trips, times, lost = [], [], 0
            for _ in range(PASSES):
                t, s, x = _pass(store, leases, counter)
                trips.append(t)
                times.append(s)
                lost += x
            median = statistics.median(times)
            out[str(n)] = {
                "round_trips_per_pass": max(trips),
                "ms_per_pass": summary([t * 1000 for t in times], 2),
                "share_of_interval": round(median / POLICY.interval, 5),
                "lost": lost,
            }
            log(f"  {kind} {n} leases: {max(trips)} round trip(s), {median * 1000:.1f} ms per pass")
    return out


def run(log: Any, stores: tuple[str, ...] = STORES) -> dict[str, Any]:
    out: dict[str, Any] = {"settings": {"ttl": POLICY.ttl, "interval": POLICY.interval, "passes": PASSES}}
    with pg_schema("renew") as schema:
        for kind in stores:
            with contextlib.ExitStack() as stack:
                url = stack.enter_context(lease_store(kind, schema)).url
                out[kind] = _one_store(url, log, kind)
    return out
