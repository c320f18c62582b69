"""The fenced transaction on SQLite against PostgreSQL (issues 27.9, 30.3): what SQLite's one writer costs.

Two FencedTasks (lease mode) write the same row of a user table (in the lease store's database: the SQLite
file, the PostgreSQL schema):

- ``fenced_tx``, *with* ``transaction()``: the row goes into the run's transaction, which holds the store's
  write lock (SQLite: the whole database; PostgreSQL: its lease row) from its first statement to the
  completion that commits it;
- ``fenced_write``, *without*: the row commits in a transaction of its own (``engine.begin()``) between the
  acquire and the completion, each of the three a short write of its own.

Same fence, same row: the pair differs only in whether the row joins the fence's transaction, which is what
holds SQLite's lock across the completion (``bench.fenced``, which writes nothing, would measure the row's
own cost too). One ``celery worker -P prefork -c N`` per (store, N), N in 1, 2, 4, all six alive at once,
each on a queue of its own, running both variants; the batch method is :mod:`benchmarks.throughput`'s
(publish to a staging queue, ``RENAME`` it to the worker's queue, the clock stops when the broker holds no
message of the batch). In each round every cell (store, N, variant) gets a batch in turn, the order
rotating from round to round; the ratios (sqlite/postgresql, with/without) are taken per round. Effects:
every task's row is counted in the user table at the end. Then the cycle with ``transaction()`` without
Celery, on the same two stores (:mod:`benchmarks.tx_latency`): its latency tail.

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
# bench_app's FencedTasks writing the row in / outside self.fence.transaction()
WITH, WITHOUT = "fenced_tx", "fenced_write"
VARIANTS = (WITH, WITHOUT)
QUEUE = "fence_bench.tx"


def run(rounds: int, tasks: int, log: Any, cycle_seconds: float = 5.0) -> dict[str, Any]:
    from .bench_app import ROWS_DDL, app

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
            cells: dict[tuple[str, str], list[Cell]] = {}
            stores = {}
            for kind in STORES:
                lease = stack.enter_context(lease_store(kind, schema))
                stores[kind] = store = stack.enter_context(opened(lease.url))
                urls[kind] = lease.url
                with store.engine.begin() as conn:
                    conn.execute(text(ROWS_DDL))
                tx_latency.prepare(store)
                for v in VARIANTS:
                    cells[kind, v] = []
                for c in PROCESSES:
                    queue = f"{QUEUE}.{kind}.c{c}"
                    worker = stack.enter_context(
                        bench_worker(app, f"tx-{kind}-c{c}", lease, schema, queue, c)
                    )
                    ctx = {"store": store, "schema": schema, "live": queue, "rows": store.engine}
                    for v in VARIANTS:
                        cells[kind, v].append(Cell(f"{kind}/c{c}/{v}", v, worker, ctx))
            _rounds(app, [cell for key in cells for cell in cells[key]], rounds, tasks, log)
            sent = len(PROCESSES) * len(VARIANTS) * (warmup + rounds * tasks)
            for kind in STORES:
                out[kind] = {
                    "processes": {
                        str(c): {v: cells[kind, v][i].figures() for v in VARIANTS}
                        for i, c in enumerate(PROCESSES)
                    },
                    "with_over_without": _ratios(cells[kind, WITH], cells[kind, WITHOUT]),
                    "rows_written": f"{_rows(stores[kind])}/{sent}",
                }
            out["sqlite_over_postgresql"] = {
                v: _ratios(cells["sqlite", v], cells["postgresql", v]) for v in VARIANTS
            }
            out["cycles"] = tx_latency.run(urls, min(rounds, 3), cycle_seconds, log)
    finally:
        drop_redis_keys(STAGE, f"{QUEUE}.*", f"_kombu.binding.{QUEUE}.*")
    return out


def _ratios(top: list[Cell], bottom: list[Cell]) -> dict[str, Any]:
    """Per process count: ``top``'s tasks/s over ``bottom``'s, per round (median, min-max)."""
    return {str(c): summary(ratios(t.rates, b.rates)) for c, t, b in zip(PROCESSES, top, bottom, strict=True)}


def _rows(store: Any) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM fence_bench_tx")).scalar() or 0)
