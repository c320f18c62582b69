"""Store round trips per short task (far shorter than the renew interval), counted in a real worker.

A prefork worker (``-c 2``) loads :mod:`benchmarks.instrument`, which counts every round trip its processes
make to the lease store at the driver boundary (psycopg executes and real commits, SQLite statements,
Redis commands written to the store's socket, HTTP requests to etcd). After a warm-up batch (connections,
schema check, script loads: reported apart as the per-process setup), N ``FencedTask`` runs are sent; the
count over those N runs, divided by N, is the figure. Where the server can count too, it does: the Redis
store runs on a private redis-server (``INFO commandstats``: script calls and connection commands, since
the commands a script runs are counted there too), etcd on a private etcd (gRPC calls started).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .services import REDIS_URL, etcd_metric, pg_schema, redis_client, redis_requests
from .stores import STORES, lease_store
from .workers import Worker, wait_for

QUEUE = "fence_bench.rt"


def _read_counts(directory: Path) -> tuple[int, int, dict[str, int]]:
    tasks, total, by_kind = 0, 0, {}
    for path in directory.glob("*.json"):
        data = json.loads(path.read_text())
        tasks, total = tasks + data["tasks"], total + data["total"]
        for kind, n in data["by_kind"].items():
            by_kind[kind] = by_kind.get(kind, 0) + n
    return tasks, total, by_kind


def _server_count(kind: str, url: str) -> float | None:
    if kind == "redis":
        return float(redis_requests(url))
    if kind == "etcd":
        return etcd_metric(url, "grpc_server_started_total")
    return None


def _send(app: Any, n: int, variant: str, worker: Worker) -> None:
    task = app.tasks[f"bench.{variant}"]
    with app.producer_or_acquire() as producer:
        for i in range(n):
            task.apply_async((i, "rt"), queue=QUEUE, producer=producer)
    with redis_client() as client:
        try:
            wait_for(lambda: _in_flight(client) == (0, 0), 120, "round-trip batch")
        except AssertionError as exc:  # say what was left, and what the worker said, for the next diagnosis
            queued, unacked = _in_flight(client)
            others = client.hlen("unacked") - unacked
            raise AssertionError(
                f"{exc}: {variant}, {queued} queued, {unacked} unacked ({others} unacked of other queues); "
                f"worker errors: {worker.errors()[-2000:] or 'none'}"
            ) from exc


def _in_flight(client: Any) -> tuple[int, int]:
    """This benchmark's messages queued, and delivered but not acknowledged. kombu's ``unacked`` hash on the
    broker's db is shared by every consumer of that db (a test run's workers too): only the entries routed
    to this queue count."""
    unacked = sum(json.loads(entry)[-1] == QUEUE for entry in client.hvals("unacked"))
    return client.llen(QUEUE), unacked


def count_variants(
    app: Any, kind: str, url: str, env: dict[str, str], variants: Sequence[str], tasks: int, warmup: int
) -> dict[str, dict[str, Any]]:
    """Round trips per task of each of ``variants`` (bench app task names), one after the other in one
    counting worker on the lease store at ``url`` (``env``: the worker's other settings)."""
    out: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="fence-bench-rt-") as tmp:
        env = {**env, "FENCE_BENCH_STORE": url, "FENCE_BENCH_COUNT_DIR": tmp, "FENCE_BENCH_BROKER": REDIS_URL}
        with Worker(f"rt-{kind}", env, QUEUE) as worker:
            for variant in variants:  # connections, schema check, script loads: the per-process setup
                _send(app, warmup, variant, worker)
            wait_for(lambda: _read_counts(Path(tmp))[0] >= warmup * len(variants), 30, "warm-up counts")
            warm = _read_counts(Path(tmp))
            for variant in variants:
                out[variant] = _one_variant(app, worker, kind, url, Path(tmp), variant, tasks)
                out[variant] |= {"warmup_tasks": warm[0], "warmup_round_trips": warm[1]}
            errors = worker.errors()
    for result in out.values():
        result["worker_errors"] = errors[-1000:]
    return out


def _one_variant(
    app: Any, worker: Worker, kind: str, url: str, counts: Path, variant: str, tasks: int
) -> dict[str, Any]:
    for _ in range(3):  # again if a connection was killed from outside meanwhile (shared machine)
        disturbed = worker.disturbances()
        warm_tasks, warm_total, warm_kinds = _read_counts(counts)
        server_before = _server_count(kind, url)
        _send(app, tasks, variant, worker)
        wait_for(lambda: _read_counts(counts)[0] >= warm_tasks + tasks, 30, "counts")  # noqa: B023
        done, total, kinds = _read_counts(counts)
        server_after = _server_count(kind, url)
        if worker.disturbances() == disturbed:
            break
    n = done - warm_tasks
    per_kind = {
        k: round((v - warm_kinds.get(k, 0)) / n, 3) for k, v in kinds.items() if v - warm_kinds.get(k, 0)
    }
    server = None
    if server_before is not None and server_after is not None:
        server = round((server_after - server_before) / n, 3)
    return {
        "tasks": n,
        "per_task": round((total - warm_total) / n, 3),
        "by_kind_per_task": per_kind,
        "server_side_per_task": server,
    }


def _one_store(app: Any, kind: str, url: str, schema_dsn: str, tasks: int, warmup: int) -> dict[str, Any]:
    env = {"FENCE_BENCH_PG_DSN": schema_dsn}
    return count_variants(app, kind, url, env, ["fenced"], tasks, warmup)["fenced"]


def run(tasks: int, log: Any, stores: tuple[str, ...] = STORES) -> dict[str, Any]:
    from .bench_app import app

    out: dict[str, Any] = {"settings": {"tasks": tasks, "warmup": 40, "ttl": 30.0, "renew_interval": 10.0}}
    with pg_schema("rt") as schema:
        for kind in stores:
            with contextlib.ExitStack() as stack:
                url = stack.enter_context(lease_store(kind, schema, private_redis=True)).url
                out[kind] = _one_store(app, kind, url, schema.dsn, tasks, 40)
            log(f"  {kind}: {out[kind]['per_task']} round trips per task {out[kind]['by_kind_per_task']}")
    return out
