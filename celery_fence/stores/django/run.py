"""A run's fenced transaction on Django's connection (the ``django://`` store): a Django transaction.

It is what ``stores.sql.run.RunTransaction`` is on the store's own connection, with Django in charge of
the transaction: the run's first block enters ``transaction.atomic(using=alias)`` and checks and locks
the lease row in it (the guard, sent on Django's connection through :mod:`.borrowed`); each later block is
a nested ``atomic()`` (a savepoint), so an exception inside it undoes that block only; the completion is
written in it and leaving the outermost ``atomic()`` commits, so ``transaction.on_commit`` callbacks run
after the completion committed and never for a run that rolled back. The run's body and its completion
run in the worker's thread, which Django's per-thread connection needs; the renewer never touches it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError as DjangoDatabaseError
from django.db import Error as DjangoError
from django.db import connections, transaction
from sqlalchemy import Connection

from ..._failpoints import failpoint
from ...errors import FenceError, StoreUnavailable, UsageError
from ...lease import Lease
from ..sql.driver import translate_errors
from ..sql.errors import (  # what a driver error means, and what of it a caller's statement may meet
    _TRANSIENT_IN_TRANSACTION,
    Unchanged,
    driver_error,
    safe_url,
    user_statement_errors,
)
from ..sql.run import CommitTransaction, RunTransaction
from ..sql.statements import LeaseStatements
from .borrowed import BorrowedConnection

__all__ = ["DjangoCommitTransaction", "DjangoRunTransaction"]

log = logging.getLogger(__name__)


class DjangoRunTransaction(RunTransaction):
    """One run's open transaction on Django's connection (see the module docstring). What it shares with
    the SQL store's (``save_step``, ``open``, the refusal of a hand-made commit) it inherits."""

    OWN_CONNECTION = False  # Django begins and ends it

    def __init__(
        self,
        statements: LeaseStatements,
        borrowed: BorrowedConnection,
        lease: Lease,
        ttl: float,
        lock_timeouts: str | None,
        step: str | None = None,
    ) -> None:
        self.alias, self._borrowed, self._lock_timeouts = borrowed.alias, borrowed, lock_timeouts
        self._outer: Any = None  # the outermost atomic(): leaving it commits or rolls back the run
        self._committed = False  # set by the first on_commit callback: the COMMIT happened
        self.conn = None  # until _begin returns it (it may close() before)
        super().__init__(statements, lease, ttl, step)

    @contextmanager
    def block(self) -> Iterator[Connection]:
        """One block: the caller's statements (ORM or SQLAlchemy), undone alone if the block raises."""
        conn = self._usable()
        self._blocks += 1
        if self._blocks == 1:  # the run's transaction itself: a failure undoes it whole (nothing else in it)
            try:
                with self._callers_statements():
                    yield conn
            except BaseException:
                self.close()
                raise
            return
        savepoint = transaction.atomic(using=self.alias)
        with _django_errors(self.statements.url):
            savepoint.__enter__()
        try:
            with self._callers_statements():
                yield conn
        except BaseException as exc:
            savepoint.__exit__(type(exc), exc, exc.__traceback__)  # Django marks the run doomed if it cannot
            if self._doomed():  # the savepoint could not be rolled back: earlier blocks go with it
                self.lost_work = True
                self.close()
            raise
        with _django_errors(self.statements.url):
            savepoint.__exit__(None, None, None)  # releases the savepoint

    def commit(self) -> None:
        """Commit without a completion (a store-level ``transaction()``: an atomic step's writes)."""
        self._usable()
        try:
            self._refuse_doomed()
            self._commit()
        finally:
            self.close()

    def close(self) -> None:
        """End the transaction; whatever was not committed is rolled back. Idempotent."""
        conn, self.conn = self.conn, None
        outer, self._outer = self._outer, None
        if conn is not None:
            conn.close()  # hands nothing back: the borrowed dialect leaves the connection to Django
        if outer is not None:
            with contextlib.suppress(DjangoError):  # Django rolls back, or drops a connection it lost
                outer.__exit__(_RolledBack, _RolledBack(), None)

    # -- internals --

    def _last(self, conn: Connection, name: str, params: Mapping[str, Any]) -> Any:
        """The completion or claim, then the commit by leaving the outermost ``atomic()`` (Django runs the
        ``on_commit`` callbacks after it): ``Unchanged``, nothing committed, when it changed no row."""
        self._refuse_doomed()
        with translate_errors(self.statements.url):
            row = conn.execute(getattr(self.statements.queries, name), params).first()
        if row is None:  # SQLite; PostgreSQL's statement fails instead (Unchanged)
            raise Unchanged(f"the {name} of key {self.lease.key!r} changed no row")
        failpoint("before-commit")
        self._commit()
        return row

    @contextmanager
    def _callers_statements(self) -> Iterator[None]:
        """Around the caller's statements, SQLAlchemy's and the ORM's: their errors stay theirs, except
        what waiting can heal (a session timeout, a deadlock, a lost connection): ``StoreUnavailable``, as
        ``user_statement_errors`` says of SQLAlchemy's."""
        url = self.statements.url
        try:
            with user_statement_errors(url):
                yield
        except DjangoDatabaseError as exc:
            orig = exc.__cause__
            driver = connections[self.alias].connection
            lost = driver is None or any(getattr(driver, flag, False) for flag in ("broken", "closed"))
            if not lost and getattr(orig, "sqlstate", None) not in _TRANSIENT_IN_TRANSACTION:
                raise
            first = str(orig).splitlines()[0] if str(orig) else type(orig).__name__
            raise StoreUnavailable(
                f"fence store {safe_url(url)}: the run's transaction failed ({first}); nothing of it was "
                "committed, the run will run again"
            ) from exc

    def _begin(self, ttl: float, step: str | None) -> Connection | None:
        statements = self.statements
        if connections[self.alias].in_atomic_block:
            raise UsageError(
                f"the run's transaction on Django's {self.alias!r} database commits with the run's "
                "completion, so self.fence.atomic() (or transaction()) cannot be inside "
                "transaction.atomic(): open self.fence.atomic() first and nest transaction.atomic() in it"
            )
        with _django_errors(statements.url):
            outer = transaction.atomic(using=self.alias)
            outer.__enter__()
        self._outer = outer
        transaction.on_commit(self._mark_committed, using=self.alias)  # the first: runs before any other
        try:
            with translate_errors(statements.url):
                conn = self._borrowed.connect()
                if self._lock_timeouts is not None:  # the store's sessions' limits, for this transaction only
                    conn.exec_driver_sql(self._lock_timeouts)
                current = self._guard(conn, ttl, step)
        except BaseException:
            self.close()
            raise
        # Django's own commit() is refused inside atomic() by Django; this class ends the run's transaction
        # through the outermost atomic().
        return self._guarded(conn, current, step)

    def _commit(self) -> None:
        """Leave the outermost ``atomic()``: Django commits, then runs the ``on_commit`` callbacks."""
        outer, self._outer = self._outer, None
        try:
            with _django_errors(self.statements.url):
                outer.__exit__(None, None, None)
        except BaseException as exc:
            if not self._committed:
                raise
            # The COMMIT happened (the first on_commit callback, ours, ran): what raised is a later
            # callback of the user's. The run completed; Django skips the callbacks after it.
            log.error(
                "fence: an on_commit callback of %s raised after its run committed", self.lease.key,
                exc_info=exc,
            )
        if not self._committed:  # Django rolled back instead (an inner atomic marked it for rollback)
            raise StoreUnavailable(
                f"the run's transaction on key {self.lease.key!r} was rolled back by Django at its commit: "
                "nothing of it was committed"
            )

    def _mark_committed(self) -> None:
        self._committed = True

    def _doomed(self) -> bool:
        """Django marked the transaction for rollback or lost its connection: nothing can commit now."""
        django = connections[self.alias]
        return bool(django.needs_rollback or django.closed_in_transaction or django.connection is None)

    def _refuse_doomed(self) -> None:
        if self._doomed():  # an inner atomic(savepoint=False) failed: leaving would roll back, silently
            self.lost_work = self._blocks > 1
            raise StoreUnavailable(
                f"the run's transaction on key {self.lease.key!r} must roll back (an atomic block inside "
                "it failed without a savepoint): nothing of it was committed"
            )


