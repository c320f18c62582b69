"""The Redis Cluster harness, on a private cluster (tests/servers/redis_cluster.py).

The contract suite's cluster (3 primaries, no replicas) is the session's ``private_redis_cluster`` fixture;
each test opens its store under a prefix of its own (``?cluster=true&prefix=...``) and its keys are deleted
afterwards. A failover test makes its own with replicas (``RedisCluster(replicas=1)``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from celery_fence import open_store
from celery_fence.testing import StoreHarness as Harness

from ...servers.redis_cluster import RedisClusterServers, drop_cluster_prefix, primary_clients

# A node's own lease hashes: every live lease's store-clock deadline 10,000 s into the past.
_EXPIRE = """
for _, name in ipairs(redis.call('KEYS', ARGV[1] .. 'lease:*')) do
  if redis.call('HEXISTS', name, 'exp') == 1 then redis.call('HINCRBY', name, 'exp', -10000000) end
end
"""


def shared_cluster(request: pytest.FixtureRequest) -> RedisClusterServers:
    """The session's private cluster (the ``private_redis_cluster`` fixture), started on first use."""
    servers: RedisClusterServers = request.getfixturevalue("private_redis_cluster")
    return servers


def open_cluster_store(servers: RedisClusterServers) -> Iterator[Any]:
    prefix = f"t{uuid.uuid4().hex[:12]}:"
    store = open_store(servers.url(prefix))
    yield store
    store.close()
    drop_cluster_prefix(servers, prefix)


def _open(request: pytest.FixtureRequest) -> Iterator[Any]:
    yield from open_cluster_store(shared_cluster(request))


def _expire(store: Any) -> None:
    for client in primary_clients(store.url):
        with client:
            client.eval(_EXPIRE, 0, store.prefix)


def slot_of(key: str) -> int:
    """The slot of a lease key's names (the store's ``{=key}`` hash tag): its tokens' scope."""
    return key_slot(f"{{={key}}}".encode())


HARNESS = Harness("redis_cluster", _open, _expire, token_scope=slot_of)
