"""The 3-member etcd harness, on a private etcd cluster (tests/servers/etcd_cluster.py).

The contract suite runs on a session's cluster under the ``etcd_cluster`` marker
(``make contract-etcd-cluster``; ``make test`` deselects it and keeps ``test_etcd_cluster.py``, the failover
cases, on a cluster of their own).
The chaos cases break members of a cluster started for each test
(:func:`tests.servers.etcd_cluster.private_cluster`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from celery_fence.testing import StoreHarness as Harness

from ...servers.etcd import open_store_at
from ...servers.etcd_cluster import EtcdCluster
from .etcd import near_the_top


def shared_cluster(request: pytest.FixtureRequest) -> EtcdCluster:
    """The session's 3-member cluster (the ``private_etcd_cluster`` fixture), started on first use."""
    cluster: EtcdCluster = request.getfixturevalue("private_etcd_cluster")
    return cluster


def _open(request: pytest.FixtureRequest) -> Iterator[Any]:
    yield from open_store_at(shared_cluster(request).url(f"t{uuid.uuid4().hex[:12]}/"))


def _expire(store: Any) -> None:
    store.etcd_leases.revoke_all()


HARNESS = Harness(
    "etcd_cluster",
    _open,
    _expire,
    expired_lease_survives=False,
    marks=(pytest.mark.etcd_cluster,),
    near_the_top=near_the_top,
)
