"""Shapes between the Redis store and its scripts' replies: a lease hash's state, the history lines."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from .. import codec
from ..lease import HistoryEvent, LeaseState

__all__ = ["history_events", "lease_state"]


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


def _event(e: dict[str, Any]) -> HistoryEvent:
    return HistoryEvent(float(e["at"]), e["event"], int(e["token"]), e["owner"], e["detail"], key=e["key"])
