"""Lease stores on private servers that a test may crash and start again (the "store restarted" faults).

Each server is durable the way production needs it to be for tokens never to go back: PostgreSQL with
``fsync``, Redis with ``appendonly yes`` and ``appendfsync always``, etcd as it is (its WAL is synced on every
commit). A Redis without persistence loses its counter on restart; that case is the rewind guard's test.
``etcd3`` is a 3-member etcd cluster of the test's own (:class:`~.etcd_cluster.EtcdCluster`): its
members are killed, cut off and restarted one at a time.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_fence import open_store

from .etcd import open_store_at
from .etcd_cluster import private_cluster
from .pg_pair import postgres_pair
from .postgres import private_postgres
from .redis import RedisServer

RESTARTABLE = ("postgresql", "redis", "etcd")
# A primary and a streaming standby (pg_pair): ``server`` is the pair, ``server.failing_over()`` its fault.
STANDBY_PAIRS = {"postgresql-sync-standby": True, "postgresql-async-standby": False}


@contextlib.contextmanager
def restartable_store(name: str, request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    """``(store, server)``: ``server.crash()`` kills it, ``server.start()`` brings it back on its port."""
    if name in STANDBY_PAIRS:
        opened = _standby_pair(STANDBY_PAIRS[name])
    elif name in _SERVERS:
        opened = _SERVERS[name](request)
    else:
        raise ValueError(f"no restartable server for {name!r}: one of {RESTARTABLE} or etcd3")
    with opened as pair:
        yield pair


@contextlib.contextmanager
def _store_on(server: Any, url: str) -> Iterator[tuple[Any, Any]]:
    store = open_store(url)
    try:
        yield store, server
    finally:
        store.close()


@contextlib.contextmanager
def _postgres(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    with private_postgres() as server, _store_on(server, server.url()) as pair:
        yield pair


@contextlib.contextmanager
def _standby_pair(synchronous: bool) -> Iterator[tuple[Any, Any]]:
    with postgres_pair(synchronous=synchronous) as pair, _store_on(pair, pair.url()) as opened:
        yield opened


@contextlib.contextmanager
def _redis(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    directory = Path(tempfile.mkdtemp(prefix="fence-redis-aof-"))
    server = RedisServer(directory, None, "--appendonly", "yes", "--appendfsync", "always").start()
    store = open_store(server.url(prefix="t:"))
    try:
        yield store, server
    finally:
        store.close()
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def _redis_cluster(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    """3 primaries and a replica each: a failover case promotes one."""
    from .redis_cluster import RedisClusterServers

    servers = RedisClusterServers(replicas=1).start()
    try:
        with _store_on(servers, servers.url("t:")) as pair:
            yield pair
    finally:
        servers.stop()


@contextlib.contextmanager
def _etcd(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    server = request.getfixturevalue("private_etcd")  # the session's, under a prefix of the test's own
    opened = open_store_at(server.url(f"t{uuid.uuid4().hex[:12]}/"))
    try:
        yield next(opened), server
    finally:
        opened.close()


@contextlib.contextmanager
def _etcd3(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    """A 3-member cluster of its own: the test kills, cuts and restarts members."""
    with private_cluster(request) as cluster:
        opened = open_store_at(cluster.url("fence/"))
        try:
            yield next(opened), cluster
        finally:
            opened.close()


_SERVERS = {
    "postgresql": _postgres,
    "redis": _redis,
    "redis_cluster": _redis_cluster,
    "etcd": _etcd,
    "etcd3": _etcd3,
}
