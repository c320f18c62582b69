"""The per-run handle a fenced task sees as ``self.fence``."""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from . import codec
from .errors import ConfigurationError, LeaseLost
from .lease import Lease
from .stores.base import FencedConnectionStore, Store

__all__ = ["Fence"]

T = TypeVar("T")


class Fence:
    """The lease one run holds: its key and token, and the writes that carry the token.

    ``check()`` is local and cheap (it raises once the renewer saw the lease lost); every write asks the
    store, which alone decides.
    """

    def __init__(
        self, store: Store, lease: Lease, deadline: Callable[[], float | None] = lambda: None
    ) -> None:
        self.store = store
        self.lease = lease
        self._deadline = deadline  # the local monotonic deadline, kept by the renewer
        self._lost: str | None = None
        self._steps: dict[str, Any] | None = None
        self._lost_event = threading.Event()

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
            deadline = self._deadline()
            if deadline is not None and time.monotonic() >= deadline:
                self.mark_lost("no successful renew before the local deadline")
        if self._lost is not None:
            raise LeaseLost(self.key, self.token, self._lost)

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        """A transaction on the store's database in which the lease row is checked and locked until commit.

        Yields an SQLAlchemy ``Connection``: write your tables with it; the token check and your writes
        commit together or not at all (``StaleToken``). Needs a SQL store; with Redis or etcd use
        :func:`celery_fence.fenced_update` on a table with a ``fence_token`` column.
        """
        with self._sql_store().transaction(self.lease) as conn:
            yield conn

    def step(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` once per key: a committed step returns its stored value without calling ``fn``.

        A new value is committed with the token check (``StaleToken`` if this run was superseded).
        """
        if self._steps is None:
            self._steps = self.store.steps(self.key)
        if name in self._steps:
            value: T = copy.deepcopy(self._steps[name])  # callers may mutate what they get
            return value
        value = codec.loads(codec.dumps(fn(*args, **kwargs)))  # the same value a resumed run will see
        self.store.save_step(self.lease, name, value)
        self._steps[name] = copy.deepcopy(value)
        return value

    def atomic_step(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A step whose effect is SQL writes: ``fn(conn, *args, **kwargs)`` runs in the fenced transaction
        and the step record commits with those writes, so the effect happens exactly once per key even
        if the worker dies between the two. Needs a SQL lease store.
        """
        if self._steps is None:
            self._steps = self.store.steps(self.key)
        if name in self._steps:
            stored: T = copy.deepcopy(self._steps[name])
            return stored
        store = self._sql_store()
        with store.transaction(self.lease, step=name) as conn:
            value: T = codec.loads(codec.dumps(fn(conn, *args, **kwargs)))
            store.insert_step(conn, self.lease, name, value)
        self._steps[name] = copy.deepcopy(value)
        return value

    def _sql_store(self) -> Any:
        if not isinstance(self.store, FencedConnectionStore):
            raise ConfigurationError(
                f"this needs a SQL lease store, not {self.store.url.split('://')[0]}://; "
                "use celery_fence.fenced_update(conn, table, values, where, self.fence.token) on your own "
                "database instead"
            )
        return self.store

    def __repr__(self) -> str:
        state = f"lost: {self._lost}" if self._lost else "held"
        return f"<Fence {self.key!r} token={self.token} {state}>"
