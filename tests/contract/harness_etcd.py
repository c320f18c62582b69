"""The etcd harness: a private ``etcd`` on free ports in a temp dir, never the system one on 2379.

The server starts on first use and is stopped by pid at the end of the session (and at exit). Each test
opens its store under a prefix of its own, carried in the URL (``etcd://127.0.0.1:PORT/<prefix>/``) so other
processes reach the same keys; its etcd leases are revoked and its keys deleted afterwards. "Every live
lease expires now" is a revoke of the store's etcd leases: their lock keys are gone, as after a ttl.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_fence.lease import MAX_TOKEN
from celery_fence.stores.etcd import EtcdStore
from celery_fence.stores.etcd.gateway import delete, put
from celery_fence.stores.front import checked
from celery_fence.testing import free_port

from .harness import Harness, end_process

PORT_TRIES = 3


class PortTaken(Exception):
    """etcd could not bind a port that was free when it was chosen."""


class EtcdServer:
    """One private single-member etcd, started and stopped by pid."""

    def __init__(self, binary: str, directory: Path, *options: str, name: str = "default") -> None:
        self.binary, self.directory, self.options, self.name = binary, directory, options, name
        self.port, self.peer_port = free_port(), free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._log_from = 0  # where this launch's lines start in etcd.log
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
        with open(self.directory / "etcd.log", "ab") as log:
            self._log_from = log.tell()
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

    def wait_healthy(self, timeout: float = 30) -> EtcdServer:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.process is None or self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                with open(self.directory / "etcd.log", "rb") as log:
                    log.seek(self._log_from)
                    log_tail = log.read().decode(errors="replace")[-2000:]
                if "bind: address already in use" in log_tail:
                    raise PortTaken(log_tail)
                pytest.fail(f"etcd on port {self.port} did not start:\n{log_tail}")
            time.sleep(0.05)
        return self

    def healthy(self) -> bool:
        health = f"{self.client_url}/health"
        with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(health, timeout=1) as answer:
            return bool(json.load(answer).get("health") == "true")
        return False

    def stop(self) -> None:
        process, self.process = self.process, None
        end_process(process)

    def crash(self) -> None:
        """SIGKILL: etcd keeps what its WAL had synced (every committed request)."""
        process, self.process = self.process, None
        end_process(process, signal.SIGKILL)


_shared: list[EtcdServer] = []


def shared_server(request: pytest.FixtureRequest) -> EtcdServer:
    """The session's private etcd, started on first use."""
    binary = request.getfixturevalue("etcd_binary")
    found: EtcdServer = once_per_session(request, _shared, lambda d: EtcdServer(binary, d).start(), "etcd")
    return found


def once_per_session(
    request: pytest.FixtureRequest, shared: list[Any], start: Callable[[Path], Any], name: str
) -> Any:
    """``shared[0]``, made by ``start(a temp dir)`` on first use, stopped at the session's end (or exit)."""
    if not shared:
        directory = Path(tempfile.mkdtemp(prefix=f"fence-{name}-"))
        server = start(directory)
        shared.append(server)

        def stop() -> None:
            server.stop()
            shutil.rmtree(directory, ignore_errors=True)
            shared.clear()

        request.session.addfinalizer(stop)
        atexit.register(stop)
    return shared[0]


def open_etcd_store(request: pytest.FixtureRequest) -> Iterator[EtcdStore]:
    """A store under a fresh prefix on the shared server; its leases and keys are gone afterwards."""
    yield from open_store_at(shared_server(request).url(f"t{uuid.uuid4().hex[:12]}/"))


def open_store_at(url: str) -> Iterator[EtcdStore]:
    """A store on ``url``; its etcd leases and keys (its whole prefix) are gone afterwards."""
    store = EtcdStore(url)
    yield checked(store)  # behind the front, as open_store puts it
    store.etcd_leases.revoke_all()
    store.gateway.txn([], [delete(store.prefix, prefix=True)])
    store.close()


def _open(request: pytest.FixtureRequest) -> Iterator[Any]:
    yield from open_etcd_store(request)


def _expire(store: Any) -> None:
    store.etcd_leases.revoke_all()


def near_the_top(store: EtcdStore, left: int) -> None:
    """The token offset moved as ``advance`` would, past its headroom check (2**32 below the top, which only
    2**32 more revisions would cross): the next revision's token is ``left`` below 2**53 - 1."""
    space = store.space
    revision, epochs = space.read([]).revision, space.epochs
    _, value = epochs.advanced(MAX_TOKEN - left - (revision + 1) - epochs.offset)
    assert space.gateway.txn([space.offset_is(epochs)], [put(space.offset_key, value)]).succeeded
    space.read([])  # the store's cached epochs: the new one


HARNESS = Harness(
    "etcd", _open, _expire, expired_lease_survives=False, multiprocess=True, near_the_top=near_the_top
)
