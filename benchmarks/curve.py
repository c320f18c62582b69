"""The cost curve (issue 16.5): FencedTask on one PostgreSQL lease store with 1, 2, 4 and 8 worker processes,
and with 100,000 finished keys in the store against an empty one.

Both parts use the bench app, worker settings and batch method of :mod:`benchmarks.throughput` (publish to a
staging queue, ``RENAME`` it to the worker's queue, clock stops when the broker holds no message of the
batch), and CPU per task as :mod:`benchmarks.cpu` measures it: the worker (main process and pool children)
and the PostgreSQL backends serving the worker's connections (the store's CPU).

- **Processes.** One ``celery worker -P prefork -c N`` per N, all four alive at once, each on a queue of its
  own, all on one lease store (one schema). In each round every (N, variant) pair gets a batch in turn, a
  plain Celery task and FencedTask, the order rotating from round to round; fenced/plain is taken per round
  and N. An idle worker waits on its queue (a blocking ``BRPOP``), so it costs next to nothing meanwhile.
- **Store size.** Two schemas: one empty, one filled with 100,000 finished keys (and a history line each) by
  ``INSERT ... SELECT generate_series`` then ``ANALYZE`` (:func:`benchmarks.acquire_scaling.fill`); the empty
  one is left unanalyzed, as a new store is. A Celery app has one lease store, so each schema gets a worker
  of its own with the same settings (``-c 2``); FencedTask batches alternate between the two; full/empty is
  taken per round.

On a machine with fewer cores than processes, the processes take turns on the cores: the curve shows the
cost per task and the contention on the store, not scaling.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any

import psycopg

from .acquire_scaling import fill
from .cpu import CpuMeter
from .services import PgSchema, drop_redis_keys, pg_schema
from .stats import ratios, rotated, summary
from .stores import lease_store, opened
from .throughput import STAGE, batch, bench_worker, cpu_summary, undisturbed
from .workers import Worker, retrying

PROCESSES = (1, 2, 4, 8)
VARIANTS = ("plain", "fenced")
FILLED = 100_000
SIZE_CONCURRENCY = 2
QUEUE = "fence_bench.curve"


@dataclass
class Cell:
    """One measured pair: a variant on a worker; its batches' figures, one per round."""

    name: str
    variant: str
    worker: Worker
    ctx: dict[str, Any]
    rates: list[float] = field(default_factory=list)
    cpus: list[dict[str, float]] = field(default_factory=list)
    checked: list[int] = field(default_factory=lambda: [0, 0])

    def figures(self) -> dict[str, Any]:
        return {
            "tasks_per_s": summary(self.rates, 1),
            "cpu_us_per_task": cpu_summary(self.cpus),
            "effects_checked": f"{self.checked[0]}/{self.checked[1]}",
            "worker_errors": self.worker.errors()[-2000:],
        }


