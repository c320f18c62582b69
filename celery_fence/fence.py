"""The per-run handle a fenced task sees as ``self.fence``."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from . import codec
from .errors import (
    AlreadyDone,
    ConfigurationError,
    LeaseHeld,
    LeaseLost,
    StaleToken,
    StoreUnavailable,
    UsageError,
)
from .lease import Lease
from .stores.base import CommitStore, FencedConnectionStore, RunTransactionHandle, Store
from .stores.capabilities import capabilities_of

if TYPE_CHECKING:
    from .stores.sql.session import FencedSession

__all__ = ["CommitMode", "Fence", "Heartbeat"]

T = TypeVar("T")


class Heartbeat(Protocol):
    """What a run's handle needs of the renewer (``_runtime.Renewer``)."""

    def deadline(self, lease: Lease) -> float | None: ...
    def pin(self, lease: Lease) -> None: ...
    def unpin(self, lease: Lease) -> None: ...


@dataclass(frozen=True)
class CommitMode:
    """How a run of ``fence_mode="commit"`` reaches its store (a ``CommitStore``) past its first
    transaction: a new one when the body caught the failure of its only block, or the claim on its own."""

    store: CommitStore
    ttl: float
    run: Mapping[str, Any] | None

    def begin(self, lease: Lease) -> RunTransactionHandle:
        """A new transaction for the run, in the body: a key finished or leased meanwhile refuses it."""
        try:
            return self.store.begin_commit(lease.key, lease.owner, self.ttl, self.run)
        except (AlreadyDone, LeaseHeld) as exc:
            current = exc.token if isinstance(exc, AlreadyDone) else None
            raise StaleToken(lease.key, 0, current, "commit") from exc

    def claim(self, lease: Lease, result: Any) -> None:
        self.store.claim(lease.key, lease.owner, result, self.run)


