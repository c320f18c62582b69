"""A run's client CPU in this process: ``python -m benchmarks.run_cpu [--store S] [--tasks N] [--rounds R]``.

The variants of ``fence_cost`` that write one row (the unfenced write, the lease mode with
``transaction()``, commit mode, and on PostgreSQL the hand-written fence) run through Celery's ``apply()``
in this process, on a fresh store: no broker, no events, no pool, so what is measured is the task's own
path, the run path and the driver. Variants alternate, R rounds of N tasks each after a warm-up; prints the
median client CPU (``time.process_time``) and wall time per task, and each variant's CPU over the unfenced
write's in the same round. Steadier than the worker benchmark, whose rounds move by a quarter on this
machine: use it to see what a change to the run path costs, and read ``fence_cost`` for the throughput.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from typing import Any

from sqlalchemy import create_engine

from .services import pg_schema
from .stats import ratios, rotated
from .stores import lease_store

VARIANTS = ("plain_write", "fenced_tx", "fenced_commit", "handwritten_write")


def _round(task: Any, n: int) -> tuple[float, float]:
    """CPU and wall µs per task over ``n`` runs of ``task``."""
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(n):
        task.apply((i, "cpu"), task_id=uuid.uuid4().hex)
    return (time.process_time() - cpu) / n * 1e6, (time.perf_counter() - wall) / n * 1e6


def measure(store: str, tasks: int, rounds: int) -> dict[str, dict[str, float]]:
    with pg_schema("cpu") as schema, lease_store(store, schema) as lease:
        from . import throughput

        rows = throughput.rows_url(lease, schema)
        os.environ.update(
            FENCE_BENCH_STORE=lease.url, FENCE_BENCH_PG_DSN=schema.dsn, FENCE_BENCH_ROWS_URL=rows
        )
        from .bench_app import ROWS_DDL, app  # reads the env above

        throughput._create_user_tables(schema)
        with create_engine(rows).begin() as conn:  # the row's table where the variants write it
            conn.exec_driver_sql(ROWS_DDL)
        names = [v for v in VARIANTS if store == "postgresql" or not v.startswith("handwritten")]
        tasks_of = {v: app.tasks[f"bench.{v}"] for v in names}
        for task in tasks_of.values():
            _round(task, max(10, tasks // 10))  # connections, the schema check, prepared statements
        spent: dict[str, list[tuple[float, float]]] = {v: [] for v in names}
        for r in range(rounds):
            for v in rotated(names, r):
                spent[v].append(_round(tasks_of[v], tasks))
    base = [cpu for cpu, _ in spent["plain_write"]]
    return {
        v: {
            "cpu_us": statistics.median(f[0] for f in figures),
            "wall_us": statistics.median(f[1] for f in figures),
            "cpu_over_unfenced": statistics.median(ratios([cpu for cpu, _ in figures], base)),
        }
        for v, figures in spent.items()
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run_cpu")
    parser.add_argument("--store", default="postgresql", choices=("postgresql", "sqlite"))
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    figures = measure(args.store, args.tasks, args.rounds)
    print(f"{args.store}: client µs per task in this process, median of {args.rounds} rounds of {args.tasks}")
    for v, f in figures.items():
        over = f["cpu_over_unfenced"]
        print(f"  {v:18s} CPU {f['cpu_us']:6.0f}  wall {f['wall_us']:6.0f}  CPU / unfenced {over:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
