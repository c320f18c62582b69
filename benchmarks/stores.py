"""One lease store per kind, set up for a benchmark and cleaned afterwards: PostgreSQL in the run's schema,
SQLite in a temp file, Redis on db 11 under a ``fence_bench:<hex>:`` prefix, etcd on a private server."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery_fence import open_store

from .services import REDIS_URL, EtcdServer, PgSchema, RedisServer, drop_redis_keys, pg_schema
from .workers import retrying

STORES = ("postgresql", "sqlite", "redis", "etcd")


@dataclass(frozen=True)
class LeaseStore:
    url: str
    server_pid: int | None = None  # a private server's process, whose CPU is this store's alone
    redis_url: str | None = None  # the private redis-server's plain URL (the peers use it too)


@contextlib.contextmanager
def lease_store(
    kind: str, schema: PgSchema | None = None, private_redis: bool = False
) -> Iterator[LeaseStore]:
    """A fresh, migrated store of ``kind`` (PostgreSQL uses ``schema``, or one of its own; Redis db 11 under
    a prefix of its own, or a private redis-server)."""
    if kind == "postgresql":
        with contextlib.ExitStack() as stack:
            schema = schema or stack.enter_context(pg_schema("store"))
            yield LeaseStore(_migrated(schema.url))
    elif kind == "sqlite":
        directory = Path(tempfile.mkdtemp(prefix="fence-bench-sqlite-"))
        try:
            yield LeaseStore(_migrated(f"sqlite:///{directory}/fence.db"))
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    elif kind == "redis" and private_redis:
        with RedisServer() as server:
            assert isinstance(server, RedisServer) and server.process is not None
            yield LeaseStore(server.url(), server.process.pid, server.url())
    elif kind == "redis":
        prefix = f"fence_bench:{uuid.uuid4().hex[:8]}:"
        try:
            yield LeaseStore(f"{REDIS_URL}?prefix={prefix}")
        finally:
            drop_redis_keys(f"{prefix}*")
    elif kind == "etcd":
        with EtcdServer() as server:
            assert isinstance(server, EtcdServer) and server.process is not None
            yield LeaseStore(server.url(), server.process.pid)
    else:
        raise ValueError(f"unknown store {kind!r}")


def _migrated(url: str) -> str:
    store = open_store(url)
    try:
        retrying(store.migrate)
    finally:
        store.close()
    return url


@contextlib.contextmanager
def opened(url: str) -> Iterator[Any]:
    """The store at ``url``, closed afterwards (an etcd store's leases run out by their ttl, on a private
    server stopped with its ``lease_store``)."""
    store = open_store(url)
    try:
        yield store
    finally:
        store.close()
