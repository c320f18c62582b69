"""The Redis harness: a private ``redis-server`` (no persistence) on a free port in a temp dir.

The server (tests/servers/redis.py) is the session's ``private_redis`` fixture. Each test
opens its store under a prefix of its own, carried in the URL (``?prefix=``) so other processes reach
the same data, and its keys are deleted afterwards. The shared Redis on 6379 is never touched.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from celery_fence import open_store
from celery_fence.testing import StoreHarness as Harness

from ...servers.redis import RedisServer, drop_prefix

# Move the store-clock deadline of every live lease of a prefix ARGV[2] ms into the past (10,000 s: it
# expires now), in the lease hash and in the index of leased keys alike.
_EXPIRE = """
for _, name in ipairs(redis.call('KEYS', ARGV[1] .. 'lease:*')) do
  if redis.call('HEXISTS', name, 'exp') == 1 then redis.call('HINCRBY', name, 'exp', -tonumber(ARGV[2])) end
end
for _, key in ipairs(redis.call('ZRANGE', ARGV[1] .. 'live', 0, -1)) do
  redis.call('ZINCRBY', ARGV[1] .. 'live', -tonumber(ARGV[2]), key)
end
"""


def shared_server(request: pytest.FixtureRequest) -> RedisServer:
    """The session's private server (the ``private_redis`` fixture), started on first use."""
    server: RedisServer = request.getfixturevalue("private_redis")
    return server


def _open(request: pytest.FixtureRequest) -> Iterator[Any]:
    server = shared_server(request)
    prefix = f"t{uuid.uuid4().hex[:12]}:"
    store = open_store(server.url(prefix=prefix))
    yield store
    store.close()
    drop_prefix(server, prefix)


def _expire(store: Any) -> None:
    shift(store, 10_000)


def shift(store: Any, seconds: float) -> None:
    """Every live lease's deadline moves ``seconds`` into the past: that much store time passed for it."""
    with redis.Redis.from_url(store.url.partition("?")[0]) as client:
        client.eval(_EXPIRE, 0, store.prefix, int(seconds * 1000))


HARNESS = Harness("redis", _open, _expire, expired_lease_survives=True, multiprocess=True)
