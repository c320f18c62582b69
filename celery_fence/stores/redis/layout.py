"""The Redis store's layout, chosen once when the store opens: one server (``server``) or a Redis Cluster
(``cluster``). It holds what differs between them (the client, the key names' hash tag, where tokens come
from, how keys are batched and listed), so the store's operations never ask which one they run on."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from ...lease import HistoryEvent
from .cluster import Cluster
from .connection import Connection
from .names import KeyNames
from .server import OneServer

__all__ = ["Layout", "open_layout"]

T = TypeVar("T")


class Layout(Protocol):
    names: KeyNames
    connection: Connection

    def script(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run Lua script ``name`` on the keys' names ``keys`` (of one key, or of one slot)."""

    def batches(self, items: Sequence[T], size: int, key: Callable[[T], str] = str) -> Iterable[Sequence[T]]:
        """``items`` (of the keys ``key`` gives) in batches of at most ``size`` that one script call takes."""

    def token_scope(self, key: str) -> int | None:
        """The keys whose tokens one counter issues: all (None), or a slot's."""

    def lease_keys(self) -> list[str]:
        """Every key with a lease hash, sorted."""

    def history(self) -> list[HistoryEvent]:
        """Every key's history, in event order."""

    def prune(self, age_ms: int, size: int) -> int:
        """Drop finished keys and markers older than ``age_ms``; how many keys went."""

    def advance(self, gap: int) -> int:
        """Move the token counters ``gap`` past the highest; the floor of the tokens issued after."""

    def candidates(self, grace_ms: int, size: int) -> tuple[str, Iterable[Sequence[str]]]:
        """The keys that may be abandoned, in batches, and the cutoff the ``abandoned`` script takes."""


def open_layout(
    url: str, target: str, nodes: list[tuple[str, int]] | None, prefix: str, timeout: float
) -> Layout:
    """``target`` and ``nodes`` as ``boundary.split_url`` gives them (no nodes: one server)."""
    return (
        OneServer(url, target, prefix, timeout)
        if nodes is None
        else Cluster(url, target, nodes, prefix, timeout)
    )
