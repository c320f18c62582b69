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
from typing import Any, TypeVar

from redis.cluster import ClusterNode, RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from ...lease import MAX_TOKEN, HistoryEvent
from ..base import past_the_range
from .connection import Connection, client_options
from .names import KeyNames
from .rows import merged_events, source

__all__ = ["Cluster", "slot_of", "slot_tag"]

T = TypeVar("T")


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


def _new_client(target: str, nodes: list[tuple[str, int]], options: dict[str, Any]) -> Any:
    """A cluster client that knows every node of the URL (any one that answers will do). MOVED, ASK and
    TRYAGAIN are followed (the command did not run); nothing else is retried. The seeds are made anew for
    each client: a client keeps its connections in them."""
    seeds = [ClusterNode(host, port) for host, port in nodes]  # type: ignore[no-untyped-call]
    return RedisCluster.from_url(target, startup_nodes=seeds, **options)


class Cluster:
    """The layout of a store on a Redis Cluster (``?cluster=true``), every key's names in its own slot."""

    def __init__(
        self, url: str, target: str, nodes: list[tuple[str, int]], prefix: str, timeout: float
    ) -> None:
        self.target, self.nodes = target, nodes  # redis-py is given the first node, all of them as seeds
        self.names = KeyNames(prefix, "=")  # '{=key}': a hash tag is never empty
        self.connection = Connection(
            url, functools.partial(_new_client, target, nodes, client_options(timeout))
        )

    def script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name``; its first arguments: the prefix and the tag of the slot of its keys. The
        cluster client routes each call to the slot's primary: no connection of its own is held."""
        return self.connection.script(name, keys, [self.names.prefix, slot_tag(keys[0]), *args])

    def batches(self, items: Sequence[T], size: int, key: Callable[[T], str] = str) -> Iterator[list[T]]:
        """``items`` by slot of their keys, in batches of at most ``size`` (each batch one script call)."""
        return (
            group[i : i + size] for group in self._by_slot(items, key) for i in range(0, len(group), size)
        )

    def token_scope(self, key: str) -> int | None:
        return slot_of(self.names.name_of("lease", key))  # each slot's counter issues its keys' tokens

    def lease_keys(self) -> list[str]:
        return self._keys_of("lease")

    def history(self) -> list[HistoryEvent]:
        """Every key's history, merged by the store clock (each key's own lines stay in their order)."""
        per_key: list[list[str]] = []
        with self.connection.io() as client:
            for key in self._keys_of("history"):
                per_key.append(client.lrange(self.names.name_of("history", key), 0, -1))  # type: ignore[arg-type]
        return merged_events(per_key)

    def prune(self, age_ms: int, size: int) -> int:
        """Every key with a history is a candidate, both for its marker and as finished: the script checks.
        One script call per slot (``size`` is one server's batch)."""
        dropped = 0
        for group in self._by_slot(self._keys_of("history"), str):
            names = [self.names.name_of("history", key) for key in group]
            names += [
                self.names.name_of(kind, key) for key in group for kind in ("lease", "steps", "history")
            ]
            dropped += int(self.script("prune", names, ["", age_ms, len(group), *group, *group]))
        return dropped

    def advance(self, gap: int) -> int:
        """Every slot's counter to at least the highest counter of any slot plus ``gap`` (so every token
        issued after it returns is above what it returns); first a check that none would leave the token
        range, so that a refused advance changes nothing. Pipelined: one batch per primary to read, one to
        write."""
        prefix = self.names.prefix
        counters = [f"{prefix}counter:{{{tag}}}" for tag in _tags()]
        with self.connection.io() as client:
            pipe = client.pipeline()
            for name in counters:
                pipe.get(name)
            highest = max(int(value or 0) for value in pipe.execute())
            if highest + gap > MAX_TOKEN:
                raise past_the_range(gap, highest)
            sha = client.script_load(source("advance"))  # on every primary
            pipe = client.pipeline()
            for tag, name in zip(_tags(), counters, strict=True):  # redis-py blocks pipe.evalsha on a cluster
                pipe.execute_command("EVALSHA", sha, 1, name, prefix, tag, gap, highest + gap)  # type: ignore[no-untyped-call]
            replies = pipe.execute()
        if None in replies:  # raised by concurrent acquires past the check: the other slots keep the gap
            raise past_the_range(gap)
        return max(int(reply) for reply in replies)

    def candidates(self, grace_ms: int, size: int) -> tuple[str, Iterable[Sequence[str]]]:
        """No index: every leased key, by slot in batches of ``size``; no cutoff (each slot's script judges
        by its own clock)."""
        return "", self.batches(self._keys_of("lease"), size)

    def _by_slot(self, items: Iterable[T], key: Callable[[T], str]) -> list[list[T]]:
        """``items`` grouped by the slot of their key's names, each group in the order given."""
        groups: defaultdict[int, list[T]] = defaultdict(list)
        for item in items:
            groups[slot_of(self.names.name_of("lease", key(item)))].append(item)
        return list(groups.values())

    def _keys_of(self, kind: str) -> list[str]:
        """Every key that has a name of ``kind``, found by SCAN on every primary, sorted."""
        start = len(self.names.prefix) + len(kind) + 3  # '<prefix><kind>:{=' ... '}'
        with self.connection.io() as client:
            names = client.scan_iter(match=self.names.pattern(f"{kind}:{{=*}}"), count=1000)
            return sorted({name[start:-1] for name in names})
