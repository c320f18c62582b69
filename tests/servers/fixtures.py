"""The session's shared private servers, each started on first use and stopped by pid at the session's
end: registered for the whole tree by tests/conftest.py."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from .etcd import EtcdServer
from .etcd_cluster import EtcdCluster
from .redis import RedisServer
from .redis_cluster import RedisClusterServers

Server = TypeVar("Server", bound=Any)


def _in_temp_dir(prefix: str, start: Callable[[Path], Server]) -> Iterator[Server]:
    """``start(a temp dir)``, yielded, then stopped and its directory removed."""
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        server = start(directory)
        yield server
        server.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def private_redis() -> Iterator[RedisServer]:
    """A redis-server without persistence (the Redis contract harness's)."""
    yield from _in_temp_dir("fence-redis-", lambda directory: RedisServer(directory).start())


@pytest.fixture(scope="session")
def private_redis_cluster() -> Iterator[RedisClusterServers]:
    """A Redis Cluster of 3 primaries and no replicas (the Redis Cluster contract harness's)."""
    servers = RedisClusterServers().start()
    try:
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="session")
def private_etcd(etcd_binary: str) -> Iterator[EtcdServer]:
    """A single-member etcd (the etcd contract harness's)."""
    yield from _in_temp_dir("fence-etcd-", lambda directory: EtcdServer(etcd_binary, directory).start())


@pytest.fixture(scope="session")
def private_etcd_cluster(etcd_binary: str) -> Iterator[EtcdCluster]:
    """A 3-member etcd cluster (the etcd cluster contract harness's)."""
    yield from _in_temp_dir("fence-etcd3-", lambda directory: EtcdCluster(etcd_binary, directory).start())
