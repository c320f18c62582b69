"""What the SQL store's statements take and give back (their text is ``queries``).

:class:`LeaseStatements` holds the statements of a fenced write on the lease row, shared by the store's
operations (``store``) and a run's transaction (``run``): the guard that checks and locks the row, the
recorded refusal, and the parameters of an event, a completion and a step. The store creates one and hands
it to each run's transaction, so neither reaches into the other. The store's own shapes follow it: a
renew's parameters and a lease row's state.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from sqlalchemy import Connection, Row

from ... import codec
from ...errors import AlreadyDone, FailedBefore, LeaseHeld, StaleToken
from ...lease import Lease, LeaseState
from .driver import Connections, translate_errors
from .errors import Unchanged, safe_url

if TYPE_CHECKING:
    from .one_trip import OneTrips

__all__ = ["LeaseStatements", "lease_state", "renew_params"]

_FIRST_OR_LAST = ("open_guard", "open_read", "complete_or_fail", "claim")  # sent with BEGIN or with COMMIT


class LeaseStatements:
    """The guard, the refusal and the parameters of the writes on one store's lease rows."""

    def __init__(self, connections: Connections, max_value_bytes: int) -> None:
        self._connections = connections
        self.url, self.queries = connections.url, connections.queries
        self.max_value_bytes = max_value_bytes
        # PostgreSQL sends a transaction's first statement with its BEGIN, and its last with its COMMIT, in
        # one round trip each; SQLite is in the process: a statement is a call.
        self._one_trips: OneTrips | None = None
        if connections.dialect == "postgresql":
            from .one_trip import OneTrips  # psycopg: the postgres extra

            self._one_trips = OneTrips(self.url, self.queries, connections.engine.dialect, _FIRST_OR_LAST)

    def first(self, conn: Connection, name: str, params: Mapping[str, Any], with_begin: bool = True) -> Any:
        """The first row (or ``None``) of statement ``name``, the first of ``conn``'s transaction: sent with
        its ``BEGIN`` unless ``with_begin`` is false (a transaction someone else began: Django's)."""
        if self._one_trips is None or not with_begin:
            return conn.execute(getattr(self.queries, name), params).first()
        rows = self._one_trips.send(conn, name, params, begin=True)
        return rows[0] if rows else None

    def last(self, conn: Connection, tx: Any, name: str, params: Mapping[str, Any]) -> Any:
        """The first row of statement ``name``, then the commit of ``tx`` (``conn``'s root transaction):
        ``Unchanged`` (nothing committed) when the statement changed no row."""
        if self._one_trips is None:
            row = conn.execute(getattr(self.queries, name), params).first()
            if row is None:
                raise Unchanged(f"the {name} of key {params['key']!r} changed no row")
            tx.commit()
            return row
        rows = self._one_trips.send(conn, name, params, commit=True)
        tx.commit()  # SQLAlchemy's own bookkeeping: the driver has committed, so nothing is sent
        return rows[0]

    @property
    def safe_url(self) -> str:
        return safe_url(self.url)

    def connect(self) -> Connection:
        """A connection for an explicit transaction that outlives one call (a run's)."""
        return self._connections.engine.connect()

    def guard(
        self, conn: Connection, lease: Lease, event: str, detail: str | None, idle_ms: int | None = None,
        with_begin: bool = False,
    ) -> bool:
        """Check and lock the lease row for the rest of ``conn``'s transaction. ``idle_ms``: the guard opens
        a run's transaction, which a server that can (PostgreSQL) ends if it idles that long; ``with_begin``:
        it is the first statement of ``conn``'s transaction, sent with its ``BEGIN`` (:meth:`first`)."""
        params = {"key": lease.key, "token": lease.token, "event": event, "detail": detail}
        if idle_ms is None:
            return conn.execute(self.queries.guard, params).first() is not None
        params["idle_ms"] = idle_ms
        return self.first(conn, "open_guard", params, with_begin) is not None

    def open_read(
        self, conn: Connection, key: str, ttl: float, with_begin: bool, task_id: str | None
    ) -> None:
        """A fenced commit's first statement: read the key in ``conn``'s transaction, and raise
        ``AlreadyDone`` or ``LeaseHeld`` if it is finished or leased, ``FailedBefore`` if a run of
        ``task_id`` marked it failed. A paused run blocks a copy's claim (its row lock) for one ttl at most
        where the server can end it (PostgreSQL), as a lease mode run blocks a takeover. ``with_begin``: as
        for :meth:`guard`."""
        row = self.first(conn, "open_read", {"key": key, "idle_ms": max(1, int(ttl * 1000))}, with_begin)
        if row is None or row.key is None:
            return
        state = lease_state(row)
        if state.done:
            raise AlreadyDone(state.key, state.token, state.result)
        if state.expires_in is not None and state.expires_in > 0:
            raise LeaseHeld(state.key, state.owner, state.expires_in)
        if state.dead is not None and task_id is not None and (state.run or {}).get("id") == task_id:
            raise FailedBefore(state.key, state.token, state.dead)

    def refuse(self, lease: Lease, what: str) -> NoReturn:
        """Record the refusal of ``what`` in its own statement, then raise ``StaleToken`` with the current
        token."""
        with self._connections.one() as conn:
            conn.execute(self.queries.log, self.event_params(lease, "refused", detail=what))
            current = conn.execute(self.queries.current_token, {"key": lease.key}).scalar()
            raise StaleToken(
                lease.key, lease.token, None if current is None else int(current), what, recorded=True
            )

    @staticmethod
    def event_params(lease: Lease, event: str, **extra: Any) -> dict[str, Any]:
        params = {"key": lease.key, "token": lease.token, "owner": lease.owner, "event": event}
        return {"detail": None, **params, **extra}

    def complete_params(self, lease: Lease, result: Any) -> dict[str, Any]:
        """The completion's: ``result`` encoded (``NotSerializable`` before any statement)."""
        return self.event_params(lease, "complete", result=codec.dumps(result, self.max_value_bytes))

    def claim_params(self, lease: Lease, result: Any, run: Mapping[str, Any] | None) -> dict[str, Any]:
        """A fenced commit's claim: ``result`` and ``run`` encoded (``NotSerializable`` before any
        statement)."""
        result_text = codec.dumps(result, self.max_value_bytes)
        run_text = codec.dumps_mapping(run, self.max_value_bytes)
        params = {"key": lease.key, "owner": lease.owner, "result": result_text, "run": run_text}
        return {**params, "task_id": (run or {}).get("id")}

    def claim(self, conn: Connection, lease: Lease, result: Any, run: Mapping[str, Any] | None) -> int:
        """Claim the key on ``conn`` (autocommit: one statement): its new token, or ``StaleToken`` (recorded)
        when the key is done or leased."""
        params = self.claim_params(lease, result, run)
        try:
            with translate_errors(self.url):  # PostgreSQL's refusal is an error (FE002): Unchanged
                row = conn.execute(self.queries.claim, params).first()
        except Unchanged:
            row = None
        if row is None:
            self.refuse(lease, "commit")
        return int(row.token)

    def step_params(self, lease: Lease, name: str, value: Any) -> dict[str, Any]:
        """Step ``name``'s record: ``value`` encoded (``NotSerializable`` before any statement)."""
        value_text = codec.dumps(value, self.max_value_bytes)
        return {"key": lease.key, "name": name, "token": lease.token, "value": value_text}


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
