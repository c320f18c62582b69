"""The Celery app the benchmarks run in real ``celery worker`` processes, configured by env.

Every variant runs the same body (:func:`work`) with the same broker, worker and settings: Redis broker,
prefork, ``task_acks_late``, ``worker_prefetch_multiplier`` 4 (Celery's default) and no result backend
(``task_ignore_result``): a fenced run keeps its result in its lease store, the hand-written fence in its
table, fencekit in its row or key. Env:

- ``FENCE_BENCH_BROKER``: broker URL (default ``FENCE_BENCH_REDIS``'s, Redis db 11);
- ``FENCE_BENCH_STORE``, ``FENCE_BENCH_TTL``: the ``FencedTask`` lease store and ttl (30 s);
- ``FENCE_BENCH_PG_DSN``: psycopg DSN of the run's schema (hand-written fence, fencekit's row);
- ``FENCE_BENCH_ROWS_URL``: SQLAlchemy URL of the database holding ``fence_bench_tx``, where the variants
  that write one row write it outside the fence (the lease store's own database when it is SQL);
- ``FENCE_BENCH_PEER_REDIS``: the peers' Redis;
- ``FENCE_BENCH_COUNT_DIR``: count store round trips per process (:mod:`benchmarks.instrument`);
- ``FENCE_BENCH_PROFILE``: profile every worker process by CPU time (:mod:`benchmarks.profiling`);
- ``FENCE_BENCH_READY``: a file written when the worker is ready.
"""

from __future__ import annotations

import os
import time
from functools import cache
from pathlib import Path
from typing import Any

from celery import Celery
from celery.exceptions import Ignore
from celery.signals import worker_ready
from celery_once import QueueOnce
from sqlalchemy import Engine, create_engine, text

from celery_fence import FencedTask

from . import handwritten, peers
from .services import REDIS_URL

env = os.environ.get
# the producer (the benchmark process) sets no FENCE_BENCH_BROKER: it publishes where FENCE_BENCH_REDIS says
app = Celery("bench", broker=env("FENCE_BENCH_BROKER", REDIS_URL))
app.conf.update(
    fence_store_url=env("FENCE_BENCH_STORE", "memory://"),
    fence_lease_ttl=float(env("FENCE_BENCH_TTL", "30")),
    task_acks_late=True,
    task_reject_on_worker_lost=env("FENCE_BENCH_REJECT_ON_LOST", "1") == "1",
    task_ignore_result=True,
    worker_prefetch_multiplier=int(env("FENCE_BENCH_PREFETCH", "4")),
    broker_connection_retry_on_startup=True,
    ONCE=peers.ONCE_CONFIG,
)
if env("FENCE_BENCH_COUNT_DIR"):
    from . import instrument

    instrument.install(Path(env("FENCE_BENCH_COUNT_DIR", "")))
if env("FENCE_BENCH_PROFILE"):
    from . import profiling

    profiling.install(Path(env("FENCE_BENCH_PROFILE", "")))


@worker_ready.connect
def _ready(**_: Any) -> None:
    ready = env("FENCE_BENCH_READY")
    if ready:
        Path(ready).write_text(str(os.getpid()))


def work(i: int) -> dict[str, Any]:
    """The task body of every variant: tiny, far shorter than any renew interval."""
    return {"i": i}


@app.task(name="bench.plain")
def plain(i: int, tag: str) -> Any:
    return work(i)


@app.task(name="bench.handwritten", bind=True)
def handwritten_fence(self: Any, i: int, tag: str) -> Any:
    try:
        return handwritten.fenced(self.request.id, self.request.id, lambda: work(i))
    except handwritten.Refused as exc:
        raise Ignore() from exc


@app.task(name="bench.handwritten_autocommit", bind=True)
def handwritten_autocommit(self: Any, i: int, tag: str) -> Any:
    try:
        return handwritten.fenced(self.request.id, self.request.id, lambda: work(i), autocommit=True)
    except handwritten.Refused as exc:
        raise Ignore() from exc


@app.task(name="bench.fenced", base=FencedTask, bind=True)
def fenced(self: Any, i: int, tag: str) -> Any:
    return work(i)


