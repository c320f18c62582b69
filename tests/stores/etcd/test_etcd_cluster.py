"""The etcd store on a 3-member cluster: the URL's member list, and failover between the members (a member
down, the leader killed, a member cut off through the fault kit's proxy, an answer lost at one member).

These are the cluster cases ``make test`` runs; the whole contract suite on a 3-member cluster is behind the
``etcd_cluster`` marker (``make contract-etcd-cluster``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_fence import ConfigurationError, StaleToken, StoreUnavailable
from celery_fence.stores import store_class
from celery_fence.stores.etcd import EtcdStore
from celery_fence.testing import StoreProxy, wait_for
from tests.servers.etcd import open_store_at
from tests.servers.etcd_cluster import EtcdCluster, private_cluster
from tests.servers.scripted_http import ScriptedServer

TTL = 30.0


@pytest.fixture(scope="module")
def etcd3(request: pytest.FixtureRequest) -> Iterator[EtcdCluster]:
    """One cluster for the module; a test that stops a member starts it again before it ends."""
    with private_cluster(request) as cluster:
        yield cluster


@pytest.fixture
def store(etcd3: EtcdCluster, request: pytest.FixtureRequest) -> Iterator[EtcdStore]:
    yield from open_store_at(etcd3.url(f"t{request.node.name[:40]}/"))


def _eventually(call: Any, what: str, timeout: float = 30) -> Any:
    """``call()``'s value once it stops raising ``StoreUnavailable`` (an election is under way)."""

    def attempt() -> Any:
        try:
            return (call(),)
        except StoreUnavailable:
            return None

    return wait_for(attempt, timeout, what)[0]


def test_a_list_of_endpoints_names_every_member() -> None:
    store = EtcdStore("etcd://10.0.0.1:2379,10.0.0.2,[::1]:2380/app")
    assert store.url == "etcd://10.0.0.1:2379,10.0.0.2:2379,[::1]:2380/app/"
    assert [t.base_url for t in store.gateway.members.transports] == [
        "http://10.0.0.1:2379",
        "http://10.0.0.2:2379",
        "http://[::1]:2380",
    ]
    assert EtcdStore(store.url).url == store.url  # a worker opens the same members and keys


@pytest.mark.parametrize(
    "url",
    [
        "etcd://h1:1,,h2:2/",
        "etcd://h1:1,/",
        "etcd://,h1:1/",
        "etcd://h1:1,h1:1/",
        "etcd://h1,h1:2379/",  # the default port: the same member twice
        "etcd://h1:1,h2:port/",
        "etcd://h1:1,h2:99999/",
        "etcd://root:s3cret@h1:1,h2:2/",
        "etcd://h1:1,h2:2/?password=s3cret",
    ],
)
def test_a_bad_member_list_is_refused_before_any_round_trip(url: str) -> None:
    for refuse in (EtcdStore, store_class):  # open_store refuses it there, before constructing
        with pytest.raises(ConfigurationError, match=r"etcd store URL") as info:
            refuse(url)
        assert "s3cret" not in str(info.value)
        assert "etcd://host:2379[,host2:2379,...]" in str(info.value) or "bad port" in str(info.value)


def test_calls_go_on_to_the_next_member_when_one_is_down(etcd3: EtcdCluster, request: Any) -> None:
    """A follower listed first is down: its refused connections send every call on to the next member (a
    killed leader instead makes writes wait out the election: the next test)."""
    leader = etcd3.leader()
    first = next(m for m in etcd3.members if m is not leader)
    endpoints = [f"127.0.0.1:{m.port}" for m in sorted(etcd3.members, key=lambda m: m is not first)]
    opened = open_store_at(etcd3.url(f"t{request.node.name[:40]}/", endpoints))
    store = next(opened)
    held = store.acquire("held", "a", TTL)
    first.crash()
    try:
        lease = store.acquire("k", "a", TTL)  # refused at the first member: sent to the next one
        assert lease.token > held.token and store.renew([held, lease], TTL) == []
        store.complete(lease, "done")
        assert (store.get("k") or pytest.fail()).result == "done"
    finally:
        first.start()
    store.complete(held, "also")  # and with every member back
    assert [e.event for e in store.history("k")] == ["acquire", "complete"]
    opened.close()


