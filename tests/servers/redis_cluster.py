"""A private Redis Cluster: ``redis-server --cluster-enabled yes`` nodes on free ports in temp dirs, formed
with ``redis-cli --cluster create`` and stopped by pid."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.cluster import RedisCluster as Client

from celery_fence.testing import free_port

from ..support.required import require_server
from .redis import RedisServer


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


def drop_cluster_prefix(servers: RedisClusterServers, prefix: str) -> None:
    for node in servers.primary_nodes():
        with node.client() as client:
            for name in list(client.scan_iter(match=f"{prefix}*", count=1000)):
                client.delete(name)  # one by one: the names are in many slots


def primary_clients(url: str) -> list[redis.Redis]:
    """A client of each node named in a cluster store's ``url`` that is a primary now (the contract's
    cluster has no replicas: every node it names)."""
    hosts = url.partition("://")[2].partition("/")[0].split(",")
    found = []
    for host in hosts:
        name, _, port = host.rpartition(":")
        client = redis.Redis(host=name, port=int(port), decode_responses=True, socket_timeout=5)
        if client.execute_command("ROLE")[0] == "master":
            found.append(client)
        else:
            client.close()
    return found
