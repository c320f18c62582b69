"""Fenced-transaction cycles without Celery: where SQLite's one writer shows (issue 27.9).

N processes (spawned, one store each) run the cycle of a FencedTask that writes one row in its transaction,
back to back for a fixed time on one store: acquire, the run's transaction (the guard and one ``INSERT``),
the completion that commits it. Each cycle's latency is recorded, and the cycles each process finished in
every 1 s window. SQLite and PostgreSQL alternate within each round, on the same cycle; so do the cycle
*with* ``transaction()`` and the cycle *without*: acquire, the same ``INSERT`` in a transaction of its own
(``engine.begin()`` on an engine of the process's own), the completion.

SQLite has no queue for its write lock: a writer that finds it taken sleeps in SQLite's busy handler
(1, 2, 5, 10 ... then 100 ms between tries) and may lose every try to the writers that come back sooner.
The tail (p99, max) and the slowest windows show it; the median does not.
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from typing import Any

from sqlalchemy import text

from .stats import percentile, rotated, summary

PROCESSES = (2, 4)
TABLE_DDL = "CREATE TABLE fence_bench_cycles (key VARCHAR(64) NOT NULL)"


def prepare(store: Any) -> None:
    with store.engine.begin() as conn:
        conn.execute(text(TABLE_DDL))


def _cycles(url: str, seconds: float, ready: Any, start: Any, out: Any, joined: bool = True) -> None:
    from sqlalchemy import create_engine

    from celery_fence import open_store
    from celery_fence.fence import Fence

    store = open_store(url)
    own = create_engine(url)
    insert = text("INSERT INTO fence_bench_cycles (key) VALUES (:k)")
    latencies, windows, in_window = [], [], 0
    ready.put(True)  # imported and opened: what is measured starts together
    start.wait()
    began = window = time.monotonic()
    while time.monotonic() - began < seconds:
        sent = time.monotonic()
        key = uuid.uuid4().hex
        fence = Fence(store, store.acquire(key, "w", 30.0), None, 30.0)
        with fence.transaction() if joined else own.begin() as conn:
            conn.execute(insert, {"k": key})
        fence.commit("ok")
        now = time.monotonic()
        latencies.append(now - sent)
        in_window += 1
        if now - window >= 1.0:
            windows.append(in_window)
            in_window, window = 0, now
    store.close()
    own.dispose()
    out.put((latencies, windows))


def measure(url: str, processes: int, seconds: float, joined: bool = True) -> dict[str, Any]:
    """One fixed-time run of ``processes`` processes on ``url``; the row in ``transaction()`` if ``joined``
    (else in a transaction of its own)."""
    ctx = multiprocessing.get_context("spawn")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    args = (url, seconds, ready, start, out, joined)
    procs = [ctx.Process(target=_cycles, args=args) for _ in range(processes)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=120)
    start.set()
    reports = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join(30)
    latencies = sorted(v for lat, _ in reports for v in lat)
    windows = [w for _, ws in reports for w in ws]
    return {
        "cycles_per_s": len(latencies) / seconds,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "max_ms": latencies[-1] * 1000,
        "slowest_window_over_median": min(windows) / percentile(windows, 50),
    }


MODES = {"with": True, "without": False}  # the row in transaction(), or in a transaction of its own


def run(urls: dict[str, str], rounds: int, seconds: float, log: Any) -> dict[str, Any]:
    """``urls``: a prepared store per kind. Per process count, kind and mode (``{kind} {mode}``): each
    figure's median over rounds."""
    out: dict[str, Any] = {"settings": {"rounds": rounds, "seconds": seconds, "processes": list(PROCESSES)}}
    cells = [(kind, mode) for kind in urls for mode in MODES]
    for n in PROCESSES:
        runs: dict[str, list[dict[str, Any]]] = {f"{k} {m}": [] for k, m in cells}
        for r in range(rounds):
            for kind, mode in rotated(cells, r):
                runs[f"{kind} {mode}"].append(measure(urls[kind], n, seconds, MODES[mode]))
            line = ", ".join(
                f"{k} {m[-1]['cycles_per_s']:.0f}/s p99 {m[-1]['p99_ms']:.1f} ms max {m[-1]['max_ms']:.0f} ms"
                for k, m in runs.items()
            )
            log(f"  cycles, {n} processes, round {r + 1}/{rounds}: {line}")
        out[str(n)] = {
            kind: {figure: summary([m[figure] for m in ms], 2) for figure in ms[0]}
            for kind, ms in runs.items()
        }
    return out
