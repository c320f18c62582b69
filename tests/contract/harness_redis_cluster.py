"""The Redis Cluster harness: a private cluster of 3 primaries (and, for failover, a replica each) from
``redis-server --cluster-enabled yes`` on free ports in temp dirs, formed with ``redis-cli --cluster create``
and stopped by pid.

The contract suite's cluster (3 primaries, no replicas) starts on first use and stops at the end of the
session; each test opens its store under a prefix of its own (``?cluster=true&prefix=...``) and its keys
are deleted afterwards. A failover test makes its own with replicas (``RedisCluster(replicas=1)``).
"""

from __future__ import annotations

import atexit
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster as Client
from redis.crc import key_slot

from celery_fence import open_store
from celery_fence.testing import free_port

from ..conftest import require_server
from .harness import Harness
from .harness_redis import RedisServer

# A node's own lease hashes: every live lease's store-clock deadline 10,000 s into the past.
_EXPIRE = """
for _, name in ipairs(redis.call('KEYS', ARGV[1] .. 'lease:*')) do
  if redis.call('HEXISTS', name, 'exp') == 1 then redis.call('HINCRBY', name, 'exp', -10000000) end
end
"""


class RedisClusterServers:
    """``primaries`` redis-server processes formed into one cluster, each with ``replicas`` replicas."""

    def __init__(self, primaries: int = 3, replicas: int = 0) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="fence-redis-cluster-"))
        self.primaries, self.replicas = primaries, replicas
        self.nodes: list[RedisServer] = []

    def start(self) -> RedisClusterServers:
        cli = shutil.which("redis-cli")
        require_server("redis-cli", cli is not None, "install redis-tools (apt install redis-tools)")
        assert cli is not None
        for n in range(self.primaries * (1 + self.replicas)):
            node_dir = self.directory / f"node{n}"
            node_dir.mkdir()
            options = ("--cluster-enabled", "yes", "--cluster-port", str(free_port()))
            options += ("--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0")
            self.nodes.append(RedisServer(node_dir, None, *options).start())
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        args = [cli, "--cluster", "create", *addresses, "--cluster-replicas", str(self.replicas)]
        formed = subprocess.run(
            [*args, "--cluster-yes"], check=False, capture_output=True, text=True, timeout=60
        )
        if formed.returncode != 0:
            self.stop()
            pytest.fail(f"redis-cli --cluster create failed:\n{formed.stdout}\n{formed.stderr}")
        self.wait_ok()
        deadline = time.monotonic() + 30
        while not all(len(self._replicas_of(node)) >= self.replicas for node in self.primary_nodes()):
            if time.monotonic() > deadline:
                pytest.fail("the Redis Cluster's replicas did not connect")
            time.sleep(0.05)
        return self

    @staticmethod
    def _replicas_of(node: RedisServer) -> list[Any]:
        """The replicas connected to ``node`` now (``ROLE`` of a primary)."""
        with node.client() as client:
            return list(client.execute_command("ROLE")[2])

    def wait_ok(self, timeout: float = 30) -> None:
        """Until every running node says the cluster is ok and every slot has a primary."""
        deadline = time.monotonic() + timeout
        while not all(self._ok(node) for node in self.nodes if node.process is not None):
            if time.monotonic() > deadline:
                pytest.fail("the Redis Cluster did not become ok")
            time.sleep(0.05)

    @staticmethod
    def _ok(node: RedisServer) -> bool:
        try:
            with node.client() as client:
                info = client.execute_command("CLUSTER", "INFO")
        except redis.RedisError:
            return False
        text = info if isinstance(info, str) else str(info)
        return "cluster_state:ok" in text and "cluster_slots_ok:16384" in text

    def url(self, prefix: str) -> str:
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes[: self.primaries])
        return f"redis://{hosts}/0?cluster=true&prefix={prefix}"

    def client(self) -> Client:
        return Client(host="127.0.0.1", port=self.nodes[0].port, decode_responses=True)

    def primary_nodes(self) -> list[RedisServer]:
        """The running nodes that are primaries now (a failover changes which)."""
        found = []
        for node in self.nodes:
            if node.process is None:
                continue
            with node.client() as client:
                if client.execute_command("ROLE")[0] == "master":
                    found.append(node)
        return found

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


_shared: list[RedisClusterServers] = []


def shared_cluster(request: pytest.FixtureRequest) -> RedisClusterServers:
    """The session's private cluster (3 primaries), started on first use."""
    if not _shared:
        servers = RedisClusterServers().start()
        _shared.append(servers)

        def stop() -> None:
            servers.stop()
            _shared.clear()

        request.session.addfinalizer(stop)
        atexit.register(stop)
    return _shared[0]


def drop_prefix(servers: RedisClusterServers, prefix: str) -> None:
    for node in servers.primary_nodes():
        with node.client() as client:
            for name in list(client.scan_iter(match=f"{prefix}*", count=1000)):
                client.delete(name)  # one by one: the names are in many slots


def open_cluster_store(servers: RedisClusterServers) -> Iterator[Any]:
    prefix = f"t{uuid.uuid4().hex[:12]}:"
    store = open_store(servers.url(prefix))
    yield store
    store.close()
    drop_prefix(servers, prefix)


def _open(request: pytest.FixtureRequest) -> Iterator[Any]:
    yield from open_cluster_store(shared_cluster(request))


def expire_on(servers: RedisClusterServers, store: Any) -> None:
    for node in servers.primary_nodes():
        with node.client() as client:
            client.eval(_EXPIRE, 0, store.prefix)


def _expire(store: Any) -> None:
    assert _shared, "the cluster of this store is not running"
    expire_on(_shared[0], store)


def slot_of(key: str) -> int:
    """The slot of a lease key's names (the store's ``{=key}`` hash tag): its tokens' scope."""
    return key_slot(f"{{={key}}}".encode())


HARNESS = Harness("redis_cluster", _open, _expire, token_scope=slot_of)
