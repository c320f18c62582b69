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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from ... import codec
from ..._failpoints import failpoint
from ...errors import StaleToken, StoreUnavailable, UsageError
from ...lease import Lease
from .errors import translate_errors, user_statement_errors
from .queries import Queries

__all__ = ["RunTransaction", "TransactionStore"]

_HAND_MADE = (
    "the run's transaction commits with its completion: do not call {what}() on the connection of "
    "self.fence.transaction(); to commit part of the work on its own, use self.fence.atomic_step() "
    "before the run's first transaction()"
)


class TransactionStore(Protocol):
    """What a run's transaction needs of its store (:class:`~celery_fence.stores.sql.store.SQLStore`, which
    imports this module: typed by what it offers, the store's module stays out of this one's imports)."""

    url: str
    engine: Engine
    q: Queries
    max_value_bytes: int

    @property
    def safe_url(self) -> str: ...

    def guard(
        self, conn: Connection, lease: Lease, event: str, detail: str | None, idle_ms: int | None = None
    ) -> bool: ...

    def refuse_now(self, lease: Lease, what: str) -> None: ...

    def event_params(self, lease: Lease, event: str, **extra: Any) -> dict[str, Any]: ...


class RunTransaction:
    """One run's open transaction on the store's database (see the module docstring)."""

    def __init__(self, store: TransactionStore, lease: Lease, ttl: float, step: str | None = None) -> None:
        self.store, self.lease = store, lease
        self._tx: Any = None  # the root Transaction: the one way this class ends it
        self._blocks = 0
        self.lost_work = False  # it ended with earlier blocks' writes undone: the run cannot go on
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
            with user_statement_errors(self.store.url):
                yield conn
        except BaseException:
            self._undo_block(savepoint)
            raise
        if savepoint is not None:
            with translate_errors(self.store.url):
                savepoint.commit()

    def complete(self, result: Any) -> None:
        """Store the result, mark the key done and release the lease in this transaction, then commit.

        ``StoreUnavailable`` means the outcome is unknown (the commit may have happened): read the key.
        """
        conn = self._usable()
        text = codec.dumps(result, self.store.max_value_bytes)
        params = self.store.event_params(self.lease, "complete", result=text)
        try:
            with translate_errors(self.store.url):
                if conn.execute(self.store.q.complete, params).first() is None:  # not while we hold the lock
                    raise StaleToken(self.lease.key, self.lease.token, None, "complete")
                failpoint("before-commit")
                self._tx.commit()
        finally:
            self.close()

    def commit(self) -> None:
        """Commit without a completion (a store-level ``transaction()``: an atomic step's writes)."""
        self._usable()
        try:
            with translate_errors(self.store.url):
                self._tx.commit()
        finally:
            self.close()

    def save_step(self, name: str, value: Any) -> None:
        """Record step ``name`` in this transaction: it commits with the run's completion."""
        conn = self._usable()
        text = codec.dumps(value, self.store.max_value_bytes)
        params = {"key": self.lease.key, "name": name, "token": self.lease.token, "value": text}
        with translate_errors(self.store.url):
            if not self.store.guard(conn, self.lease, "step", name):  # not while we hold the lock
                raise StaleToken(self.lease.key, self.lease.token, None, f"step {name}")
            conn.execute(self.store.q.insert_step, params)

    def close(self) -> None:
        """End the transaction; whatever was not committed is rolled back. Idempotent."""
        conn, self.conn = self.conn, None
        if conn is not None:
            with contextlib.suppress(DBAPIError):  # a connection the server ended rolled back there
                conn.close()

    # -- internals --

    def _begin(self, ttl: float, step: str | None) -> Connection | None:
        store = self.store
        with translate_errors(store.url):
            conn = store.engine.connect()
            try:
                self._tx = conn.begin()
                idle_ms = max(1, int(ttl * 1000))  # a paused holder blocks a takeover for one ttl at most
                current = store.guard(conn, self.lease, "step" if step else "write", step, idle_ms)
            except BaseException:
                conn.close()
                raise
        if not current:
            conn.close()
            store.refuse_now(self.lease, f"step {step}" if step else "write")
        # The caller's connection refuses to end the run's transaction; this class ends it through the
        # Transaction object (``self._tx``), which never calls these.
        conn.commit = _refuse_hand_made("commit")  # type: ignore[method-assign]
        conn.rollback = _refuse_hand_made("rollback")  # type: ignore[method-assign]
        failpoint("after-guard")
        return conn

    def _usable(self) -> Connection:
        if self.conn is None:
            raise StoreUnavailable(
                f"the run's transaction on {self.store.safe_url} ended before its completion (its "
                "connection was lost or an error rolled it back): nothing of it was committed"
            )
        return self.conn

    def _undo_block(self, savepoint: Any) -> None:
        """Roll back the failed block: to its savepoint, or (the first block) the whole transaction."""
        if savepoint is not None and self.conn is not None and not self.conn.invalidated:
            try:
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
