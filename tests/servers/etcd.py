"""A private ``etcd`` member on free ports in a directory of its own, never the system one on 2379."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from celery_fence.stores.etcd import EtcdStore
from celery_fence.stores.etcd.gateway import delete
from celery_fence.stores.front import checked
from celery_fence.testing import free_port

from .process import ServerProcess

PORT_TRIES = 3


class PortTaken(Exception):
    """etcd could not bind a port that was free when it was chosen."""


class EtcdServer(ServerProcess):
    """One private etcd member, started and stopped by pid (SIGKILL crashes it: etcd keeps what its WAL had
    synced, every committed request)."""

    label = "etcd"

    def __init__(self, binary: str, directory: Path, *options: str, name: str = "default") -> None:
        super().__init__(directory / "etcd.log")
        self.binary, self.directory, self.options, self.name = binary, directory, options, name
        self.port, self.peer_port = free_port(), free_port()
        self.initial_cluster = f"{name}={self.peer_url}"  # a cluster of members sets it to all of them

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def client_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, prefix: str = "") -> str:
        return f"etcd://127.0.0.1:{self.port}/{prefix}"

    def start(self) -> EtcdServer:
        """Start and wait until healthy. A server of its own tries other ports if one was taken; a cluster's
        member restarting on its data dir keeps the ports the others know it by."""
        alone = self.initial_cluster == f"{self.name}={self.peer_url}"
        for _ in range(PORT_TRIES if alone else 1):
            self.launch()
            try:
                return self.wait_healthy()
            except PortTaken:
                self.new_ports()
        pytest.fail(f"etcd found its ports taken ({PORT_TRIES if alone else 1} tries)")

    def new_ports(self) -> None:
        """Another port pair, after another process took one between ``free_port()`` and etcd's bind (an
        outgoing connection's ephemeral port can be any free one)."""
        self.port, self.peer_port = free_port(), free_port()
        self.initial_cluster = f"{self.name}={self.peer_url}"
        shutil.rmtree(self.directory / "data", ignore_errors=True)

    def launch(self) -> None:
        """Start the process; a cluster's member is healthy only once a majority of them runs."""
        args = [self.binary, "--name", self.name, "--data-dir", str(self.directory / "data")]
        args += ["--listen-client-urls", self.client_url, "--advertise-client-urls", self.client_url]
        args += ["--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url]
        args += ["--initial-cluster", self.initial_cluster, "--log-outputs", "stderr", *self.options]
        with open(self.log, "ab") as log:
            self._log_from = log.tell()
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def wait_healthy(self, timeout: float = 30) -> EtcdServer:
        self.wait_until(self.healthy, timeout, self.port)
        return self

    def not_started(self, port: int, log_tail: str) -> None:
        if "bind: address already in use" in log_tail:
            raise PortTaken(log_tail)
        super().not_started(port, log_tail)

    def healthy(self) -> bool:
        health = f"{self.client_url}/health"
        with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(health, timeout=1) as answer:
            return bool(json.load(answer).get("health") == "true")
        return False


def open_store_at(url: str) -> Iterator[EtcdStore]:
    """A store on ``url``; its etcd leases and keys (its whole prefix) are gone afterwards."""
    store = EtcdStore(url)
    yield checked(store)  # behind the front, as open_store puts it
    store.etcd_leases.revoke_all()
    store.gateway.txn([], [delete(store.prefix, prefix=True)])
    store.close()
