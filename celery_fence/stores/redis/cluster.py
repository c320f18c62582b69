"""The Redis store on a Redis Cluster (``?cluster=true``): what was store-wide, done slot by slot.

A script's keys must hash to one slot, so in a cluster nothing is store-wide. Every name of a key carries
the hash tag ``{=key}`` (``=`` keeps the tag non-empty for a key that starts with ``}``). Each slot has its
own token counter and witnessed high token (``counter:{<tag>}``, ``high:{<tag>}``, with a tag found for that
slot), which prune never touches: tokens are monotonic and unique per slot, hence per key, and never reused
after prune; two keys of different slots may hold the same token. What they cost stays bounded: at most two
small strings per slot (32,768 in all).

No index of leased, finished or pruned keys can be kept (it would have to be in every slot): the listings
(``leases``, every key's ``history``, ``abandoned``, ``prune``) SCAN every primary for the names of one kind
and then run one script per slot they found: each costs a pass over the whole keyspace (O(all keys)),
where one server reads an index. ``advance`` reads and writes all 16,384 slot counters (two pipelines).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, TypeVar

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from ...lease import MAX_TOKEN, HistoryEvent, LeaseState
from ..validation import past_the_range
from .rows import merged_events, source

__all__ = [
    "SlotStore", "advance", "by_slot", "client", "history", "in_batches", "keys_of", "pattern", "prune",
    "scan_states", "slot_tag",
]

T = TypeVar("T")


class SlotStore(Protocol):
    """What the slot-by-slot operations need of their store (``RedisStore``, whose module imports this one:
    typed by what it offers, so the store's module stays out of this one's imports)."""

    prefix: str

    def _k(self, kind: str, key: str) -> str: ...

    def _io(self) -> AbstractContextManager[redis.Redis]: ...

    def _script(self, name: str, keys: list[str], args: list[Any]) -> Any: ...

    def _slot_states(self, keys: Sequence[str]) -> list[LeaseState | None]: ...


def client(nodes: list[tuple[str, int]]) -> Any:
    """A maker of cluster clients that knows every node of the URL (any one that answers will do).
    MOVED, ASK and TRYAGAIN are followed (the command did not run); nothing else is retried."""
    seeds = [ClusterNode(host, port) for host, port in nodes]  # type: ignore[no-untyped-call]
    return functools.partial(RedisCluster.from_url, startup_nodes=seeds)


@functools.cache
def _tags() -> tuple[str, ...]:
    """For each slot, a short string that hashes to it (found once per process, about 0.1 s)."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < REDIS_CLUSTER_HASH_SLOTS:
        found.setdefault(key_slot(str(n).encode()), str(n))
        n += 1
    return tuple(found[slot] for slot in range(REDIS_CLUSTER_HASH_SLOTS))


def slot_of(name: str) -> int:
    return key_slot(name.encode())


def slot_tag(name: str) -> str:
    """The tag of the slot that ``name`` (a key's name, with its hash tag) hashes to."""
    return _tags()[key_slot(name.encode())]


def by_slot(store: SlotStore, items: Iterable[T], key: Callable[[T], str] = str) -> list[list[T]]:
    """``items`` grouped by the slot of their key's names, each group in the order given."""
    groups: defaultdict[int, list[T]] = defaultdict(list)
    for item in items:
        groups[key_slot(store._k("lease", key(item)).encode())].append(item)
    return list(groups.values())


def in_batches(store: SlotStore, keys: Iterable[str], size: int) -> Iterator[list[str]]:
    """``keys`` by slot, in batches of at most ``size`` (each batch one script call)."""
    return (group[i : i + size] for group in by_slot(store, keys) for i in range(0, len(group), size))


def pattern(prefix: str, rest: str) -> str:
    """A SCAN pattern: ``prefix`` matched as it is, then ``rest``."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in prefix) + rest


def keys_of(store: SlotStore, kind: str) -> list[str]:
    """Every key that has a name of ``kind``, found by SCAN on every primary, sorted."""
    start = len(store.prefix) + len(kind) + 3  # '<prefix><kind>:{=' ... '}'
    with store._io() as client:
        names = client.scan_iter(match=pattern(store.prefix, f"{kind}:{{=*}}"), count=1000)
        return sorted({name[start:-1] for name in names})


def history(store: SlotStore) -> list[HistoryEvent]:
    """Every key's history, merged by the store clock (each key's own lines stay in their order)."""
    per_key: list[list[str]] = []
    with store._io() as client:
        for key in keys_of(store, "history"):
            per_key.append(client.lrange(store._k("history", key), 0, -1))  # type: ignore[arg-type]
    return merged_events(per_key)


def prune(store: SlotStore, age_ms: int) -> int:
    """Every key with a history is a candidate, both for its marker and as finished: the script checks."""
    dropped = 0
    for group in by_slot(store, keys_of(store, "history")):
        names = [store._k("history", key) for key in group]
        names += [store._k(kind, key) for key in group for kind in ("lease", "steps", "history")]
        dropped += int(store._script("prune", names, ["", age_ms, len(group), *group, *group]))
    return dropped


def advance(store: SlotStore, gap: int) -> int:
    """Every slot's counter to at least the highest counter of any slot plus ``gap`` (so every token issued
    after it returns is above what it returns); first a check that none would leave the token range, so
    that a refused advance changes nothing. Pipelined: one batch per primary to read, one to write."""
    counters = [f"{store.prefix}counter:{{{tag}}}" for tag in _tags()]
    with store._io() as client:
        pipe = client.pipeline()
        for name in counters:
            pipe.get(name)
        highest = max(int(value or 0) for value in pipe.execute())
        if highest + gap > MAX_TOKEN:
            raise past_the_range(gap, highest)
        sha = client.script_load(source("advance"))  # on every primary
        pipe = client.pipeline()
        for tag, name in zip(_tags(), counters, strict=True):  # redis-py blocks pipe.evalsha on a cluster
            pipe.execute_command("EVALSHA", sha, 1, name, store.prefix, tag, gap, highest + gap)  # type: ignore[no-untyped-call]
        replies = pipe.execute()
    if None in replies:  # raised by concurrent acquires past the check: the other slots keep the gap
        raise past_the_range(gap)
    return max(int(reply) for reply in replies)


def scan_states(store: SlotStore, keys: Sequence[str]) -> list[Any]:
    """``state`` for keys of any slots: one script per slot, results in the order of ``keys``."""
    rows: dict[str, Any] = {}
    for group in by_slot(store, keys):
        for key, state in zip(group, store._slot_states(group), strict=True):
            rows[key] = state
    return [rows[key] for key in keys if rows[key] is not None]
