"""The Redis store's cluster mode (``?cluster=true``) beyond the contract suite: its URL
forms, its names (each in the slot of its key; no store-wide name), and its driver errors."""

from __future__ import annotations

from typing import Any

import pytest
from redis.crc import key_slot

from celery_fence import ConfigurationError, StoreUnavailable, open_store
from celery_fence.stores.redis import RedisStore
from celery_fence.stores.redis.cluster import Cluster
from celery_fence.stores.redis.server import OneServer
from celery_fence.testing import free_port
from celery_fence.testing.contract.checks import TTL
from tests.servers.redis_cluster import drop_cluster_prefix
from tests.support.harnesses.redis_cluster import shared_cluster


@pytest.mark.parametrize(
    "url",
    [
        "redis://:s3cret@127.0.0.1:7000/0?cluster=maybe",
        "redis://:s3cret@127.0.0.1:7000/3?cluster=true",
        "redis://:s3cret@127.0.0.1:7000,:7001/0?cluster=true",
        "redis://:s3cret@127.0.0.1:7000,127.0.0.1:x/0?cluster=true",
        "redis://:s3cret@127.0.0.1:7000,127.0.0.1:7001/0",  # several nodes without cluster=true
    ],
)
def test_bad_cluster_urls_are_refused_at_once_without_the_secret(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        RedisStore(url)
    assert "s3cret" not in str(info.value) and "cluster=true" in str(info.value)


def test_a_cluster_url_names_every_node_and_selects_cluster_mode() -> None:
    store = RedisStore("rediss://u:p@a.example:7000,b.example/0?cluster=yes&prefix=shop:")
    assert isinstance(store._layout, Cluster)
    assert (store._layout.nodes, store.prefix, store._layout.target) == (
        [("a.example", 7000), ("b.example", 6379)], "shop:", "rediss://u:p@a.example:7000"
    )
    assert isinstance(RedisStore("redis://a.example:7000/0?cluster=false")._layout, OneServer)


@pytest.fixture
def cluster_store(request: pytest.FixtureRequest) -> Any:
    servers = shared_cluster(request)
    store = open_store(servers.url("tc:"))
    yield store, servers
    store.close()
    drop_cluster_prefix(servers, "tc:")


def test_every_name_is_in_the_slot_of_its_key_and_none_is_store_wide(cluster_store: Any) -> None:
    store, servers = cluster_store
    keys = ["k", "}starts-with-a-brace", "a}b", "{x}"]
    for key in keys:
        lease = store.acquire(key, "w", TTL)
        store.save_step(lease, "s", 1)
        store.complete(lease, key)
    assert store.prune(0.0) == len(keys)
    lease = store.acquire("k", "w", TTL)  # a pruned key again: its slot's counter was kept
    assert lease.token > 1
    names = [name for node in servers.primary_nodes() for name in node.client().scan_iter(match="tc:*")]
    counters = [n for n in names if n.startswith(("tc:counter:{", "tc:high:{"))]
    per_key = [n for n in names if n not in counters]
    assert per_key and all("{=" in n for n in per_key)  # lease, history: each tagged by its key
    for key in keys:  # a key's names and its slot's counter share one slot, so a script may touch them all
        slot = key_slot(store._names.name_of("lease", key).encode())
        assert key_slot(store._names.name_of("history", key).encode()) == slot == store.token_scope(key)
    assert len(counters) <= 2 * len(keys)  # at most a counter and a high token per slot used


def test_a_cluster_that_cannot_be_reached_is_store_unavailable() -> None:
    store = open_store(f"redis://127.0.0.1:{free_port()}/0?cluster=true&prefix=x:")
    with pytest.raises(StoreUnavailable):
        store.acquire("k", "w", TTL)
    store.close()
