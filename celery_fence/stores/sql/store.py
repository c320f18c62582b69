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
from ...errors import AlreadyDone, InvalidArgument, LeaseHeld
from ...lease import Abandoned, HistoryEvent, Lease, LeaseState
from ..base import RunTransactionHandle, past_the_range
from ..capabilities import Capabilities
from .driver import Connections, translate_errors
from .engine import SessionLimits
from .errors import RowLocked
from .recovery import SQLRecovery
from .run import CommitTransaction, RunTransaction
from .statements import LeaseStatements, lease_state, renew_params
from .url import check_sql_store_url, check_sql_url, sqlite_file

__all__ = ["SQLStore"]

log = logging.getLogger(__name__)
PRUNED = {"event": "pruned", "owner": None, "detail": None}  # the marker a pruned key's history becomes


def sql_capabilities(url: str) -> Capabilities:
    """SQLite: one write lock for every writer, waited for up to its busy timeout; its file must exist
    before a read. Both: the run's transaction shares the database with the user's tables."""
    if check_sql_url(url).get_backend_name() != "sqlite":  # a malformed URL: ConfigurationError, masked
        return Capabilities(name="PostgreSQL", transactions=True, default_port=5432, fenced_commit="yes")
    lock_wait, path = SessionLimits().lock, sqlite_file(url)
    return Capabilities(
        name="SQLite", transactions=True, write_lock_wait=lock_wait, local_file=path, fenced_commit="yes"
    )