def test_the_leader_killed_leaves_leases_alive_and_tokens_going_up(
    etcd3: EtcdCluster, store: EtcdStore
) -> None:
    before = store.acquire("before", "a", TTL)
    leader = etcd3.leader()
    leader.crash()
    try:
        assert _eventually(lambda: store.renew([before], TTL), "a renew after the election") == []
        after = _eventually(lambda: store.acquire("after", "b", TTL), "an acquire after the election")
        assert after.token > before.token
        store.complete(before, 1)
        with pytest.raises(StaleToken):
            store.complete(before, 2)  # one effect per key, whichever member answers
        assert etcd3.leader() is not leader
    finally:
        leader.start()
    store.complete(after, 3)


def test_a_member_cut_off_through_the_proxy_is_passed_over(etcd3: EtcdCluster, request: Any) -> None:
    with StoreProxy("127.0.0.1", etcd3.members[0].port) as proxy:
        endpoints = [f"127.0.0.1:{proxy.port}", *(f"127.0.0.1:{m.port}" for m in etcd3.members[1:])]
        opened = open_store_at(etcd3.url(f"t{request.node.name[:40]}/", endpoints))
        store = next(opened)
        lease = store.acquire("k", "a", TTL)
        proxy.cut()  # every connection to the first member reset, new ones refused
        assert store.renew([lease], TTL) == []  # a read reset at the first member is asked at the next
        store.complete(lease, "done")
        proxy.restore()
        assert (store.get("k") or pytest.fail()).result == "done"
        opened.close()


def test_an_acquire_whose_answer_was_lost_at_one_member_is_found_at_the_next(
    etcd3: EtcdCluster, store: EtcdStore
) -> None:
    """The acquire committed through the first member, whose answer never came: the store says unavailable
    and does not send it again; the caller's retry goes to the next member and finds its own lock, with the
    token the lost answer carried (no second token, one acquire in the history)."""
    first = etcd3.members[0]
    lossy = ScriptedServer(["answer", "lose"], upstream=("127.0.0.1", first.port))  # grant, then the Txn
    try:
        endpoints = [f"127.0.0.1:{lossy.port}", *(f"127.0.0.1:{m.port}" for m in etcd3.members[1:])]
        other = EtcdStore(etcd3.url(store.prefix, endpoints))
        with pytest.raises(StoreUnavailable):
            other.acquire("k", "owner-1", TTL)
        lease = other.acquire("k", "owner-1", TTL)
        assert len(lossy.received) == 2  # the retry went to another member
        assert lease.token == (store.get("k") or pytest.fail()).token
        other.complete(lease, "once")
        assert [e.event for e in store.history("k")] == ["acquire", "complete"]
        other.etcd_leases.revoke_all()
        other.close()
    finally:
        lossy.stop()


def test_a_complete_whose_answer_was_lost_at_one_member_commits_once(
    etcd3: EtcdCluster, store: EtcdStore
) -> None:
    first = etcd3.members[0]
    lossy = ScriptedServer(["answer", "answer", "lose"], upstream=("127.0.0.1", first.port))
    try:
        endpoints = [f"127.0.0.1:{lossy.port}", *(f"127.0.0.1:{m.port}" for m in etcd3.members[1:])]
        other = EtcdStore(etcd3.url(store.prefix, endpoints))
        lease = other.acquire("k", "a", TTL)
        with pytest.raises(StoreUnavailable):
            other.complete(lease, "once")
        assert (other.get("k") or pytest.fail()).result == "once"  # asked at the next member
        assert [e.event for e in store.history("k")] == ["acquire", "complete"]
        with pytest.raises(StaleToken):  # a retry finds it completed: no second write
            other.complete(lease, "twice")
        assert (store.get("k") or pytest.fail()).result == "once"
        other.close()
    finally:
        lossy.stop()