class _RolledBack(Exception):
    """Handed to the outermost ``atomic().__exit__`` to make Django roll back."""


@contextmanager
def _django_errors(url: str) -> Iterator[None]:
    """Django's wrappers of the driver's errors (its commit, its savepoints) as the SQL store's errors."""
    try:
        yield
    except FenceError:
        raise
    except DjangoDatabaseError as exc:
        raise driver_error(url, exc.__cause__ or exc, False) from exc


class DjangoCommitTransaction(CommitTransaction, DjangoRunTransaction):
    """``fence_mode="commit"`` on Django's connection: ``CommitTransaction``'s read and claim in a Django
    transaction. It opens with a read of the key, the ORM's writes in ``self.fence.atomic()`` join it, and
    the completion claims the key, then leaves the outermost ``atomic()``: the claim, the ORM's writes and
    the ``on_commit`` callbacks go together or not at all."""

    def __init__(
        self,
        statements: LeaseStatements,
        borrowed: BorrowedConnection,
        key: str,
        owner: str,
        ttl: float,
        lock_timeouts: str | None,
        run: Mapping[str, Any] | None,
    ) -> None:
        self.run = run
        self.token = None  # the token the claim drew, once it committed
        DjangoRunTransaction.__init__(self, statements, borrowed, Lease(key, 0, owner), ttl, lock_timeouts)
