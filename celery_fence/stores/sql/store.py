"""The SQL store: PostgreSQL (psycopg 3) and SQLite, on SQLAlchemy Core.

acquire, renew (of any number of leases), complete and release are one statement each, run in autocommit
so one statement is one round trip; the audit trail is written inside that same statement.
Those four run on the driver's cursor, compiled once (``driver``); the rest goes through SQLAlchemy.
Multi-statement work (fenced transactions, steps, refusals) runs in one short explicit transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection

from ... import codec
from ...errors import AlreadyDone, InvalidArgument, LeaseHeld, StaleToken
from ...lease import HistoryEvent, Lease, LeaseState
from ..validation import past_the_range
from .connections import Connections
from .engine import SessionLimits
from .errors import RowLocked, safe_url, translate_errors
from .files import check_sql_store_url, sql_capabilities
from .recovery import SQLRecovery
from .rows import lease_state, renew_params
from .run import RunTransaction

__all__ = ["SQLStore"]

log = logging.getLogger(__name__)
PRUNED = {"event": "pruned", "owner": None, "detail": None}  # the marker a pruned key's history becomes


class SQLStore(SQLRecovery):
    """Lease store on PostgreSQL or SQLite; see :class:`celery_fence.stores.base.Store`."""

    max_value_bytes = codec.MAX_VALUE_BYTES  # far below a TEXT value's limit on either database
    capabilities_for = staticmethod(sql_capabilities)
    check_url = staticmethod(check_sql_store_url)

    def __init__(self, url: str, limits: SessionLimits | None = None) -> None:
        self.url, self.capabilities = url, sql_capabilities(url)
        self.limits = limits or SessionLimits()
        self.db = Connections(url, self.limits)
        self.engine, self.autocommit_engine = self.db.engine, self.db.autocommit_engine
        self.dialect, self.q = self.db.dialect, self.db.queries

    def migrate(self) -> None:
        self.db.migrate()

    # -- the lease operations --

    def acquire(self, key: str, owner: str, ttl: float, run: Mapping[str, Any] | None = None) -> Lease:
        run_text = codec.dumps_mapping(run, self.max_value_bytes)
        params = {"key": key, "owner": owner, "ttl": ttl, "run": run_text}
        try:
            rows = self.db.hot("acquire", params)
        except RowLocked:  # its holder's open transaction locks it: a live lease
            rows = []
        if rows:  # the old row's expiry is not visible to RETURNING: expired_for stays unknown here
            return Lease(key, int(rows[0][0]), owner, taken_over=rows[0][1] == "takeover")
        with self.db.one() as conn:  # held or done: say by whom (not the hot path)
            state = conn.execute(self.q.state, {"key": key}).first()
        if state is None:  # the row vanished between the two statements (pruned): try once more
            return self.acquire(key, owner, ttl, run)
        if state.done:
            raise AlreadyDone(key, int(state.token), codec.loads(state.result))
        # Our own acquire committed but its reply was lost. Only a live lease can be that: this read comes
        # after the statement, which may have met the row locked (NOWAIT), and a released or expired lease
        # of this owner string is an earlier acquisition's, whose token must never be returned again.
        if state.owner == owner and state.expires_in is not None and state.expires_in > 0:
            return Lease(key, int(state.token), owner)
        raise LeaseHeld(key, state.owner, state.expires_in)

    def renew(self, leases: Sequence[Lease], ttl: float) -> list[Lease]:
        if not leases:
            return []
        kept = {
            (key, int(token)) for key, token in self.db.hot("renew", renew_params(self.dialect, leases, ttl))
        }
        lost = [lease for lease in leases if (lease.key, lease.token) not in kept]
        if lost:
            with self.db.one() as conn:
                failed = [self.event_params(lease, "renew-failed") for lease in lost]
                conn.execute(self.q.log_renew_failed, failed)
        return lost

    def complete(self, lease: Lease, result: Any) -> None:
        params = self.event_params(lease, "complete", result=codec.dumps(result, self.max_value_bytes))
        if not self.db.hot("complete", params):
            self.refuse_now(lease, "complete")

    def release(self, lease: Lease) -> None:
        self.db.hot("release", {"key": lease.key, "token": lease.token})

    @property
    def safe_url(self) -> str:
        return safe_url(self.url)

    def begin_run(self, lease: Lease, ttl: float) -> RunTransaction:
        """Open the run's transaction: the lease row checked and locked until it commits with the
        completion (``RunTransaction.complete``) or rolls back (``close``). ``StaleToken``: not current."""
        self.db.ready()
        return RunTransaction(self, lease, ttl)

    @contextmanager
    def transaction(self, lease: Lease, step: str | None = None) -> Iterator[Connection]:
        """A transaction in which the lease row is checked and locked until commit (see the protocol): a
        :class:`RunTransaction` of one block that commits when the block ends (an atomic step's)."""
        self.db.ready()
        run_tx = RunTransaction(self, lease, self.limits.idle_in_transaction, step)
        try:
            with run_tx.block() as conn:
                yield conn
            run_tx.commit()
        finally:
            run_tx.close()  # rolls back whatever was not committed

    def save_step(self, lease: Lease, name: str, value: Any) -> None:
        value_text = codec.dumps(value, self.max_value_bytes)
        params = {"key": lease.key, "name": name, "token": lease.token, "value": value_text}
        with self.db.transaction() as conn:
            current = self.guard(conn, lease, "step", name)
            if current:
                conn.execute(self.q.insert_step, params)
        if not current:
            self.refuse_now(lease, f"step {name}")

    def insert_step(self, conn: Connection, lease: Lease, name: str, value: Any) -> None:
        """Record step ``name`` inside an open :meth:`transaction` (opened with ``step=name``)."""
        value_text = codec.dumps(value, self.max_value_bytes)
        params = {"key": lease.key, "name": name, "token": lease.token, "value": value_text}
        with translate_errors(self.url):
            conn.execute(self.q.insert_step, params)

    def steps(self, key: str) -> dict[str, Any]:
        with self.db.one() as conn:
            return {r.name: codec.loads(r.value) for r in conn.execute(self.q.steps, {"key": key})}

    def refuse(self, lease: Lease, what: str) -> None:
        with self.db.one() as conn:
            conn.execute(self.q.log, self.event_params(lease, "refused", detail=what))

    # -- reading --

    def get(self, key: str) -> LeaseState | None:
        with self.db.one() as conn:
            row = conn.execute(self.q.state, {"key": key}).first()
        return None if row is None else lease_state(row)

    def history(self, key: str | None = None) -> list[HistoryEvent]:
        query, params = (self.q.history_all, {}) if key is None else (self.q.history, {"key": key})
        with self.db.one() as conn:
            rows = conn.execute(query, params).all()
        return [HistoryEvent(r.at, r.event, int(r.token), r.owner, r.detail, key=r.key) for r in rows]

    def leases(self) -> list[LeaseState]:
        with self.db.one() as conn:
            return [lease_state(row) for row in conn.execute(self.q.leases)]

    # -- administration --

    def force_release(self, key: str) -> int:
        with self.db.one() as conn:
            token = conn.execute(self.q.force_release, {"key": key}).scalar()
        if token is None:
            raise InvalidArgument(f"no lease for key {key!r}")
        return int(token)

    def prune(self, older_than: float) -> int:
        age = {"age": older_than}
        # Steps and history go with the keys; one marker takes the history's place.
        with self.db.transaction() as conn:
            conn.execute(self.q.prune_markers, age)  # earlier prunes' markers past the cutoff go first
            keys = [{"key": k, "token": t, **PRUNED} for k, t in conn.execute(self.q.prune, age).all()]
            if keys:
                conn.execute(self.q.prune_steps, keys)
                conn.execute(self.q.prune_history, keys)
                conn.execute(self.q.log, keys)
            return len(keys)

    def advance(self, gap: int) -> int:
        """One transaction that no acquire can interleave: on PostgreSQL it first takes the lock every
        ``nextval`` holds shared (see ``queries``); SQLite's transaction is ``BEGIN IMMEDIATE``."""
        with self.db.transaction() as conn:
            if self.q.lock_counter is not None:
                conn.execute(self.q.lock_counter)
            floor = conn.execute(self.q.advance, {"gap": gap}).scalar()
        if floor is None:  # it would leave the range: nothing changed
            raise past_the_range(gap)
        return int(floor)

    def close(self) -> None:
        self.db.close()

    # -- internals --

    def guard(
        self, conn: Connection, lease: Lease, event: str, detail: str | None, idle_ms: int | None = None
    ) -> bool:
        """Check and lock the lease row for the rest of ``conn``'s transaction. ``idle_ms``: the guard opens
        a run's transaction, which a server that can (PostgreSQL) ends if it idles that long."""
        params = {"key": lease.key, "token": lease.token, "event": event, "detail": detail}
        params["idle_ms"] = idle_ms
        query = self.q.guard if idle_ms is None else self.q.open_guard
        return conn.execute(query, params).first() is not None

    def _refused(self, conn: Connection, lease: Lease, what: str) -> None:
        conn.execute(self.q.log, self.event_params(lease, "refused", detail=what))
        current = conn.execute(self.q.current_token, {"key": lease.key}).scalar()
        raise StaleToken(
            lease.key, lease.token, None if current is None else int(current), what, recorded=True
        )

    def refuse_now(self, lease: Lease, what: str) -> None:
        with self.db.one() as conn:
            self._refused(conn, lease, what)

    @staticmethod
    def event_params(lease: Lease, event: str, **extra: Any) -> dict[str, Any]:
        params = {"key": lease.key, "token": lease.token, "owner": lease.owner, "event": event}
        return {"detail": None, **params, **extra}
