"""The etcd store's HTTP transport (:mod:`celery_fence.stores.etcd.http`): keep-alive connections per process
and per concurrent call, a dropped idle connection replaced before anything is sent, a lost answer resent only
for a read on a reused connection and only once, a write's lost answer reported as ``StoreUnavailable``."""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from celery_fence import StaleToken, StoreUnavailable
from celery_fence.stores.etcd import EtcdStore
from celery_fence.stores.etcd.gateway import Gateway, get, put
from celery_fence.testing._proxy import Proxy
from tests.servers.scripted_http import ScriptedServer
from tests.support.harnesses.etcd import open_etcd_store, shared_server

TTL = 30.0
READ, WRITE = [get("k")], [put("k", "v")]


@pytest.fixture
def estore(request: pytest.FixtureRequest) -> Iterator[EtcdStore]:
    yield from open_etcd_store(request)


@pytest.fixture
def scripted() -> Iterator[Any]:
    """``scripted(actions, upstream=None)``: a :class:`ScriptedServer`, stopped afterwards."""
    servers: list[ScriptedServer] = []

    def make(script: list[str], upstream: tuple[str, int] | None = None) -> ScriptedServer:
        servers.append(ScriptedServer(script, upstream))
        return servers[-1]

    yield make
    for server in servers:
        server.stop()


def _local_ports(store: EtcdStore) -> set[int]:
    """The local ports of the store's idle connections in this process."""
    return {conn.sock.getsockname()[1] for conn in store.gateway.http._idle if conn.sock is not None}


def test_timeouts_are_the_requests_clients(scripted: Any) -> None:
    gw = Gateway(scripted([]).url)
    gw.txn([], READ)
    (conn,) = gw.http._idle
    assert (conn.timeout, conn.sock.gettimeout()) == (3.0, 5.0)  # to connect, then per socket operation
    gw.close()
    assert gw.http._idle == [] and conn.sock is None


def test_a_connection_the_server_closed_between_calls_is_reopened(scripted: Any) -> None:
    server = scripted(["answer-close"])
    gw = Gateway(server.url)
    gw.txn([], READ)
    assert server.closed.wait(5)  # the server closed its side while the connection was idle
    time.sleep(0.05)  # its FIN crosses loopback
    assert gw.txn([], WRITE).succeeded  # a write: it went out once, on a new connection
    assert (server.connections, len(server.received)) == (2, 2)
    gw.close()


def test_a_connection_reset_between_calls_is_reopened(
    estore: EtcdStore, request: pytest.FixtureRequest
) -> None:
    with Proxy("127.0.0.1", shared_server(request).port) as proxy:
        store = EtcdStore(f"etcd://{proxy.host}:{proxy.port}/{estore.prefix}")
        lease = store.acquire("k", "a", TTL)
        proxy.cut()  # resets the idle connection
        proxy.restore()
        store.complete(lease, "done")  # not StoreUnavailable: the reset was seen before sending
        assert [e.event for e in estore.history("k")] == ["acquire", "complete"]
        store.etcd_leases.revoke_all()
        store.close()


def test_a_write_whose_answer_is_lost_is_unavailable_and_not_sent_again(scripted: Any) -> None:
    server = scripted(["answer", "lose"])
    gw = Gateway(server.url)
    gw.txn([], READ)
    with pytest.raises(StoreUnavailable, match="did not answer"):
        gw.txn([], WRITE)  # on the reused connection: the keep-alive race or a crash, nobody can tell
    assert len(server.received) == 2
    assert gw.txn([], READ).succeeded  # the next call takes a new connection
    gw.close()


def test_a_read_whose_answer_is_lost_on_a_reused_connection_is_asked_once_more(scripted: Any) -> None:
    server = scripted(["answer", "lose", "answer"])
    gw = Gateway(server.url)
    gw.txn([], READ)
    assert gw.txn([], READ).succeeded
    assert gw.time_to_live(1) == -1  # a read too (the canned answer has no TTL)
    assert (server.connections, len(server.received)) == (2, 4)


def test_a_read_is_asked_once_more_at_most(scripted: Any) -> None:
    server = scripted(["answer", "lose", "lose", "answer"])
    gw = Gateway(server.url)
    gw.txn([], READ)
    with pytest.raises(StoreUnavailable):
        gw.txn([], READ)
    assert len(server.received) == 3


def test_a_read_lost_on_a_new_connection_is_not_asked_again(scripted: Any) -> None:
    server = scripted(["lose"])
    with pytest.raises(StoreUnavailable):
        Gateway(server.url).txn([], READ)  # no keep-alive race on a connection just made: etcd is in trouble
    assert len(server.received) == 1


def test_a_read_timeout_is_unavailable_and_not_asked_again(scripted: Any) -> None:
    server = scripted(["answer", "hang"])
    gw = Gateway(server.url, timeout=(1.0, 0.3))
    gw.txn([], READ)
    with pytest.raises(StoreUnavailable, match="TimeoutError"):
        gw.txn([], READ)
    assert len(server.received) == 2


def test_a_complete_whose_answer_is_lost_is_unavailable_and_committed_once(
    estore: EtcdStore, scripted: Any, request: pytest.FixtureRequest
) -> None:
    """The write reached etcd and committed; only its answer was lost: the store says unavailable (the
    outcome is unknown to it) and sends nothing again, so the history holds one completion."""
    server = scripted(["answer", "answer", "lose"], upstream=("127.0.0.1", shared_server(request).port))
    store = EtcdStore(f"etcd://127.0.0.1:{server.port}/{estore.prefix}")
    lease = store.acquire("k", "a", TTL)  # grant, Txn
    with pytest.raises(StoreUnavailable):
        store.complete(lease, "once")
    assert len(server.received) == 3
    assert (estore.get("k") or pytest.fail()).result == "once"
    assert [e.event for e in estore.history("k")] == ["acquire", "complete"]
    with pytest.raises(StaleToken):  # the caller's retry finds the lease completed, not a second write
        store.complete(lease, "twice")
    store.etcd_leases.revoke_all()
    store.close()


def test_threads_use_connections_of_their_own(estore: EtcdStore) -> None:
    store, barrier = EtcdStore(estore.url), threading.Barrier(8)

    def run(i: int) -> int:
        barrier.wait(30)  # all at once: each call in flight needs a connection of its own
        lease = store.acquire(f"t{i}", f"thread-{i}", TTL)
        store.complete(lease, i)
        return lease.token

    with ThreadPoolExecutor(8) as pool:
        tokens = list(pool.map(run, range(8)))
    assert len(set(tokens)) == 8 and all((estore.get(f"t{i}") or pytest.fail()).result == i for i in range(8))
    assert 1 <= len(store.gateway.http._idle) <= 8  # never more than the calls that ran at once
    store.etcd_leases.revoke_all()
    store.close()


def _in_child(store: EtcdStore, parent_ports: set[int], out: Any) -> None:
    store.complete(store.acquire("child", "c", TTL), "child")
    out.put(_local_ports(store).isdisjoint(parent_ports) and bool(_local_ports(store)))


def test_a_forked_child_talks_on_connections_of_its_own(estore: EtcdStore) -> None:
    estore.acquire("parent", "p", TTL)
    before = _local_ports(estore)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_in_child, args=(estore, before, out))
    child.start()
    assert out.get(timeout=30) is True  # the child made its own, never used the parent's
    child.join(30)
    assert child.exitcode == 0 and (estore.get("child") or pytest.fail()).result == "child"
    assert _local_ports(estore) == before  # the parent's connection was left alone: still open, reused
