"""etcd as a 3-member cluster under member faults, on real workers: the leader SIGKILLed mid-run, a member cut
off from the workers through the fault kit's TCP proxy, a member restarted. The workers' store URL lists
every member; each case ends with the same checks as the rest of the fault matrix (no stale write accepted,
one effect and one completion per key, ``verify`` clean, nothing lost) while a majority runs.
"""

from __future__ import annotations

import contextlib

import pytest

from celery_fence.testing import StoreProxy
from tests.integration.workers import wait_for
from tests.integration.world import Cluster

from .checks import RUNS, done, settle_and_check
from .sending import BATCH, all_started, batches, every_store, send

pytestmark = pytest.mark.chaos
STORE = "etcd, 3 members"
RECOVER = ("--fence-recover", "--fence-recover-interval", "1")


def _started(cluster: Cluster, size: int) -> list[str]:
    ids = send(cluster.queue, size, pause=2.0)
    wait_for(lambda: all_started(cluster, ids), 60, "the runs to start")
    return ids


def _finished(cluster: Cluster, ids: list[str]) -> None:
    wait_for(lambda: all(done(cluster, i) for i in ids), 120, "the runs to finish")


@pytest.mark.parametrize("cluster", every_store("etcd3", restartable="1"), indirect=True)
def test_the_etcd_leader_killed_mid_run(cluster: Cluster) -> None:
    """The leader is SIGKILLed while the runs hold leases and renew; they finish on the two members left
    (the new leader keeps the etcd leases alive), and only then does the old leader come back."""
    cluster.worker("a", concurrency=BATCH, extra=RECOVER)
    keys: list[str] = []
    for size in batches(RUNS):
        ids = _started(cluster, size)
        leader = cluster.server.leader()
        leader.crash()
        _finished(cluster, ids)  # on the majority
        assert cluster.server.leader() is not leader, "no election: the fault did not bite"
        leader.start()
        keys += ids
    settle_and_check(cluster, STORE, "leader SIGKILLed mid-run", keys)


@pytest.mark.parametrize("cluster", every_store("etcd3", restartable="1"), indirect=True)
def test_an_etcd_member_cut_off_through_the_proxy(cluster: Cluster) -> None:
    """The workers reach each member through a proxy; one member's proxy resets every connection and refuses
    new ones while the runs hold leases, until they finish. The member cut is the next one each batch, which
    is the one the workers that failed over moved to: the cut keeps biting."""
    members = cluster.server.members
    with contextlib.ExitStack() as stack:
        proxies = [stack.enter_context(StoreProxy("127.0.0.1", m.port)) for m in members]
        url = cluster.server.url(cluster.store.prefix, [f"127.0.0.1:{p.port}" for p in proxies])
        worker = cluster.worker("a", concurrency=BATCH, env={"FENCE_IT_STORE": url}, extra=RECOVER)
        keys: list[str] = []
        for number, size in enumerate(batches(RUNS)):
            ids = _started(cluster, size)
            cut = proxies[number % len(proxies)]
            cut.cut()
            _finished(cluster, ids)  # through the other two
            cut.restore()
            keys += ids
        settle_and_check(cluster, STORE, "member cut off by the proxy", keys)
    assert "passing over" in worker.log_text(), "no call failed over: the cut did not bite"


@pytest.mark.parametrize("cluster", every_store("etcd3", restartable="1"), indirect=True)
def test_an_etcd_member_restarted_mid_run(cluster: Cluster) -> None:
    """A member is SIGKILLed and started again on its data dir while the runs hold leases: on odd batches the
    leader (an election), on even ones each member in turn; the runs go on, and the member rejoins. In the
    first batch every pool process asks the first member, which stays down until a call has failed over."""
    worker = cluster.worker("a", concurrency=BATCH, extra=RECOVER)
    members = cluster.server.members
    keys: list[str] = []
    for number, size in enumerate(batches(RUNS)):
        ids = _started(cluster, size)
        member = cluster.server.leader() if number % 2 else members[(number // 2) % len(members)]
        before = worker.log_text().count("passing over")
        member.crash()
        if number == 0:
            wait_for(lambda n=before: worker.log_text().count("passing over") > n, 30, "a call to fail over")
        member.start()  # back once healthy again: it caught up with the cluster
        _finished(cluster, ids)
        keys += ids
    settle_and_check(cluster, STORE, "member restarted mid-run", keys)
