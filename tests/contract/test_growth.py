"""Growth is bounded: ``prune`` drops the history of the keys it drops, on every store,
and a store's raw size stays flat across many acquire / complete / prune cycles. A
pruned key leaves one ``pruned`` marker, which a later prune drops once it is older than the age: the markers
of one cycle at most."""

from __future__ import annotations

from typing import Any

import redis
from sqlalchemy import text

from celery_fence.stores.etcd.gateway import get
from celery_fence.testing.contract.checks import TTL

from ..servers.redis_cluster import primary_clients

CYCLES, KEYS_PER_CYCLE = 5, 20


def footprint(store: Any, name: str) -> int:
    """Everything the store keeps, counted at the store itself (rows, list items, keys)."""
    if name == "memory":
        return len(store._rows) + len(store._history) + sum(map(len, store._steps.values()))
    if name in ("sqlite", "postgresql", "postgresql-ha"):
        with store.engine.connect() as conn:
            tables = ("fence_leases", "fence_history", "fence_steps")
            return sum(int(conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()) for t in tables)
    if name == "redis":
        with redis.Redis.from_url(store.url.partition("?")[0], decode_responses=True) as client:
            return redis_footprint(client, store.prefix)
    if name == "redis_cluster":  # every primary's share, but for the slots' token counters (2 per slot at
        return cluster_footprint(store)  # most, 32,768 in all: bounded, and never pruned)
    assert name in ("etcd", "etcd_cluster")
    return len(store.space.read([get(store.prefix, prefix=True, keys_only=True)]).kvs(1))


def redis_footprint(client: Any, prefix: str, skip: tuple[str, ...] = ()) -> int:
    size = 0
    for key in client.scan_iter(match=f"{prefix}*"):
        if key.startswith(skip):
            continue
        kind = client.type(key)
        length = {"list": client.llen, "hash": client.hlen, "set": client.scard, "zset": client.zcard}
        size += int(length[kind](key)) if kind in length else 1
    return size


def cluster_footprint(store: Any) -> int:
    counters = (f"{store.prefix}counter:{{", f"{store.prefix}high:{{")
    size = 0
    for client in primary_clients(store.url):
        with client:
            size += redis_footprint(client, store.prefix, counters)
    return size


def _cycle(store: Any, prefix: str) -> None:
    for i in range(KEYS_PER_CYCLE):
        lease = store.acquire(f"{prefix}-{i}", "w", TTL)
        store.save_step(lease, "s", i)
        store.complete(lease, i)
    assert store.prune(0.0) == KEYS_PER_CYCLE


def test_prune_drops_the_history_of_the_keys_it_drops(store: Any) -> None:
    for key in ("a", "b"):
        lease = store.acquire(key, "w", TTL)
        store.save_step(lease, "s", 1)
        store.complete(lease, 1)
    live = store.acquire("live", "w", TTL)
    assert store.prune(0.0) == 2
    for key in ("a", "b"):  # one marker takes the place of the key's history
        assert [(e.event, e.owner) for e in store.history(key)] == [("pruned", None)]
    assert {e.key for e in store.history() if e.event != "pruned"} == {"live"}
    assert store.renew([live], TTL) == []
    assert store.acquire("a", "w", TTL).token > live.token  # tokens never go back


def test_size_stays_flat_across_cycles(store: Any, harness: Any) -> None:
    live = store.acquire("live", "w", TTL)  # a key that stays: its own history is not pruned
    _cycle(store, "warm")
    before = footprint(store, harness.name)
    for n in range(CYCLES):
        _cycle(store, f"c{n}")
    assert footprint(store, harness.name) <= before
    store.complete(live, "done")
