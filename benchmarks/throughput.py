"""Throughput: plain Celery task vs the hand-written fence vs ``FencedTask`` vs the peers, side by side.

One worker per lease store (``celery worker -P prefork -c 2``, Redis broker on db 11, acks_late, prefetch 4,
no result backend), alive for all the rounds of its store, runs every variant of that store's group. In each
round every variant gets a batch in turn (the order rotates from round to round):

1. the batch of N messages is published to a staging queue nobody consumes (the send time per message is
   recorded apart: celery-once takes its lock there, in the producer);
2. the staging list is renamed to the queue the worker is blocked on (one atomic ``RENAME``): the clock
   starts;
3. the clock stops when the broker holds no message of the batch, queued or unacked: with acks_late a
   message is acked only after its task returned, so this is the completion of the last task.

tasks/s = N / elapsed. Ratios are taken per round (both variants measured in the same round), then the
median and min-max over rounds. Effects are checked on a sample of each batch afterwards (not timed).
CPU time per task is recorded too (:mod:`benchmarks.cpu`: the worker, the PostgreSQL backends serving it,
the private Redis or etcd server): unlike tasks/s it hardly moves when other processes load the machine.

In the Redis group the Redis lease store and the peers' Redis are one private redis-server (the broker stays
on the shared one), so they compete on equal terms and the server's CPU is theirs alone.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
from sqlalchemy import bindparam, create_engine, text

from . import handwritten, peers
from .cpu import CpuMeter
from .services import REDIS_URL, PgSchema, drop_redis_keys, pg_schema, redis_client
from .stats import ratios, rotated, summary
from .stores import LeaseStore, lease_store, opened
from .workers import Worker, retrying, wait_for

GROUPS = {
    "postgresql": ["plain", "handwritten", "handwritten_autocommit", "fenced", "fencekit_pg"],
    "redis": ["plain", "handwritten", "fenced", "fencekit_redis", "fencekit_celery", "celery_once"],
    "sqlite": ["plain", "handwritten", "fenced"],
    "etcd": ["plain", "handwritten", "fenced"],
}
SCALE = {"etcd": 0.5}  # FencedTask on etcd runs ~200 tasks/s: half-size batches keep the run short
STAGE, LIVE = "fence_bench.stage", "fence_bench.live"
SAMPLE = 20


def run(rounds: int, tasks: int, stores: list[str], log: Any) -> dict[str, Any]:
    from .bench_app import app

    out: dict[str, Any] = {
        "settings": {"rounds": rounds, "tasks_per_batch": tasks, "warmup": max(50, tasks // 10)}
    }
    with pg_schema("tp") as schema:
        _create_user_tables(schema)
        for kind in stores:
            with (
                lease_store(kind, schema, private_redis=True) as store,
                bench_worker(app, kind, store, schema) as w,
            ):
                n = int(tasks * SCALE.get(kind, 1.0))
                out[kind] = {"tasks_per_batch": n, **_group(app, w, kind, store, schema, rounds, n, log)}
    drop_redis_keys(f"{peers.FENCEKIT_PREFIX}*", "qo_bench.*", STAGE, LIVE, f"_kombu.binding.{STAGE}")
    return out


def _create_user_tables(schema: PgSchema) -> None:
    from .bench_app import ROWS_DDL

    engine = create_engine(schema.url)
    with engine.begin() as conn:
        conn.exec_driver_sql(handwritten.DDL)
        conn.exec_driver_sql(peers.JOBS_DDL)
        conn.exec_driver_sql(ROWS_DDL)  # the row the *_write variants write (PostgreSQL)
    engine.dispose()


@contextlib.contextmanager
def bench_worker(
    app: Any, kind: str, store: LeaseStore, schema: PgSchema, queue: str = LIVE, concurrency: int = 2
) -> Iterator[Worker]:
    """A worker ``-c concurrency`` of the bench app on ``queue``, its fenced tasks on ``store``; the tasks
    that write a row write it in the store's database, or in ``schema`` when the store is not SQL."""
    peer_redis = store.redis_url or peers.PEER_REDIS
    env = {
        "FENCE_BENCH_STORE": store.url,
        "FENCE_BENCH_PG_DSN": schema.dsn,
        "FENCE_BENCH_ROWS_URL": rows_url(store, schema),
        "FENCE_BENCH_BROKER": REDIS_URL,
        "FENCE_BENCH_PEER_REDIS": peer_redis,
    }
    _point_celery_once(app, peer_redis)  # the producer side takes celery-once's lock on the same Redis
    with redis_client() as client:
        client.delete(queue, STAGE, "unacked", "unacked_index")
    with Worker(f"tp-{kind}", env, queue, concurrency) as worker:
        yield worker


