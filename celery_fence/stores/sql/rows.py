"""Shapes between the SQL store and its statements: a renew's parameters, a lease row's state."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row

from ... import codec
from ...lease import Lease, LeaseState

__all__ = ["lease_state", "renew_params"]


def renew_params(dialect: str, leases: Sequence[Lease], ttl: float) -> dict[str, Any]:
    """The ``(key, token)`` pairs in one parameter: two arrays on PostgreSQL, JSON on SQLite."""
    if dialect == "postgresql":
        return {"keys": [x.key for x in leases], "tokens": [x.token for x in leases], "ttl": ttl}
    return {"pairs": json.dumps([[x.key, x.token] for x in leases]), "ttl": ttl}


def lease_state(row: Row[Any]) -> LeaseState:
    expires_in = None if row.expires_in is None else float(row.expires_in)
    result = codec.loads(row.result)
    return LeaseState(
        row.key,
        int(row.token),
        row.owner,
        expires_in,
        bool(row.done),
        result,
        row.dead,
        int(row.recoveries),
        int(row.recovery_sent),
        run=codec.loads(row.run) if row.run else None,
    )
