"""The fenced transaction on SQLite against PostgreSQL (issue 27.9): what SQLite's one writer costs.

FencedTask whose body writes one row of a user table through ``self.fence.transaction()`` (the table lives
in the lease store's database: the SQLite file, the PostgreSQL schema), so every task holds the store's
write lock (SQLite: the whole database; PostgreSQL: its lease row) from its transaction's first statement
to its completion. One ``celery worker -P prefork -c N`` per (store, N), N in 1, 2, 4, all six alive at
once, each on a queue of its own; the batch method is :mod:`benchmarks.throughput`'s (publish to a staging
queue, ``RENAME`` it to the worker's queue, the clock stops when the broker holds no message of the batch).
In each round every cell gets a batch in turn, the order rotating from round to round; sqlite/postgresql
is taken per round and N. Effects: every task's row is counted in the user table at the end. Then the same
cycle without Celery, on the same two stores (:mod:`benchmarks.tx_latency`): its latency tail.

On a machine with fewer cores than processes the processes take turns on the cores: what the ratio shows
is SQLite's serialised writers against PostgreSQL's row locks at equal CPU, not scaling.
"""

from __future__ import annotations

import contextlib
from typing import Any

from sqlalchemy import text

from . import tx_latency
from .curve import Cell, _rounds
from .services import drop_redis_keys, pg_schema
from .stats import ratios, summary
from .stores import lease_store, opened
from .throughput import STAGE, bench_worker

PROCESSES = (1, 2, 4)
STORES = ("sqlite", "postgresql")
VARIANT = "fenced_tx"  # bench_app's FencedTask that writes its row in self.fence.transaction()
TABLE_DDL = "CREATE TABLE fence_bench_tx (key VARCHAR(200) PRIMARY KEY, i INTEGER NOT NULL)"
QUEUE = "fence_bench.tx"


def run(rounds: int, tasks: int, log: Any, cycle_seconds: float = 5.0) -> dict[str, Any]:
    from .bench_app import app

    warmup = max(50, tasks // 10)
    out: dict[str, Any] = {
        "settings": {
            "rounds": rounds,
            "tasks_per_batch": tasks,
            "warmup": warmup,
            "processes": list(PROCESSES),
        }
    }
    urls: dict[str, str] = {}
    try:
        with contextlib.ExitStack() as stack:
            schema = stack.enter_context(pg_schema("tx"))
            cells: dict[str, list[Cell]] = {}
            stores = {}
            for kind in STORES:
                lease = stack.enter_context(lease_store(kind, schema))
                stores[kind] = store = stack.enter_context(opened(lease.url))
                urls[kind] = lease.url
                with store.engine.begin() as conn:
                    conn.execute(text(TABLE_DDL))
                tx_latency.prepare(store)
                cells[kind] = []
                for c in PROCESSES:
                    queue = f"{QUEUE}.{kind}.c{c}"
                    worker = stack.enter_context(
                        bench_worker(app, f"tx-{kind}-c{c}", lease, schema, queue, c)
                    )
                    ctx = {"store": store, "schema": schema, "live": queue}
                    cells[kind].append(Cell(f"{kind}/c{c}", VARIANT, worker, ctx))
            _rounds(app, [cell for kind in STORES for cell in cells[kind]], rounds, tasks, log)
            sent = len(PROCESSES) * (warmup + rounds * tasks)
            for kind in STORES:
                out[kind] = {str(c): cell.figures() for c, cell in zip(PROCESSES, cells[kind], strict=True)}
                out[kind]["rows_written"] = f"{_rows(stores[kind])}/{sent}"
            out["sqlite_over_postgresql"] = {
                str(c): summary(ratios(sq.rates, pg.rates))
                for c, sq, pg in zip(PROCESSES, cells["sqlite"], cells["postgresql"], strict=True)
            }
            out["cycles"] = tx_latency.run(urls, min(rounds, 3), cycle_seconds, log)
    finally:
        drop_redis_keys(STAGE, f"{QUEUE}.*", f"_kombu.binding.{QUEUE}.*")
    return out


def _rows(store: Any) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM fence_bench_tx")).scalar() or 0)