def rows_url(store: LeaseStore, schema: PgSchema) -> str:
    """Where the variants that write a row write it: the lease store's database when it is SQL, else the
    run's PostgreSQL schema."""
    return store.url if store.url.startswith(("sqlite", "postgresql")) else schema.url


def _point_celery_once(app: Any, url: str) -> None:
    import celery_once.backends.redis as once_redis

    app.conf.ONCE = {**peers.ONCE_CONFIG, "settings": {**peers.ONCE_CONFIG["settings"], "url": url}}
    once_redis.redis = None  # celery-once caches one client per process: make it again for this URL


def _group(
    app: Any, worker: Worker, kind: str, lease: LeaseStore, schema: PgSchema, rounds: int, n: int, log: Any
) -> dict[str, Any]:
    variants = GROUPS[kind]
    rates: dict[str, list[float]] = {v: [] for v in variants}
    sends: dict[str, list[float]] = {v: [] for v in variants}
    cpus: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    checked: dict[str, list[int]] = {v: [0, 0] for v in variants}
    meter = CpuMeter(worker, lease.server_pid)
    with opened(lease.url) as store:
        ctx = {"store": store, "schema": schema, "peer_redis": lease.redis_url or peers.PEER_REDIS}
        for variant in variants:  # warm-up: connections, prepared statements, scripts (not recorded)
            batch(app, meter, ctx, variant, max(50, n // 10))
        for r in range(rounds):
            order = rotated(variants, r)
            for variant in order:
                one = functools.partial(batch, app, meter, ctx, variant, n)
                rate, send_us, cpu, ok, sampled = undisturbed(worker, log, one)
                rates[variant].append(rate)
                sends[variant].append(send_us)
                cpus[variant].append(cpu)
                checked[variant][0] += ok
                checked[variant][1] += sampled
            line = ", ".join(f"{v} {rates[v][-1]:.0f}" for v in variants)
            log(f"  {kind} round {r + 1}/{rounds}: tasks/s {line}")
    errors = worker.errors()
    if errors:
        log(f"  worker {kind} logged errors:\n{errors}")
    return {
        "variants": variants,
        "tasks_per_s": {v: summary(rates[v], 1) for v in variants},
        "ratio_to_plain": {v: summary(ratios(rates[v], rates["plain"])) for v in variants},
        "fenced_over": {v: summary(ratios(rates["fenced"], rates[v])) for v in variants if v != "fenced"},
        "cpu_us_per_task": {v: cpu_summary(cpus[v]) for v in variants},
        "send_us_per_task": {v: summary(sends[v], 1) for v in variants},
        "effects_checked": {v: f"{c[0]}/{c[1]}" for v, c in checked.items()},
        "worker_errors": errors[-2000:],
    }


def undisturbed(worker: Worker, log: Any, one_batch: Any, attempts: int = 3) -> Any:
    """Run ``one_batch``; again (up to ``attempts``) while the worker logged a lost connection meanwhile."""
    for attempt in range(attempts):
        before = worker.disturbances()
        result = one_batch()
        if worker.disturbances() == before:
            return result
        log(f"  (a connection was lost during the batch: run again, attempt {attempt + 2})")
    return result


def cpu_summary(readings: list[dict[str, float]]) -> dict[str, Any]:
    return {part: summary([r[part] for r in readings], 1)["median"] for part in readings[0]}


def batch(app: Any, meter: CpuMeter, ctx: dict[str, Any], variant: str, n: int) -> tuple[Any, ...]:
    """Publish, release (into ``ctx["live"]``, default the queue of :func:`bench_worker`) and drain one
    batch: (tasks/s, send µs/task, CPU µs/task, effects ok, sampled)."""
    task, tag, live = app.tasks[f"bench.{variant}"], uuid.uuid4().hex[:10], ctx.get("live", LIVE)
    if variant == "fencekit_pg":  # fencekit's fenced_update writes an existing job row, as in its README
        _insert_jobs(ctx["schema"], tag, n)
    with redis_client() as client:
        client.delete(STAGE)
        ids, started = [], time.perf_counter()
        with app.producer_or_acquire() as producer:
            for i in range(n):
                ids.append(task.apply_async((i, tag), queue=STAGE, producer=producer).id)
        send_us = (time.perf_counter() - started) / n * 1e6
        wait_for(lambda: client.llen(STAGE) == n, 30, "the staged batch")
        cpu_before = meter.read()
        started = time.perf_counter()
        client.rename(STAGE, live)
        wait_for(lambda: _drained(client, live), 600, f"{variant} batch drained", poll=0.002)
        elapsed = time.perf_counter() - started
        cpu = meter.per_task(cpu_before, meter.read(), n)
    ok, sampled = retrying(lambda: _check(ctx, variant, tag, ids))
    return n / elapsed, send_us, cpu, ok, sampled


def _drained(client: Any, live: str) -> bool:
    pipe = client.pipeline(transaction=False)
    pipe.llen(live)
    pipe.hlen("unacked")
    queued, unacked = pipe.execute()
    return bool(queued == 0 and unacked == 0)


def _insert_jobs(schema: PgSchema, tag: str, n: int) -> None:
    with psycopg.connect(schema.dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO fence_bench_fk_jobs (key) SELECT %s || ':' || g FROM generate_series(0, %s) g",
            (tag, n - 1),
        )


def _check(ctx: dict[str, Any], variant: str, tag: str, ids: list[str]) -> tuple[int, int]:
    """How many of a random sample of the batch left their effect (plain and celery-once have none)."""
    picks = random.sample(range(len(ids)), min(SAMPLE, len(ids)))
    if variant in ("plain", "celery_once"):
        return 0, 0
    if variant == "plain_write":
        return _check_rows(ctx["rows"], [ids[i] for i in picks]), len(picks)
    if variant.startswith("fenced"):
        states = [ctx["store"].get(ids[i]) for i in picks]
        return sum(1 for s in states if s is not None and s.done), len(picks)
    if variant in ("fencekit_redis", "fencekit_celery"):
        return _check_fencekit(ctx["peer_redis"], variant, tag, picks), len(picks)
    with psycopg.connect(ctx["schema"].dsn, autocommit=True) as conn:
        if variant == "fencekit_pg":
            keys = [f"{tag}:{i}" for i in picks]
            sql = "SELECT count(*) FROM fence_bench_fk_jobs WHERE key = ANY(%s) AND status = 'done'"
        else:
            keys = [ids[i] for i in picks]
            sql = "SELECT count(*) FROM fence_bench_handwritten WHERE key = ANY(%s) AND done"
        row = conn.execute(sql, (keys,)).fetchone()
    return (int(row[0]) if row else 0), len(picks)


def _check_rows(engine: Any, keys: list[str]) -> int:
    """How many of ``keys`` have their row in ``fence_bench_tx`` (``engine``: the rows' database)."""
    query = text("SELECT count(*) FROM fence_bench_tx WHERE key IN :keys")
    query = query.bindparams(bindparam("keys", expanding=True))
    with engine.connect() as conn:
        return int(conn.execute(query, {"keys": keys}).scalar() or 0)


def _check_fencekit(url: str, variant: str, tag: str, picks: list[int]) -> int:
    from fencekit import IdempotencyGuard, idempotency_key

    with redis_client(url) as client:
        if variant == "fencekit_redis":
            names = [f"{peers.FENCEKIT_PREFIX}:result:{tag}:{i}" for i in picks]
            return sum(1 for v in client.mget(names) if v)
        guard = IdempotencyGuard(client, prefix=peers.FENCEKIT_PREFIX)
        keys = [idempotency_key({"i": i, "tag": tag}, namespace="bench") for i in picks]
        return sum(1 for key in keys if guard.status(key) == "done")
