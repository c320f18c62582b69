"""A private etcd cluster: ``SIZE`` members on free ports, each in a directory of its own, stopped by pid; a
store's URL lists them all (``etcd://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/<prefix>/``)."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from celery_fence.testing import wait_for

from .etcd import PORT_TRIES, EtcdServer, PortTaken

SIZE = 3


class EtcdCluster:
    """``SIZE`` etcd members forming one cluster, each an :class:`EtcdServer` (``crash()``, ``start()``)."""

    def __init__(self, binary: str, directory: Path, size: int = SIZE) -> None:
        token = ("--initial-cluster-token", f"fence-{uuid.uuid4().hex[:8]}")
        self.members = [EtcdServer(binary, directory / f"m{i}", *token, name=f"m{i}") for i in range(size)]
        for member in self.members:
            member.directory.mkdir(parents=True)
        self._introduce()

    def start(self) -> EtcdCluster:
        for _ in range(PORT_TRIES):
            for member in self.members:  # all first: a member is healthy only once a majority runs
                member.launch()
            try:
                for member in self.members:
                    member.wait_healthy(60)
                return self
            except PortTaken:  # a port went to another process before etcd bound it: all anew
                self.stop()
                for member in self.members:
                    member.new_ports()
                self._introduce()
        pytest.fail(f"the etcd cluster found its ports taken {PORT_TRIES} times")

    def _introduce(self) -> None:
        everyone = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for member in self.members:
            member.initial_cluster = everyone

    def stop(self) -> None:
        """SIGKILL every member: its data dir is thrown away, and a SIGTERMed leader would first try to hand
        its leadership over to members stopping too (seconds of teardown per cluster)."""
        for member in self.members:
            member.crash()

    def url(self, prefix: str = "", endpoints: Sequence[str] | None = None) -> str:
        """The store URL listing every member (or ``endpoints``, ``host:port`` each, such as proxies)."""
        listed = endpoints or [f"127.0.0.1:{m.port}" for m in self.members]
        return f"etcd://{','.join(listed)}/{prefix}"

    def leader(self, timeout: float = 30) -> EtcdServer:
        """The member that leads now, once the running members agree on one."""
        found: Any = wait_for(self._leader, timeout, "the etcd members to elect a leader")
        leader: EtcdServer = found
        return leader

    def _leader(self) -> EtcdServer | None:
        statuses = {id(m): _status(m) for m in self.members if m.process is not None}
        leaders = {s["leader"] for s in statuses.values() if s is not None and s.get("leader")}
        if len(leaders) != 1:
            return None
        (leader,) = leaders
        return next((m for m in self.members if (statuses.get(id(m)) or {}).get("member") == leader), None)


def _status(member: EtcdServer) -> dict[str, str] | None:
    """``{"member": its id, "leader": the leader's id}`` from its gateway; None if it says nothing."""
    request = urllib.request.Request(f"{member.client_url}/v3/maintenance/status", b"{}", method="POST")
    with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(request, timeout=1) as answer:
        found = json.load(answer)
        return {"member": str(found["header"]["member_id"]), "leader": str(found.get("leader", ""))}
    return None


@contextlib.contextmanager
def private_cluster(request: pytest.FixtureRequest) -> Iterator[EtcdCluster]:
    """A cluster of its own (a test that breaks members), stopped and removed afterwards."""
    directory = Path(tempfile.mkdtemp(prefix="fence-etcd3-"))
    cluster = EtcdCluster(request.getfixturevalue("etcd_binary"), directory)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)
