"""Lease stores on private servers that a test may crash and start again (the "store restarted" faults).

Each server is durable the way production needs it to be for tokens never to go back: PostgreSQL with
``fsync``, Redis with ``appendonly yes`` and ``appendfsync always``, etcd as it is (its WAL is synced on every
commit). A Redis without persistence loses its counter on restart; that case is the rewind guard's test.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_fence import open_store

from . import harness_etcd
from .harness_redis import RedisServer
from .pg_server import private_postgres

RESTARTABLE = ("postgresql", "redis", "etcd")


@contextlib.contextmanager
def restartable_store(name: str, request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    """``(store, server)``: ``server.crash()`` kills it, ``server.start()`` brings it back on its port."""
    if name == "postgresql":
        with private_postgres() as server:
            store = open_store(server.url())
            try:
                yield store, server
            finally:
                store.close()
    elif name == "redis":
        directory = Path(tempfile.mkdtemp(prefix="fence-redis-aof-"))
        server = RedisServer(directory, None, "--appendonly", "yes", "--appendfsync", "always").start()
        store = open_store(server.url(prefix="t:"))
        try:
            yield store, server
        finally:
            store.close()
            server.stop()
            shutil.rmtree(directory, ignore_errors=True)
    elif name == "redis_cluster":  # 3 primaries and a replica each: a failover case promotes one
        from .harness_redis_cluster import RedisClusterServers

        servers = RedisClusterServers(replicas=1).start()
        store = open_store(servers.url("t:"))
        try:
            yield store, servers
        finally:
            store.close()
            servers.stop()
    elif name == "etcd":
        opened = harness_etcd.open_etcd_store(request)
        try:
            yield next(opened), harness_etcd.shared_server(request)
        finally:
            opened.close()
    else:
        raise ValueError(f"no restartable server for {name!r}: one of {RESTARTABLE}")