class SQLStore:
    """Lease store on PostgreSQL or SQLite; see :class:`celery_fence.stores.base.Store`."""

    max_value_bytes = codec.MAX_VALUE_BYTES  # far below a TEXT value's limit on either database
    capabilities_for = staticmethod(sql_capabilities)
    check_url = staticmethod(check_sql_store_url)

    def __init__(self, url: str, limits: SessionLimits | None = None) -> None:
        self.url, self.capabilities = url, sql_capabilities(url)
        self.limits = limits or SessionLimits()
        self.connections = Connections(url, self.limits)
        self.engine, self.autocommit_engine = self.connections.engine, self.connections.autocommit_engine
        self.dialect, self.queries = self.connections.dialect, self.connections.queries
        # The fenced writes' statements, shared with each run's transaction; recovery's operations.
        self.statements = LeaseStatements(self.connections, self.max_value_bytes)
        self._recovery = SQLRecovery(self.connections, self.max_value_bytes)

    def migrate(self) -> None:
        self.connections.migrate()

    # -- the lease operations --

    def acquire(self, key: str, owner: str, ttl: float, run: Mapping[str, Any] | None = None) -> Lease:
        run_text = codec.dumps_mapping(run, self.max_value_bytes)
        params = {"key": key, "owner": owner, "ttl": ttl, "run": run_text}
        try:
            rows = self.connections.hot("acquire", params)
        except RowLocked:  # its holder's open transaction locks it: a live lease
            rows = []
        if rows:  # the old row's expiry is not visible to RETURNING: expired_for stays unknown here
            return Lease(key, int(rows[0][0]), owner, taken_over=rows[0][1] == "takeover")
        with self.connections.one() as conn:  # held or done: say by whom (not the hot path)
            state = conn.execute(self.queries.state, {"key": key}).first()
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
            (key, int(token))
            for key, token in self.connections.hot("renew", renew_params(self.dialect, leases, ttl))
        }
        lost = [lease for lease in leases if (lease.key, lease.token) not in kept]
        if lost:
            with self.connections.one() as conn:
                failed = [self.statements.event_params(lease, "renew-failed") for lease in lost]
                conn.execute(self.queries.log_renew_failed, failed)
        return lost

    def complete(self, lease: Lease, result: Any) -> None:
        params = self.statements.complete_params(lease, result)
        if not self.connections.hot("complete", params):
            self.statements.refuse(lease, "complete")

    def release(self, lease: Lease) -> None:
        self.connections.hot("release", {"key": lease.key, "token": lease.token})

    def begin_run(self, lease: Lease, ttl: float) -> RunTransaction:
        """Open the run's transaction: the lease row checked and locked until it commits with the
        completion (``RunTransaction.complete``) or rolls back (``close``). ``StaleToken``: not current."""
        self.connections.ready()
        return self._run_transaction(lease, ttl)

    def begin_commit(
        self, key: str, owner: str, ttl: float, run: Mapping[str, Any] | None = None
    ) -> RunTransactionHandle:
        """Open a fenced commit's transaction (``fence_mode="commit"``): ``AlreadyDone`` or ``LeaseHeld``
        (nothing begun) when the key is done or leased."""
        self.connections.ready()
        return CommitTransaction(self.statements, key, owner, ttl, run)

    def claim(self, key: str, owner: str, result: Any, run: Mapping[str, Any] | None = None) -> int:
        """A fenced commit's claim on its own (a run whose only ``transaction()`` block was undone): the
        key done with ``result``; its token, or ``StaleToken`` when the key is done or leased."""
        with self.connections.one() as conn:
            return self.statements.claim(conn, Lease(key, 0, owner), result, run)

    def _run_transaction(self, lease: Lease, ttl: float, step: str | None = None) -> RunTransaction:
        """A run's transaction on this store's connections (a store on another's connection makes its own)."""
        return RunTransaction(self.statements, lease, ttl, step)

    @contextmanager
    def transaction(self, lease: Lease, step: str | None = None) -> Iterator[Connection]:
        """A transaction in which the lease row is checked and locked until commit (see the protocol): a
        :class:`RunTransaction` of one block that commits when the block ends (an atomic step's)."""
        self.connections.ready()
        run_tx = self._run_transaction(lease, self.limits.idle_in_transaction, step)
        try:
            with run_tx.block() as conn:
                yield conn
            run_tx.commit()
        finally:
            run_tx.close()  # rolls back whatever was not committed

    def save_step(self, lease: Lease, name: str, value: Any) -> None:
        params = self.statements.step_params(lease, name, value)
        with self.connections.transaction() as conn:
            current = self.statements.guard(conn, lease, "step", name)
            if current:
                conn.execute(self.queries.insert_step, params)
        if not current:
            self.statements.refuse(lease, f"step {name}")

    def insert_step(self, conn: Connection, lease: Lease, name: str, value: Any) -> None:
        """Record step ``name`` inside an open :meth:`transaction` (opened with ``step=name``)."""
        params = self.statements.step_params(lease, name, value)
        with translate_errors(self.url):
            conn.execute(self.queries.insert_step, params)

    def steps(self, key: str) -> dict[str, Any]:
        with self.connections.one() as conn:
            return {r.name: codec.loads(r.value) for r in conn.execute(self.queries.steps, {"key": key})}

    def refuse(self, lease: Lease, what: str) -> None:
        with self.connections.one() as conn:
            conn.execute(self.queries.log, self.statements.event_params(lease, "refused", detail=what))

    # -- reading --

    def get(self, key: str) -> LeaseState | None:
        with self.connections.one() as conn:
            row = conn.execute(self.queries.state, {"key": key}).first()
        return None if row is None else lease_state(row)

    def history(self, key: str | None = None) -> list[HistoryEvent]:
        query, params = (
            (self.queries.history_all, {}) if key is None else (self.queries.history, {"key": key})
        )
        with self.connections.one() as conn:
            rows = conn.execute(query, params).all()
        return [HistoryEvent(r.at, r.event, int(r.token), r.owner, r.detail, key=r.key) for r in rows]

    def leases(self) -> list[LeaseState]:
        with self.connections.one() as conn:
            return [lease_state(row) for row in conn.execute(self.queries.leases)]

    # -- administration --

    def force_release(self, key: str) -> int:
        with self.connections.one() as conn:
            token = conn.execute(self.queries.force_release, {"key": key}).scalar()
        if token is None:
            raise InvalidArgument(f"no lease for key {key!r}")
        return int(token)

    def prune(self, older_than: float) -> int:
        age = {"age": older_than}
        # Steps and history go with the keys; one marker takes the history's place.
        with self.connections.transaction() as conn:
            conn.execute(self.queries.prune_markers, age)  # earlier prunes' markers past the cutoff go first
            keys = [{"key": k, "token": t, **PRUNED} for k, t in conn.execute(self.queries.prune, age).all()]
            if keys:
                conn.execute(self.queries.prune_steps, keys)
                conn.execute(self.queries.prune_history, keys)
                conn.execute(self.queries.log, keys)
            return len(keys)

    def advance(self, gap: int) -> int:
        """One transaction that no acquire can interleave: on PostgreSQL it first takes the lock every
        ``nextval`` holds shared (see ``queries``); SQLite's transaction is ``BEGIN IMMEDIATE``."""
        with self.connections.transaction() as conn:
            if self.queries.lock_counter is not None:
                conn.execute(self.queries.lock_counter)
            floor = conn.execute(self.queries.advance, {"gap": gap}).scalar()
        if floor is None:  # it would leave the range: nothing changed
            raise past_the_range(gap)
        return int(floor)

    # -- recovery: its own module (``recovery``), on the same connections --

    def abandoned(self, grace: float, limit: int = 100) -> list[Abandoned]:
        return self._recovery.abandoned(grace, limit)

    def recover(self, seen: Abandoned, max_recoveries: int, reason: str = "") -> int | None:
        return self._recovery.recover(seen, max_recoveries, reason)

    def strand(self, key: str, run: Mapping[str, Any] | None, reason: str) -> bool:
        return self._recovery.strand(key, run, reason)

    def close(self) -> None:
        self.connections.close()