ROWS_DDL = "CREATE TABLE IF NOT EXISTS fence_bench_tx (key VARCHAR(200) PRIMARY KEY, i INTEGER NOT NULL)"
INSERT_ROW = text("INSERT INTO fence_bench_tx (key, i) VALUES (:key, :i)")


@cache
def _rows_engine(pid: int) -> Engine:
    """This process's engine on ``FENCE_BENCH_ROWS_URL`` (a forked child makes its own: keyed by pid)."""
    return create_engine(os.environ["FENCE_BENCH_ROWS_URL"])


def write_row(key: str, i: int) -> None:
    """The one row an unfenced body writes: its own transaction, ``engine.begin()``, as a user would."""
    with _rows_engine(os.getpid()).begin() as conn:
        conn.execute(INSERT_ROW, {"key": key, "i": i})


@app.task(name="bench.plain_write", bind=True)
def plain_write(self: Any, i: int, tag: str) -> Any:
    """A plain Celery task writing one row (the unfenced task the fence's cost is measured against)."""
    write_row(self.request.id, i)
    return work(i)


@app.task(name="bench.fenced_write", base=FencedTask, bind=True)
def fenced_write(self: Any, i: int, tag: str) -> Any:
    """FencedTask (lease mode) writing the same row in its own transaction, outside the fence: the row is
    not fenced, and on SQLite it holds the write lock for its own statement only."""
    write_row(self.request.id, i)
    return work(i)


@app.task(name="bench.fenced_tx", base=FencedTask, bind=True)
def fenced_tx(self: Any, i: int, tag: str) -> Any:
    """FencedTask writing one row in the run's transaction (:mod:`benchmarks.transactions`): the table is in
    the lease store's database, and the row commits with the completion."""
    with self.fence.transaction() as conn:
        conn.execute(INSERT_ROW, {"key": self.request.id, "i": i})
    return work(i)


def fenced_commit(self: Any, i: int, tag: str) -> Any:
    """FencedTask in commit mode (docs/commit-mode.md) writing the same row in ``self.fence.transaction()``:
    no lease; the row commits with the claim of the key."""
    with self.fence.transaction() as conn:
        conn.execute(INSERT_ROW, {"key": self.request.id, "i": i})
    return work(i)


# A worker refuses to start with a commit-mode task on a Redis or etcd store: registered only on a SQL store,
# and in the producer (memory://, never a worker), which sends it by name
if not app.conf.fence_store_url.startswith(("redis", "etcd")):
    app.task(name="bench.fenced_commit", base=FencedTask, bind=True, fence_mode="commit")(fenced_commit)


@app.task(name="bench.handwritten_write", bind=True)
def handwritten_write(self: Any, i: int, tag: str) -> Any:
    """The hand-written fence around the same row (:func:`benchmarks.handwritten.fenced_write`): the row and
    the completion in one transaction, on PostgreSQL (``FENCE_BENCH_PG_DSN``)."""
    try:
        return handwritten.fenced_write(self.request.id, self.request.id, i, lambda: work(i))
    except handwritten.Refused as exc:
        raise Ignore() from exc


@app.task(name="bench.celery_once", base=QueueOnce, once={"graceful": True})
def celery_once(i: int, tag: str) -> Any:
    return work(i)


@app.task(name="bench.fencekit_celery", bind=True)
@peers.fencekit_decorator()
def fencekit_celery(self: Any, i: int, tag: str) -> Any:
    return work(i)


@app.task(name="bench.fencekit_pg")
def fencekit_pg(i: int, tag: str) -> Any:
    resource = f"{tag}:{i}"
    return peers.with_lock(resource, lambda: work(i), peers.write_postgres(resource))


@app.task(name="bench.fencekit_redis")
def fencekit_redis(i: int, tag: str) -> Any:
    resource = f"{tag}:{i}"
    return peers.with_lock(resource, lambda: work(i), peers.write_redis(resource))


@app.task(name="bench.sleeper", base=FencedTask, bind=True)
def sleeper(self: Any, seconds: float) -> str:
    """A long fenced run, for the takeover benchmark (its child is killed mid-run)."""
    time.sleep(seconds)
    return "slept"
