"""The memory store's row: what it keeps per key, how a row reads as a ``LeaseState``, and when it counts as
abandoned (the same rules the server stores state in SQL and Lua)."""

from __future__ import annotations

from dataclasses import dataclass

from .. import codec
from ..lease import LeaseState, recovery_backoff

__all__ = ["Row", "is_abandoned", "lease_state"]


@dataclass
class Row:
    token: int
    owner: str | None
    expires_at: float | None  # None: free (released, done or never held)
    done: bool = False
    result: str | None = None
    run: str | None = None
    finished_at: float | None = None
    dead: str | None = None
    recoveries: int = 0  # recovery copies that started (and, once abandoned again, were lost)
    sent: int = 0  # recovery copies sent that have not started: a queued copy is not a failed one
    recovered_at: float | None = None


def is_abandoned(row: Row, now: float, grace: float) -> bool:
    expired = row.expires_at is not None and row.expires_at <= now - grace
    wait = grace * recovery_backoff(row.sent)
    quiet = row.recovered_at is None or row.recovered_at <= now - wait
    return expired and quiet and not row.done and row.dead is None


def lease_state(key: str, row: Row, now: float) -> LeaseState:
    expires_in = None if row.expires_at is None else row.expires_at - now
    result = codec.loads(row.result)
    run = codec.loads(row.run) if row.run else None
    counts = row.recoveries, row.sent
    return LeaseState(key, row.token, row.owner, expires_in, row.done, result, row.dead, *counts, run=run)
