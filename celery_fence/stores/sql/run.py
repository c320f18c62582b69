"""A run's fenced transaction on the SQL store: opened at the run's first ``transaction()``, committed
together with the run's completion, rolled back otherwise
(docs/guarantees.md#the-rule-of-transaction-its-writes-commit-with-the-completion).

The lease row is checked and locked at the start (the guard: a row lock, so no takeover can slip in before
the commit) and stays locked until the transaction ends. Each ``transaction()`` block after the first runs
in a savepoint, so an exception inside a block undoes that block only, as a block on its own would. The
connection refuses ``commit()`` and ``rollback()`` from the caller: either would end the run's transaction
apart from its completion. On PostgreSQL the session's ``idle_in_transaction_session_timeout`` is the lease
ttl, so a paused holder blocks a takeover for at most one ttl.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from ..._failpoints import failpoint
from ...errors import StaleToken, StoreUnavailable, UsageError
from ...lease import Lease
from .driver import translate_errors
from .errors import Unchanged, user_statement_errors
from .statements import LeaseStatements

__all__ = ["CommitTransaction", "RunTransaction"]

_HAND_MADE = (
    "the run's transaction commits with its completion: do not call {what}() on the connection of "
    "self.fence.transaction(); to commit part of the work on its own, use self.fence.atomic_step() "
    "before the run's first transaction()"
)


class RunTransaction:
    """One run's open transaction on the store's database (see the module docstring)."""

    # The connection is the store's own, so its BEGIN and COMMIT go with the guard and the completion
    # (``LeaseStatements.first``/``last``); a connection borrowed from Django is Django's to begin and end.
    OWN_CONNECTION = True

    def __init__(
        self, statements: LeaseStatements, lease: Lease, ttl: float, step: str | None = None
    ) -> None:
        self.statements, self.lease = statements, lease
        self._tx: Any = None  # the root Transaction: the one way this class ends it
        self._blocks = 0
        self.lost_work = False  # it ended with earlier blocks' writes undone: the run cannot go on
        self.conn: Connection | None = None  # until _begin returns it
        self.conn = self._begin(ttl, step)

    @property
    def open(self) -> bool:
        return self.conn is not None

    @contextmanager
    def block(self) -> Iterator[Connection]:
        """One ``transaction()`` block: the caller's statements, undone alone if the block raises."""
        conn = self._usable()
        savepoint = conn.begin_nested() if self._blocks else None
        self._blocks += 1
        try:
            with user_statement_errors(self.statements.url):
                yield conn
        except BaseException:
            self._undo_block(savepoint)
            raise
        if savepoint is not None:
            with translate_errors(self.statements.url):
                savepoint.commit()

    def complete(self, result: Any) -> None:
        """Store the result, mark the key done and release the lease in this transaction, then commit.

        ``StoreUnavailable`` means the outcome is unknown (the commit may have happened): read the key.
        """
        conn = self._usable()
        params = self.statements.complete_params(self.lease, result)
        try:
            self._last(conn, "complete_or_fail", params)
        except Unchanged:  # not while we hold the lock
            raise StaleToken(self.lease.key, self.lease.token, None, "complete") from None
        finally:
            self.close()

    def commit(self) -> None:
        """Commit without a completion (a store-level ``transaction()``: an atomic step's writes)."""
        self._usable()
        try:
            with translate_errors(self.statements.url):
                self._tx.commit()
        finally:
            self.close()

    def save_step(self, name: str, value: Any) -> None:
        """Record step ``name`` in this transaction: it commits with the run's completion."""
        conn = self._usable()
        params = self.statements.step_params(self.lease, name, value)
        with translate_errors(self.statements.url):
            if not self.statements.guard(conn, self.lease, "step", name):  # not while we hold the lock
                raise StaleToken(self.lease.key, self.lease.token, None, f"step {name}")
            conn.execute(self.statements.queries.insert_step, params)

    def close(self) -> None:
        """End the transaction; whatever was not committed is rolled back. Idempotent."""
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(DBAPIError):  # a connection the server ended rolled back there
                conn.close()

    # -- internals --

    def _last(self, conn: Connection, name: str, params: Mapping[str, Any]) -> Any:
        """The transaction's last statement, then its commit (one round trip on PostgreSQL): ``Unchanged``,
        nothing committed, when it changed no row."""
        failpoint("before-commit")
        with translate_errors(self.statements.url):
            return self.statements.last(conn, self._tx, name, params)

    def _begin(self, ttl: float, step: str | None) -> Connection | None:
        statements = self.statements
        with translate_errors(statements.url):
            conn = statements.connect()
            try:
                self._tx = conn.begin()
                current = self._guard(conn, ttl, step)
            except BaseException:
                conn.close()
                raise
        return self._guarded(conn, current, step)

    def _guard(self, conn: Connection, ttl: float, step: str | None) -> bool:
        """Check and lock the lease row in the transaction just begun on ``conn``: is the token current?"""
        idle_ms = max(1, int(ttl * 1000))  # a paused holder blocks a takeover for one ttl at most
        event = "step" if step else "write"
        return self.statements.guard(conn, self.lease, event, step, idle_ms, self.OWN_CONNECTION)

    def _guarded(self, conn: Connection, current: bool, step: str | None) -> Connection:
        """``conn`` once the guard answered: refused (``StaleToken``, the transaction ended first) or the
        caller's, which refuses to end the run's transaction (this class ends it its own way)."""
        if not current:
            conn.close()
            self.close()
            self.statements.refuse(self.lease, f"step {step}" if step else "write")
        conn.commit = _refuse_hand_made("commit")  # type: ignore[method-assign]
        conn.rollback = _refuse_hand_made("rollback")  # type: ignore[method-assign]
        failpoint("after-guard")
        return conn

    def _usable(self) -> Connection:
        if self.conn is None:
            raise StoreUnavailable(
                f"the run's transaction on {self.statements.safe_url} ended before its completion (its "
                "connection was lost or an error rolled it back): nothing of it was committed"
            )
        return self.conn

    def _undo_block(self, savepoint: Any) -> None:
        """Roll back the failed block: to its savepoint, or (the first block) the whole transaction."""
        if savepoint is not None and self.conn is not None and not self.conn.invalidated:
            try:
                if savepoint.is_active:  # else an ORM session's failed flush already rolled it back
                    savepoint.rollback()
                return
            except DBAPIError:
                pass
        self.lost_work = self._blocks > 1
        self.close()


