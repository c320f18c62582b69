"""Renew cost with 1, 100 and 10,000 leases held in one process: store round trips and time per interval.

The process holds K live leases (ttl 30 s, renew interval 10 s) tracked by the library's own ``Renewer``;
each measured pass is one ``Renewer.tick()`` with every lease due (as at each interval of a long task),
counted at the driver boundary (:mod:`benchmarks.instrument`) and timed. The SQL stores' leases are taken
by the library's own acquire statement, all in one transaction (fast set-up); Redis and etcd leases by
``store.acquire`` in 8 threads.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from celery_fence.lease import Lease, LeasePolicy
from celery_fence.renewer import Renewer

from .instrument import count_round_trips
from .services import pg_schema
from .stats import summary
from .stores import STORES, lease_store, opened
from .workers import retrying

SIZES = (1, 100, 10_000)
POLICY = LeasePolicy(30.0)
PASSES = 3


class _Manual(Renewer):
    """The library's renewer, its passes driven here (no background thread to interleave its own)."""

    def _ensure_thread(self) -> None:
        return None


def _hold(store: Any, n: int) -> list[Lease]:
    owner, prefix = "bench-renew", f"renew-{uuid.uuid4().hex[:8]}"
    keys = [f"{prefix}-{i}" for i in range(n)]
    if hasattr(store, "q"):  # SQLStore: the library's acquire statement, in one transaction
        with store.engine.begin() as conn:
            params = [{"key": k, "owner": owner, "ttl": POLICY.ttl, "run": None} for k in keys]
            return [
                Lease(p["key"], int(conn.execute(store.q.acquire, p).scalar_one()), owner) for p in params
            ]
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda k: store.acquire(k, owner, POLICY.ttl), keys))


def _pass(renewer: Renewer, leases: list[Lease], counter: Any) -> tuple[int, float, int]:
    """One renewer pass with every lease due: (round trips, seconds, leases lost)."""
    lost: list[Lease] = []
    due = time.monotonic() - POLICY.interval  # last renewed one interval ago: due, far from its deadline
    for lease in leases:
        renewer.track(lease, POLICY, due, lambda lease, _why: lost.append(lease))
    before = sum(counter.values())
    started = time.perf_counter()
    renewer.tick()
    elapsed = time.perf_counter() - started
    return sum(counter.values()) - before, elapsed, len(lost)


def _one_store(url: str, log: Any, kind: str) -> dict[str, Any]:
    counter = count_round_trips(url)
    out: dict[str, Any] = {}
    with opened(url) as store:
        renewer = _Manual(store, POLICY.interval)
        for n in SIZES:
            leases = retrying(lambda: _hold(store, n))  # noqa: B023
            _pass(renewer, leases, counter)  # warm-up
            trips, times, lost = [], [], 0
            for _ in range(PASSES):
                t, s, x = _pass(renewer, leases, counter)
                trips.append(t)
                times.append(s)
                lost += x
            for lease in leases:
                renewer.untrack(lease)
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