def run(rounds: int, tasks: int, log: Any) -> dict[str, Any]:
    from .bench_app import app

    out: dict[str, Any] = {
        "settings": {
            "rounds": rounds,
            "tasks_per_batch": tasks,
            "warmup": max(50, tasks // 10),
            "processes": list(PROCESSES),
            "filled_keys": FILLED,
            "store_size_concurrency": SIZE_CONCURRENCY,
        }
    }
    try:
        out["processes"] = _processes(app, rounds, tasks, log)
        out["store_size"] = _store_size(app, rounds, tasks, log)
    finally:
        drop_redis_keys(STAGE, f"{QUEUE}.*", f"_kombu.binding.{QUEUE}.*")
    return out


def _processes(app: Any, rounds: int, n: int, log: Any) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        schema = stack.enter_context(pg_schema("curve"))
        lease = stack.enter_context(lease_store("postgresql", schema))
        store = stack.enter_context(opened(lease.url))
        cells = []
        for c in PROCESSES:
            queue = f"{QUEUE}.c{c}"
            worker = stack.enter_context(bench_worker(app, f"curve-c{c}", lease, schema, queue, c))
            ctx = {"store": store, "schema": schema, "live": queue}
            cells += [Cell(f"c{c}/{v}", v, worker, ctx) for v in VARIANTS]
        _rounds(app, cells, rounds, n, log)
        return {str(c): _pair(cells[2 * i], cells[2 * i + 1]) for i, c in enumerate(PROCESSES)}


def _pair(plain: Cell, fenced: Cell) -> dict[str, Any]:
    return {
        "plain": plain.figures(),
        "fenced": fenced.figures(),
        "fenced_over_plain": summary(ratios(fenced.rates, plain.rates)),
        # what the fence adds per task: FencedTask's CPU (worker + store) less plain's, in the same round
        "fence_cpu_us_per_task": summary(
            [f["total"] - p["total"] for f, p in zip(fenced.cpus, plain.cpus, strict=True)], 1
        ),
    }


def _store_size(app: Any, rounds: int, n: int, log: Any) -> dict[str, Any]:
    with contextlib.ExitStack() as stack:
        cells, schemas = [], {}
        for size in ("empty", "full"):
            schemas[size] = schema = stack.enter_context(pg_schema(f"curve_{size}"))
            lease = stack.enter_context(lease_store("postgresql", schema))
            # The empty store is not analyzed: analyzed while empty, its hot statements get sequential-scan
            # plans that the held connections' prepared statements keep until the next ANALYZE (none with
            # autovacuum off): its cost grew with its keys (store CPU per task 825 -> 2,092 µs in 5 rounds)
            if size == "full":
                seconds = retrying(lambda: fill(lease.url, 1, FILLED))  # noqa: B023
                log(f"  {FILLED:,} finished keys filled and analyzed in {seconds:.1f} s")
            store = stack.enter_context(opened(lease.url))
            queue = f"{QUEUE}.{size}"
            worker = stack.enter_context(
                bench_worker(app, f"curve-{size}", lease, schema, queue, SIZE_CONCURRENCY)
            )
            cells.append(Cell(size, "fenced", worker, {"store": store, "schema": schema, "live": queue}))
        _rounds(app, cells, rounds, n, log)
        empty, full = cells
        return {
            "empty": {**empty.figures(), "keys_at_end": _rows(schemas["empty"])},
            "full": {**full.figures(), "keys_at_end": _rows(schemas["full"])},
            "full_over_empty": summary(ratios(full.rates, empty.rates)),
            "store_cpu_full_over_empty": summary(
                ratios([c["postgres"] for c in full.cpus], [c["postgres"] for c in empty.cpus])
            ),
        }


def _rounds(app: Any, cells: list[Cell], rounds: int, n: int, log: Any) -> None:
    """Warm every cell up (connections, prepared statements: not recorded), then ``rounds`` rounds of one
    batch per cell, the order rotating each round (a private store server's CPU counts when the cell's
    ``ctx`` names its ``server_pid``)."""
    meters = {
        id(cell.worker): CpuMeter(cell.worker, cell.ctx.get("server_pid"), cell.ctx.get("proxy_pid"))
        for cell in cells
    }
    for cell in cells:
        batch(app, meters[id(cell.worker)], cell.ctx, cell.variant, max(50, n // 10))
    for r in range(rounds):
        for cell in rotated(cells, r):
            one = functools.partial(batch, app, meters[id(cell.worker)], cell.ctx, cell.variant, n)
            rate, _send_us, cpu, ok, sampled = undisturbed(cell.worker, log, one)
            cell.rates.append(rate)
            cell.cpus.append(cpu)
            cell.checked[0] += ok
            cell.checked[1] += sampled
        line = ", ".join(
            f"{c.name} {c.rates[-1]:.0f}/s {c.cpus[-1]['worker']:.0f}+{c.cpus[-1]['postgres']:.0f} µs"
            for c in cells
        )
        log(f"  round {r + 1}/{rounds}: {line}")


def _rows(schema: PgSchema) -> int:
    with psycopg.connect(schema.dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM fence_leases").fetchone()
    return int(row[0]) if row else 0