def _refuse_hand_made(what: str) -> Any:
    def refuse(*_: Any, **__: Any) -> None:
        raise UsageError(_HAND_MADE.format(what=what))

    return refuse


class CommitTransaction(RunTransaction):
    """A fenced commit's transaction (``fence_mode="commit"``, docs/commit-mode.md): no lease. It opens
    with a read of the key (sent with its ``BEGIN``), the run's ``transaction()`` blocks join it, and its
    completion claims the key (sent with its ``COMMIT``): the key done with the result, unless it is done
    or leased already. Of copies that ran at once the key's unique index and row lock let one claim
    commit; the others wait for it, then change no row, and roll back with everything they wrote."""

    def __init__(
        self, statements: LeaseStatements, key: str, owner: str, ttl: float, run: Mapping[str, Any] | None
    ) -> None:
        self.run = run
        self.token: int | None = None  # the token the claim drew, once it committed
        super().__init__(statements, Lease(key, 0, owner), ttl)

    def complete(self, result: Any) -> None:
        """Claim the key with ``result`` and commit. ``StaleToken`` (recorded; nothing committed): the key
        is done or leased; ``StoreUnavailable``: the outcome is unknown, read the key (its owner says)."""
        conn = self._usable()
        params = self.statements.claim_params(self.lease, result, self.run)
        try:
            self.token = int(self._last(conn, "claim", params).token)
        except Unchanged:
            self.close()
            self.statements.refuse(self.lease, "commit")
        finally:
            self.close()

    def _guard(self, conn: Connection, ttl: float, step: str | None) -> bool:
        """The transaction's first statement: a read of the key (``AlreadyDone``, ``LeaseHeld``,
        ``FailedBefore``: the run does not start)."""
        task_id = (self.run or {}).get("id")
        self.statements.open_read(conn, self.lease.key, ttl, self.OWN_CONNECTION, task_id)
        return True
