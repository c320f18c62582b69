"""``fenced_update``: a token-guarded ``UPDATE`` for a user table with a ``fence_token`` column.

The resource itself checks the token, so it works whichever store holds the lease (Redis, etcd, another
database), but it is weaker than ``self.fence.transaction()``: it forbids a stale write *after* a newer
one, not a stale write that lands before the new holder's first write::

    t0  run A holds token 7            t2  A (paused) wakes, updates with 7: fence_token 5 <= 7: accepted
    t1  lease expires, B takes token 8  t3  B updates with 8: 7 <= 8: accepted; A's later writes are refused

In the same-database transaction the lease row itself is checked and locked, so A's write at t2 is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnElement, Connection, Table, and_, update

from .errors import InvalidArgument, StaleToken

__all__ = ["fenced_update"]


def fenced_update(
    conn: Connection, table: Table, values: Mapping[str, Any], where: ColumnElement[bool], token: int
) -> int:
    """``UPDATE table SET values, fence_token = token WHERE where AND fence_token <= token``.

    Returns the number of rows updated; zero rows matched raises :class:`StaleToken` (a newer token
    already wrote them, or ``where`` matched nothing).
    """
    if "fence_token" not in table.c:
        raise InvalidArgument(f"table {table.name!r} needs a 'fence_token' BIGINT column for fenced_update")
    if isinstance(token, bool) or not isinstance(token, int) or token <= 0:
        raise InvalidArgument(f"token must be a positive int, got {token!r}")
    column = table.c.fence_token
    guard = and_(where, (column <= token) | column.is_(None))
    result = conn.execute(update(table).where(guard).values({**values, "fence_token": token}))
    if result.rowcount == 0:
        raise StaleToken(table.name, token, None, f"update of {table.name}")
    return int(result.rowcount)
