"""Lease stores on private servers that a test may crash and start again (the "store restarted" faults).

Each server is durable the way production needs it to be for tokens never to go back: PostgreSQL with
``fsync``, Redis with ``appendonly yes`` and ``appendfsync always``, etcd as it is (its WAL is synced on every
commit). A Redis without persistence loses its counter on restart; that case is the rewind guard's test.
``etcd3`` is a 3-member etcd cluster of the test's own (:class:`~.harness_etcd_cluster.EtcdCluster`): its
members are killed, cut off and restarted one at a time.
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
from .harness_etcd_cluster import private_cluster
from .harness_redis import RedisServer
from .pg_pair import postgres_pair
from .pg_server import private_postgres

RESTARTABLE = ("postgresql", "redis", "etcd")
# A primary and a streaming standby (pg_pair): ``server`` is the pair, ``server.failing_over()`` its fault.
STANDBY_PAIRS = {"postgresql-sync-standby": True, "postgresql-async-standby": False}


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
    elif name in STANDBY_PAIRS:
        with postgres_pair(synchronous=STANDBY_PAIRS[name]) as pair:
            store = open_store(pair.url())
            try:
                yield store, pair
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
    elif name == "etcd":
        opened = harness_etcd.open_etcd_store(request)
        try:
            yield next(opened), harness_etcd.shared_server(request)
        finally:
            opened.close()
    elif name == "etcd3":  # a 3-member cluster of its own: the test kills, cuts and restarts members
        with private_cluster(request) as cluster:
            opened = harness_etcd.open_store_at(cluster.url("fence/"))
            try:
                yield next(opened), cluster
            finally:
                opened.close()
    else:
        raise ValueError(f"no restartable server for {name!r}: one of {RESTARTABLE} or etcd3")
