"""Shapes between the Redis store and its scripts: the arguments (a lease, milliseconds, batches) and the
replies (a lease hash's state, the history lines, a refusal)."""

from __future__ import annotations

import functools
import heapq
import importlib.resources
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from ... import codec, errors
from ...lease import HistoryEvent, Lease, LeaseState

__all__ = ["chunks", "history_events", "lease_state", "merged_events", "raise_stale", "source", "to_ms",
           "who"]

T = TypeVar("T")
MAX_INT = 2**52  # ttls and ages (ms) stay well inside Lua's exact integers


@functools.cache
def source(name: str) -> str:
    """Script ``name``: ``lua/<name>.lua`` with ``lua/common.lua`` prepended."""
    lua = importlib.resources.files(__package__) / "lua"
    return (lua / "common.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()


def lease_state(key: str, now: int, row: list[str | None]) -> LeaseState:
    """The state of ``key`` from its lease hash fields (``state.lua``) and the store clock in ms."""
    token, owner, exp, done, result, dead, rec, sent, run = row
    expires_in = None if exp is None else (int(exp) - now) / 1000
    value, counts = codec.loads(result), (int(rec or 0), int(sent or 0))
    recorded = codec.loads(run) if run else None
    return LeaseState(
        key, int(token or 0), owner, expires_in, done == "1", value, dead, *counts, run=recorded
    )


def history_events(lines: Iterable[str]) -> list[HistoryEvent]:
    """History lines (JSON objects of strings; no owner: none) in the store-wide event order."""
    events = [{"owner": None, "detail": None, "n": "0", **json.loads(line)} for line in lines]
    events.sort(key=lambda e: (int(e["n"]), float(e["at"])))
    return [_event(e) for e in events]


def merged_events(per_key: Iterable[Iterable[str]]) -> list[HistoryEvent]:
    """Each key's history lines (a cluster numbers none store-wide) merged by the store clock; a key's own
    lines keep their order even where a failover moved the clock back."""
    parsed = ([{"owner": None, "detail": None, **json.loads(line)} for line in lines] for lines in per_key)
    return [_event(e) for e in heapq.merge(*parsed, key=lambda e: float(e["at"]))]


def _event(e: dict[str, Any]) -> HistoryEvent:
    return HistoryEvent(float(e["at"]), e["event"], int(e["token"]), e["owner"], e["detail"], key=e["key"])


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    return (items[start : start + size] for start in range(0, len(items), size))


def who(lease: Lease) -> list[Any]:
    return [lease.key, lease.token, lease.owner]


def raise_stale(lease: Lease, reply: list[Any], what: str) -> None:
    if reply[0] == "stale":
        current = None if reply[1] is None else int(reply[1])
        raise errors.StaleToken(lease.key, lease.token, current, what, recorded=True)


def to_ms(seconds: float, what: str) -> int:
    if seconds * 1000 > MAX_INT:
        raise errors.InvalidArgument(f"{what} of {seconds}s is more than the Redis store can hold")
    return max(1, round(seconds * 1000)) if what == "ttl" else int(seconds * 1000)