class Fence:
    """The lease one run holds: its key and token, and the writes that carry the token.

    ``check()`` is local and cheap (it raises once the renewer saw the lease lost); every write asks the
    store, which alone decides.
    """

    def __init__(
        self,
        store: Store,
        lease: Lease,
        heartbeat: Heartbeat | None = None,
        ttl: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        commit_mode: CommitMode | None = None,
        run_tx: RunTransactionHandle | None = None,
    ) -> None:
        self.store = store
        self._clock = clock
        self.lease = lease
        self._heartbeat = heartbeat  # the renewer: local deadline; pinned while the transaction is open
        self._ttl = ttl
        self._lost: str | None = None
        self._steps: dict[str, Any] | None = None
        self._lost_event = threading.Event()
        self._run_tx = run_tx  # the run's first transaction() opens it (SQL); fence_mode="commit": at start
        self.commit_mode = commit_mode  # fence_mode="commit": no lease, the token is 0 until the claim

    @property
    def key(self) -> str:
        return self.lease.key

    @property
    def token(self) -> int:
        return self.lease.token

    @property
    def lost(self) -> bool:
        return self._lost is not None

    @property
    def lost_reason(self) -> str | None:
        return self._lost

    def mark_lost(self, reason: str) -> None:
        """Called by the renewer's thread when the lease is lost."""
        self._lost = reason
        self._lost_event.set()

    def check(self) -> None:
        """Raise :class:`LeaseLost` if this run's lease is known to be lost, or its local deadline passed.

        The deadline is compared here too, so a renew stuck on an unanswering store cannot delay it.
        """
        if self._lost is None:
            deadline = None if self._heartbeat is None else self._heartbeat.deadline(self.lease)
            if deadline is not None and self._clock() >= deadline:
                self.mark_lost("no successful renew before the local deadline")
        if self._lost is not None:
            raise LeaseLost(self.key, self.token, self._lost)

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """The run's transaction on the store's database: write your tables with the SQLAlchemy
        ``Connection`` it yields. The lease row is checked and locked at the first ``transaction()`` of the
        run, and every block's writes commit **together with the run's completion** (its result, the lease
        release) or not at all: an attempt that raises, retries, is killed or is refused leaves none of them
        (``StaleToken`` if the token is not current). An exception inside a block undoes that block only.
        Do not call ``commit()`` or ``rollback()`` on the connection (``UsageError``); for work that must
        commit on its own before the run ends, use :meth:`atomic_step`. Needs a SQL store; with Redis or
        etcd use :func:`celery_fence.fenced_update` on a table with a ``fence_token`` column.
        """
        with self._open_run_transaction().block() as conn:
            yield conn

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """Django's ``transaction.atomic()`` for the run (a ``django://`` store): the ORM writes inside it
        commit **together with the run's completion**, as ``transaction()``'s do, and ``on_commit``
        callbacks run after that commit, never for a run that did not commit. A nested
        ``transaction.atomic()`` is a savepoint; ``transaction.commit()`` inside it Django refuses
        (docs/django.md)."""
        if capabilities_of(self.store).django_alias is None:
            raise UsageError(
                f"self.fence.atomic() needs the Django store (fence_store_url = 'django://default'), not "
                f"{self.store.url.split('://')[0]}://; with another SQL store use self.fence.transaction()"
            )
        with self._open_run_transaction().block():
            yield

    @contextmanager
    def session(self, **options: Any) -> Iterator[FencedSession]:
        """An SQLAlchemy ORM ``Session`` on the run's transaction: what it flushes commits **together with
        the run's completion**, as a ``transaction()`` block's writes do (it is one such block), and an
        exception inside undoes it. ``session.commit()`` and ``session.rollback()`` are refused
        (``UsageError``); pending objects are flushed when the block ends. ``options`` go to ``Session``
        (``expire_on_commit``, ``info``...). Needs a SQL store, and your tables in its database.
        """
        # Imported here: SQLAlchemy's ORM costs every process ~60 ms of import, and most never use it.
        from .stores.sql.session import session_on

        with self.transaction() as conn, session_on(conn, **options) as session:
            yield session

    @property
    def joined(self) -> bool:
        """Whether the run has an open transaction that its completion commits."""
        return self._run_tx is not None and self._run_tx.open

    @property
    def block_undone(self) -> bool:
        """The run's first ``transaction()`` block raised and rolled the run's transaction back, and the
        body went on (it caught the exception): nothing else was in it, so the run may still complete."""
        return self._run_tx is not None and not self._run_tx.open and not self._run_tx.lost_work

    @property
    def work_lost(self) -> bool:
        """The run's transaction ended (a lost connection, a failed later block) with writes of earlier
        blocks undone: completing now would commit half a run."""
        return self._run_tx is not None and not self._run_tx.open and self._run_tx.lost_work

    def commit(self, result: Any) -> None:
        """Complete the run: in its open transaction (all its writes commit with the result) or, without
        one, in one store operation. ``StoreUnavailable``: the outcome is unknown, read the key."""
        if self.block_undone:  # the body caught its only block's failure: nothing of it is to commit
            self.abort()
        run_tx = self._run_tx
        if run_tx is None:
            if self.commit_mode is not None:  # its only block was undone: the claim alone
                self.commit_mode.claim(self.lease, result)
            else:
                self.store.complete(self.lease, result)
            return
        if not run_tx.open:
            raise StoreUnavailable(f"the run's transaction on key {self.key!r} ended before its completion")
        run_tx.complete(result)

    def abort(self) -> None:
        """Roll back the run's open transaction, if any (the run ends without completing)."""
        run_tx, self._run_tx = self._run_tx, None
        if run_tx is not None:
            run_tx.close()
            if self._heartbeat is not None:
                self._heartbeat.unpin(self.lease)

    def _open_run_transaction(self) -> RunTransactionHandle:
        run_tx = self._run_tx
        if run_tx is not None and not run_tx.open:
            if run_tx.lost_work:  # earlier blocks were undone with it: going on would commit half a run
                raise StoreUnavailable(
                    f"the run's transaction on key {self.key!r} was lost with writes of earlier blocks; "
                    "nothing of it was committed: the run must run again"
                )
            self.abort()  # only its first block failed: nothing is lost by beginning again
            run_tx = None
        if run_tx is None and self.commit_mode is not None:
            run_tx = self._run_tx = self.commit_mode.begin(self.lease)
        if run_tx is None:
            run_tx = self._run_tx = self._sql_store().begin_run(self.lease, self._ttl)
            if self._heartbeat is not None:
                self._heartbeat.pin(self.lease)
        return run_tx

    def step(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` once per key: a committed step returns its stored value without calling ``fn``.

        A new value is committed with the token check (``StaleToken`` if this run was superseded).
        """

        def commit() -> T:
            value = _as_stored(fn(*args, **kwargs))
            if self._run_tx is not None:  # the lease row is locked by the run's transaction: join it
                self._open_run_transaction().save_step(name, value)
            else:
                self.store.save_step(self.lease, name, value)
            return value

        return self._once(name, commit)

    def atomic_step(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A step whose effect is SQL writes: ``fn(conn, *args, **kwargs)`` runs in the fenced transaction
        and the step record commits with those writes, so the effect happens exactly once per key even
        if the worker dies between the two. Needs a SQL lease store.
        """

        def commit() -> T:
            if self._run_tx is not None:  # joins the run's transaction: commits with the completion
                run_tx = self._open_run_transaction()
                with run_tx.block() as conn:
                    value = _as_stored(fn(conn, *args, **kwargs))
                    run_tx.save_step(name, value)
                return value
            store = self._sql_store()
            with store.transaction(self.lease, step=name) as conn:
                value = _as_stored(fn(conn, *args, **kwargs))
                store.insert_step(conn, self.lease, name, value)
            return value

        return self._once(name, commit)

    def _once(self, name: str, commit: Callable[[], T]) -> T:
        """Step ``name``'s committed value, else the value ``commit()`` runs the step for and commits."""
        if self.commit_mode is not None:
            raise UsageError(
                f"step {name!r}: fence_mode='commit' keeps no steps (a refused claim undoes the whole run); "
                "use fence_mode='lease' for a checkpointed task"
            )
        if self._steps is None:
            self._steps = self.store.steps(self.key)
        if name in self._steps:
            stored: T = copy.deepcopy(self._steps[name])  # callers may mutate what they get
            return stored
        self.check()  # a run that knows its lease is lost does not start a step's effect
        value = commit()
        self._steps[name] = copy.deepcopy(value)
        return value

    def _sql_store(self) -> FencedConnectionStore:
        if not capabilities_of(self.store).transactions:
            raise ConfigurationError(
                f"this needs a SQL lease store, not {self.store.url.split('://')[0]}://; "
                "use celery_fence.fenced_update(conn, table, values, where, self.fence.token) on your own "
                "database instead"
            )
        return cast(FencedConnectionStore, self.store)  # what a store declaring transactions implements

    def __repr__(self) -> str:
        state = f"lost: {self._lost}" if self._lost else "held"
        return f"<Fence {self.key!r} token={self.token} {state}>"


def _as_stored(value: T) -> T:
    """``value`` through the codec: the same value a resumed run will see."""
    stored: T = codec.loads(codec.dumps(value))
    return stored
