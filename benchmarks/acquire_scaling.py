"""Acquire latency with 10^3, 10^5 and 10^6 rows in the lease table (PostgreSQL, a schema of its own).

One schema per size. Each table is filled with finished leases (``done``, released, a result), and the
history with one line per lease, by ``INSERT ... SELECT generate_series`` (the audit trigger off for that
session only: ``session_replication_role = replica``; the token sequence is moved past every filled
token), then ``ANALYZE``. Then ``store.acquire`` of new keys is timed one by one, the sizes taking turns in
alternating rounds (so a burst of load elsewhere on the machine hits every size alike): median and p99 of
N acquires per size, after a warm-up; each acquire is completed afterwards, untimed.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from typing import Any

from sqlalchemy import create_engine, text

from celery_fence import StoreUnavailable

from .services import pg_schema
from .stats import percentile, rotated
from .stores import lease_store, opened
from .workers import retrying

SIZES = (1_000, 100_000, 1_000_000)
FILL = """
INSERT INTO fence_leases (key, token, owner, expires_at, done, result, recoveries, finished_at, event)
SELECT 'filled:' || g, g, 'bench-filler', NULL, true, :result, 0,
       extract(epoch from clock_timestamp()), 'complete'
FROM generate_series(CAST(:start AS bigint), CAST(:stop AS bigint)) g"""
ADVANCE = "SELECT setval('fence_token_seq', GREATEST(CAST(:stop AS bigint), last_value)) FROM fence_token_seq"
FILL_HISTORY = """
INSERT INTO fence_history (key, at, event, token, owner)
SELECT 'filled:' || g, extract(epoch from clock_timestamp()), 'complete', g, 'bench-filler'
FROM generate_series(CAST(:start AS bigint), CAST(:stop AS bigint)) g"""


def fill(url: str, start: int, stop: int) -> float:
    """Finished leases start..stop (and a history line each) in the store at ``url``; seconds taken."""
    engine = create_engine(url)
    began = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        conn.execute(text(FILL), {"start": start, "stop": stop, "result": '{"ok": true}'})
        conn.execute(text(FILL_HISTORY), {"start": start, "stop": stop})
        conn.execute(text(ADVANCE), {"stop": stop})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE fence_leases"))
        conn.execute(text("ANALYZE fence_history"))
    engine.dispose()
    return time.perf_counter() - began


def _latencies(store: Any, n: int, warmup: int) -> list[float]:
    run, out = uuid.uuid4().hex[:8], []
    for i in range(n + warmup):
        key = f"scale-{run}-{i}"
        started = time.perf_counter()
        try:
            lease = store.acquire(key, "bench-owner", 30.0)
        except StoreUnavailable:  # a connection killed from outside (a shared machine): not a sample
            continue
        elapsed = time.perf_counter() - started
        retrying(lambda: store.complete(lease, {"i": i}))  # noqa: B023
        if i >= warmup:
            out.append(elapsed * 1e6)
    return out


def run(acquires: int, log: Any, sizes: tuple[int, ...] = SIZES, rounds: int = 5) -> dict[str, Any]:
    out: dict[str, Any] = {"settings": {"acquires_per_size": acquires, "rounds": rounds, "warmup": 50}}
    with contextlib.ExitStack() as stack:
        stores = {}
        for size in sizes:  # one schema per size, all filled first, then measured in alternating rounds
            schema = stack.enter_context(pg_schema(f"scale{size}"))
            url = stack.enter_context(lease_store("postgresql", schema)).url
            fill_s = retrying(lambda: fill(url, 1, size))  # noqa: B023
            out[str(size)] = {"fill_seconds": round(fill_s, 2)}
            stores[size] = stack.enter_context(opened(url))
            _latencies(stores[size], 0, 50)
            log(f"  {size:>9,} rows filled in {fill_s:.1f} s")
        latencies: dict[int, list[float]] = {size: [] for size in sizes}
        for r in range(rounds):
            for size in rotated(sizes, r):
                latencies[size] += _latencies(stores[size], acquires // rounds, 5)
    for size in sizes:
        lat = latencies[size]
        out[str(size)] |= {
            "median_us": round(percentile(lat, 50), 1),
            "p99_us": round(percentile(lat, 99), 1),
        }
        r = out[str(size)]
        log(f"  {size:>9,} rows: acquire {r['median_us']} us median, {r['p99_us']} us p99")
    first, last = out[str(sizes[0])]["median_us"], out[str(sizes[-1])]["median_us"]
    out["median_ratio_largest_to_smallest"] = round(last / first, 3)
    return out
