"""The SQL store's recovery operations (:class:`SQLStore` holds one and hands its calls on): which runs
were abandoned, the atomic claim of one's re-send, and the record of a run that gave up before it acquired.
Kept apart so the store module stays one screenful of lease operations."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ... import codec
from ...lease import Abandoned, marking_task_id
from .driver import Connections
from .errors import RowLocked

__all__ = ["SQLRecovery"]


class SQLRecovery:
    """``abandoned``, ``recover`` and ``strand`` of :class:`celery_fence.stores.sql.store.SQLStore`."""

    def __init__(self, connections: Connections, max_value_bytes: int) -> None:
        self.connections, self.queries = connections, connections.queries
        self.max_value_bytes = max_value_bytes

    def abandoned(self, grace: float, limit: int = 100) -> list[Abandoned]:
        params = {"grace": grace, "limit": limit}
        with self.connections.one() as conn:
            rows = conn.execute(self.queries.abandoned, params).all()
        return [
            Abandoned(r.key, int(r.token), codec.loads(r.run), int(r.recoveries), int(r.recovery_sent))
            for r in rows
        ]

    def recover(self, seen: Abandoned, max_recoveries: int, reason: str = "") -> int | None:
        reason = reason or f"gave up after {max_recoveries} recoveries"
        params = {
            "key": seen.key,
            "token": seen.token,
            "seen": seen.recoveries,
            "sent": seen.sent,
            "max": max_recoveries,
            "reason": reason,
        }
        with self.connections.one() as conn:
            row = conn.execute(self.queries.recover, params).first()
        if row is None:
            return None
        return 0 if row.dead is not None else int(row.recoveries) + 1

    def strand(self, key: str, run: Mapping[str, Any] | None, reason: str) -> bool:
        params = {"key": key, "run": codec.dumps_mapping(run, self.max_value_bytes), "reason": reason,
                  "mark_task_id": marking_task_id(run)}
        try:
            with self.connections.one() as conn:
                return conn.execute(self.queries.strand, params).first() is not None
        except RowLocked:  # a live run's open transaction holds the row: a leased key
            return False
