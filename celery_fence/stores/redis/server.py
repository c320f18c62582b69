"""The Redis store on one Redis server: store-wide indexes (the leased keys, the due keys) and one token
counter, read and written by scripts that make the store-wide names from the prefix."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import redis

from ...lease import HistoryEvent
from ..base import past_the_range
from .connection import Connection, client_options
from .names import KeyNames
from .rows import chunks, history_events

__all__ = ["OneServer"]

T = TypeVar("T")
_PRUNED = {True: ("history",), False: ("lease", "steps", "history")}  # prune's keys: a marked, a finished key


class OneServer:
    """The layout of a store on one Redis primary (``redis://host:port/db``)."""

    def __init__(self, url: str, target: str, prefix: str, timeout: float) -> None:
        self.target = target  # the URL redis-py is given
        self.names = KeyNames(prefix, "")
        self.connection = Connection(
            url, functools.partial(redis.Redis.from_url, target, **client_options(timeout))
        )

    def script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run script ``name`` on the held connection; its first arguments: the prefix, no slot tag."""
        return self.connection.held_script(name, keys, [self.names.prefix, "", *args])

    def batches(self, items: Sequence[T], size: int, key: Callable[[T], str] = str) -> Iterable[Sequence[T]]:
        """``items`` in batches of at most ``size``, in the order given (each batch one script call)."""
        return chunks(items, size)

    def token_scope(self, key: str) -> int | None:
        return None  # one counter issues every key's tokens

    def lease_keys(self) -> list[str]:
        with self.connection.io() as client:
            return sorted(client.smembers(f"{self.names.prefix}keys"))  # type: ignore[arg-type]

    def history(self) -> list[HistoryEvent]:
        """Every key's history (found by SCAN: no global list grows), in the store-wide event order."""
        with self.connection.io() as client:
            pipe = client.pipeline(transaction=False)
            for name in sorted(client.scan_iter(match=self.names.pattern("history:{*}"), count=1000)):
                pipe.lrange(name, 0, -1)
            return history_events(line for per_key in pipe.execute() for line in per_key)

    def prune(self, age_ms: int, size: int) -> int:
        """Markers of earlier prunes past the cutoff first (they lead the batches), then finished keys, each
        leaving its marker: one script call per ``size`` keys, so no marker of this prune is dropped."""
        cutoff, due, marked = self.script("due", [], [age_ms, "done", "pruned"])
        dropped, items = 0, [*marked, *due]
        for start in range(0, len(items), size):
            batch, m = items[start : start + size], min(size, max(0, len(marked) - start))
            names = [self.names.name_of(kind, key) for i, key in enumerate(batch) for kind in _PRUNED[i < m]]
            dropped += int(self.script("prune", names, [cutoff, age_ms, m, *batch]))
        return dropped

    def advance(self, gap: int) -> int:
        floor = self.script("advance", [], [gap])
        if floor is None:  # the counter would leave the token range: nothing changed
            raise past_the_range(gap)
        return int(floor)

    def candidates(self, grace_ms: int, size: int) -> tuple[str, Iterable[Sequence[str]]]:
        """The keys that may be abandoned (the index of live keys, due by the store clock), in batches of
        ``size``, and the cutoff the ``abandoned`` script judges them by."""
        cutoff, due = self.script("due", [], [grace_ms, "live"])
        return cutoff, chunks(due, size)
