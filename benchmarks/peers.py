"""The peers a user would pick instead of celery-fence, each used the way its README shows.

- celery-once 3.0: ``base=QueueOnce`` with the Redis backend; the lock is taken in ``apply_async`` (the
  producer) and deleted by key in ``after_return``. It dedupes queueing; it fences nothing.
- fencekit 0.6: ``fencekit.celery.idempotent_task`` (idempotency guard + lock + result memo, no fenced write);
  ``DistributedLock`` + ``fenced_update`` on a PostgreSQL row (its Django-QuerySet protocol, implemented
  over psycopg in autocommit as Django runs it); ``DistributedLock`` + ``FenceGate.set_if_fresh`` on Redis.
  Its Redis clients are made at import, as in its README (redis-py re-opens its pool after a fork).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from contextlib import suppress
from datetime import timedelta
from typing import Any

import redis
from fencekit import DistributedLock, FenceGate, IdempotencyGuard, fenced_update, idempotency_key
from fencekit.celery import idempotent_task
from fencekit.errors import LockNotOwned

from .handwritten import connection
from .services import REDIS_URL

PEER_REDIS = os.environ.get("FENCE_BENCH_PEER_REDIS", REDIS_URL)
FENCEKIT_PREFIX = "fence_bench_fk"
ONCE_CONFIG = {
    "backend": "celery_once.backends.Redis",
    "settings": {"url": PEER_REDIS, "default_timeout": 60 * 60},
}
JOBS_DDL = """
CREATE TABLE IF NOT EXISTS fence_bench_fk_jobs (
  key text PRIMARY KEY,
  status text NOT NULL DEFAULT 'queued',
  result text,
  fence_token bigint NOT NULL DEFAULT 0
)"""
LOCK_TTL = timedelta(seconds=30)

_redis = redis.Redis.from_url(PEER_REDIS, decode_responses=True)
guard = IdempotencyGuard(_redis, prefix=FENCEKIT_PREFIX)
lock = DistributedLock(_redis, prefix=FENCEKIT_PREFIX)
gate = FenceGate(_redis, prefix=FENCEKIT_PREFIX)


def fencekit_decorator() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``@idempotent_task(...)`` for a task ``(self, i, tag)``, as in fencekit's README."""
    return idempotent_task(
        guard,
        lock,
        key=lambda i, tag: idempotency_key({"i": i, "tag": tag}, namespace="bench"),
        lock_resource=lambda i, tag: f"bench:{tag}:{i}",
        idempotency_ttl=timedelta(hours=1),
        lock_ttl=LOCK_TTL,
    )


class JobRow:
    """fencekit's ``SupportsFencedUpdate`` (Django ``QuerySet`` shape) over one row of fence_bench_fk_jobs."""

    def __init__(self, key: str, lookups: dict[str, Any] | None = None) -> None:
        self.key, self.lookups = key, lookups or {}

    def filter(self, **lookups: Any) -> JobRow:
        return JobRow(self.key, {**self.lookups, **lookups})

    def update(self, **values: Any) -> int:
        sets = ", ".join(f"{name} = %({name})s" for name in values)
        where = ["key = %(_key)s"]
        params = {**values, "_key": self.key}
        for lookup, value in self.lookups.items():
            field, _, op = lookup.partition("__")
            where.append(f"{field} {'<=' if op == 'lte' else '='} %(_w_{field})s")
            params[f"_w_{field}"] = value
        sql = f"UPDATE fence_bench_fk_jobs SET {sets} WHERE {' AND '.join(where)}"
        return connection(autocommit=True).execute(sql, params).rowcount


def with_lock(resource: str, body: Callable[[], Any], write: Callable[[Any, Any], None]) -> Any:
    """fencekit's lock pattern: acquire (token), run, fenced write, release (as in its README)."""
    handle = lock.acquire(resource, ttl=LOCK_TTL)
    try:
        result = body()
        write(handle.token, result)
        return result
    finally:
        with suppress(LockNotOwned):
            lock.release(handle)


def write_postgres(resource: str) -> Callable[[Any, Any], None]:
    def write(token: Any, result: Any) -> None:
        updates = {"status": "done", "result": json.dumps(result)}
        fenced_update(JobRow(resource), token, updates=updates, raise_on_stale=True)

    return write


def write_redis(resource: str) -> Callable[[Any, Any], None]:
    def write(token: Any, result: Any) -> None:
        gate.set_if_fresh(token, f"{FENCEKIT_PREFIX}:result:{resource}", json.dumps(result))

    return write
