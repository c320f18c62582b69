"""What the fence costs per task, on each store and in each mode: store round trips and worker + store CPU
µs, beside an unfenced task making the same write (issue 30.3).

Every variant is a task of :mod:`benchmarks.bench_app` that writes one row of ``fence_bench_tx``; the row
lives in the lease store's database when the store is SQL (the SQLite file, the PostgreSQL schema), else in
the run's PostgreSQL schema (a Redis or etcd lease store beside an application database). The baseline is
``plain_write``: a plain Celery task writing the row in its own ``engine.begin()``. :data:`VARIANTS` lists
the rest, one line each, with the stores they run on.

For each store, two workers one after the other (``-c 2``, the bench app's settings):

1. **Round trips** (:mod:`benchmarks.roundtrips`' method): a worker counting every round trip at the driver
   boundary (:mod:`benchmarks.instrument`), to the lease store and to the row's database, runs a warm-up
   batch of every variant, then N tasks of each in turn; count / N. On SQLite these are statements, not
   network round trips (``BEGIN``, ``COMMIT`` included).
2. **CPU and tasks/s** (:mod:`benchmarks.throughput`'s method, with no counting): a worker runs every
   variant in alternating rounds; per batch, CPU µs per task from ``/proc`` (:mod:`benchmarks.cpu`): the
   worker (main process and pool children), the PostgreSQL backends serving its connections, the private
   Redis or etcd server. The fence's CPU is a variant's total less the unfenced task's, in the same round.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import create_engine, text

from . import roundtrips
from .curve import Cell, _rounds
from .network import DelayedPostgres, delayed_postgres
from .services import PgSchema, drop_redis_keys, pg_schema
from .stats import ratios, summary
from .stores import STORES, LeaseStore, lease_store, opened
from .throughput import LIVE, STAGE, _create_user_tables, bench_worker, rows_url

SQL = ("sqlite", "postgresql")
PG = ("postgresql",)
HANDWRITTEN = "handwritten_write"  # the fair hand-written fence: it makes the same write (PostgreSQL only)


@dataclass(frozen=True)
class Variant:
    task: str  # bench_app's task, without "bench."
    label: str
    stores: tuple[str, ...]


BASELINE = Variant("plain_write", "unfenced task, the row in engine.begin()", STORES)
VARIANTS = (  # a new mode is one more line here
    BASELINE,
    Variant("fenced_write", "FencedTask (lease mode), the row in its own engine.begin()", STORES),
    Variant("fenced_tx", "FencedTask (lease mode), the row in self.fence.transaction()", SQL),
    Variant("fenced_commit", "FencedTask (commit mode), the row in self.fence.transaction()", SQL),
    Variant(HANDWRITTEN, "hand-written fence (psycopg), the row and the completion in one transaction", PG),
)
SCALE = {"etcd": 0.5}  # FencedTask on etcd is the slowest: half-size batches keep the run short


def variants_on(kind: str) -> list[Variant]:
    return [v for v in VARIANTS if kind in v.stores]


def run(
    rounds: int, tasks: int, rt_tasks: int, log: Any, stores: tuple[str, ...] = STORES, rtt_ms: float = 0.0
) -> dict[str, Any]:
    """``rtt_ms``: the workers reach PostgreSQL (the store, the row's database, the hand-written fence's)
    through a proxy adding that much to each round trip (:mod:`benchmarks.network`); PostgreSQL only."""
    from .bench_app import app

    stores = ("postgresql",) if rtt_ms else stores
    out: dict[str, Any] = {
        "settings": {
            "rounds": rounds,
            "tasks_per_batch": tasks,
            "round_trip_tasks": rt_tasks,
            "concurrency": 2,
            "labels": {v.task: v.label for v in VARIANTS},
            "store_rtt_ms": rtt_ms,
        }
    }
    try:
        near = contextlib.nullcontext()
        with pg_schema("cost") as schema, (delayed_postgres(rtt_ms) if rtt_ms else near) as network:
            _create_user_tables(schema)  # the hand-written fence's table
            for kind in stores:
                with lease_store(kind, schema, private_redis=True) as lease:
                    out[kind] = _one_store(app, kind, lease, schema, rounds, tasks, rt_tasks, log, network)
    finally:
        drop_redis_keys(STAGE, LIVE, f"_kombu.binding.{STAGE}")
    return out


def _one_store(
    app: Any, kind: str, lease: LeaseStore, schema: PgSchema, rounds: int, tasks: int, rt_tasks: int,
    log: Any, network: DelayedPostgres | None = None,
) -> dict[str, Any]:
    from .bench_app import ROWS_DDL

    names = [v.task for v in variants_on(kind)]
    rows = create_engine(rows_url(lease, schema))  # the benchmark's own connections go direct
    # what the workers are pointed at: through the proxy, when there is one
    far_lease, far_schema = (lease, schema)
    if network is not None:
        far_lease, far_schema = network.lease(lease), network.schema(schema)
    try:
        with rows.begin() as conn:
            conn.execute(text(ROWS_DDL))
        env = {"FENCE_BENCH_PG_DSN": far_schema.dsn, "FENCE_BENCH_ROWS_URL": rows_url(far_lease, far_schema)}
        counted = roundtrips.count_variants(app, kind, far_lease.url, env, names, rt_tasks, 40)
        log(
            f"  {kind} round trips per task: " + ", ".join(f"{v} {r['per_task']}" for v, r in counted.items())
        )
        with bench_worker(app, f"cost-{kind}", far_lease, far_schema) as worker, opened(lease.url) as store:
            ctx = {"store": store, "schema": schema, "rows": rows, "server_pid": lease.server_pid}
            if network is not None:
                ctx["proxy_pid"] = network.pid
            cells = {v: Cell(f"{kind}/{v}", v, worker, ctx) for v in names}
            _rounds(app, list(cells.values()), rounds, int(tasks * SCALE.get(kind, 1.0)), log)
            figures = _figures(counted, cells)
    finally:
        rows.dispose()
    return figures


def _figures(counted: dict[str, dict[str, Any]], cells: dict[str, Cell]) -> dict[str, Any]:
    base = cells[BASELINE.task]
    out: dict[str, Any] = {"variants": list(cells)}
    for v, cell in cells.items():
        rt = counted[v]
        out[v] = {
            "round_trips_per_task": rt["per_task"],
            "round_trips_by_kind": rt["by_kind_per_task"],
            "server_side_per_task": rt["server_side_per_task"],
            "fence_round_trips": round(rt["per_task"] - counted[base.variant]["per_task"], 3),
            **cell.figures(),
            "over_unfenced": summary(ratios(cell.rates, base.rates)),
            **_over_handwritten(cell, cells),
            "fence_cpu_us_per_task": summary(
                [c["total"] - b["total"] for c, b in zip(cell.cpus, base.cpus, strict=True)], 1
            ),
        }
    return out


def _over_handwritten(cell: Cell, cells: dict[str, Cell]) -> dict[str, Any]:
    """tasks/s over the hand-written fence making the same write, per round (where it ran: PostgreSQL)."""
    hand = cells.get(HANDWRITTEN)
    if hand is None or cell is hand:
        return {}
    return {"over_handwritten": summary(ratios(cell.rates, hand.rates))}
