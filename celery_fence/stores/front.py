"""The checked front of every store: arguments are checked here, once, before the store sees them.

``open_store`` returns a store behind a :class:`CheckedStore`, as dramatiq's result backends check in their
public methods and leave the backend its private operation: each public method refuses bad input with the
same ``InvalidArgument`` on every store, then calls the store with the checked values. A store, built-in or
registered under the ``celery_fence.stores`` entry point group, implements only what is specific to it and
passes the bad-input sweep of the contract suite without copying a check.

Everything else (a store's own attributes and methods, ``capabilities``, ``engine``, ``clock``) is the
store's, forwarded; a role method the store lacks is lacking on the front too, so ``lacking()`` tells the
truth, and the front answers ``isinstance`` for the store's class, as a transparent proxy does.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Generic, TypeVar, cast

from ..lease import Abandoned, HistoryEvent, Lease, LeaseState, validate_key, validate_ttl
from .base import FencedConnectionStore, RunTransactionHandle, Store
from .validation import (
    check_abandoned,
    check_age,
    check_gap,
    check_lease,
    check_leases,
    check_limit,
    check_owner,
    check_step_name,
    check_text,
)

__all__ = ["CheckedStore", "checked", "inner_store"]

_Method = TypeVar("_Method", bound=Callable[..., Any])


class _IfTheStoreHasIt(Generic[_Method]):
    """A role method of the front that exists only when the store behind it has it (optional roles)."""

    def __init__(self, method: _Method) -> None:
        self._method = method
        self._name = method.__name__

    def __get__(self, front: CheckedStore | None, owner: type | None = None) -> Any:
        if front is None:
            return self._method
        if not callable(getattr(front.inner, self._name, None)):  # hasattr() and lacking() see no method
            raise AttributeError(f"{type(front.inner).__name__!r} store has no {self._name!r}")
        return types.MethodType(self._method, front)


def _optional(method: _Method) -> _Method:
    return cast(_Method, _IfTheStoreHasIt(method))


class CheckedStore:
    """A store behind its argument checks. ``inner``: the store itself."""

    def __init__(self, store: Any) -> None:
        self.inner: FencedConnectionStore = store  # typed by every role: one it lacks is never called

    def __getattr__(self, name: str) -> Any:  # only for what the front does not define
        if name == "inner":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(open_store(url), SQLStore) holds, as for a proxy
        return type(self.inner)

    def __repr__(self) -> str:
        return f"CheckedStore({self.inner!r})"

    # -- RunStore --

    def migrate(self) -> None:
        self.inner.migrate()

    def acquire(self, key: str, owner: str, ttl: float, run: Mapping[str, Any] | None = None) -> Lease:
        validate_key(key)
        check_owner(owner)
        return self.inner.acquire(key, owner, validate_ttl(ttl), run)

    def renew(self, leases: Sequence[Lease], ttl: float) -> list[Lease]:
        leases = check_leases(leases)
        return self.inner.renew(leases, validate_ttl(ttl))

    def complete(self, lease: Lease, result: Any) -> None:
        self.inner.complete(check_lease(lease), result)

    def release(self, lease: Lease) -> None:
        self.inner.release(check_lease(lease))

    def save_step(self, lease: Lease, name: str, value: Any) -> None:
        check_lease(lease)
        self.inner.save_step(lease, check_step_name(name), value)

    def steps(self, key: str) -> dict[str, Any]:
        return self.inner.steps(validate_key(key))

    def refuse(self, lease: Lease, what: str) -> None:
        check_lease(lease)
        self.inner.refuse(lease, check_text(what, "what was refused"))

    def get(self, key: str) -> LeaseState | None:
        return self.inner.get(validate_key(key))

    def close(self) -> None:
        self.inner.close()

    # -- AuditStore --

    @_optional
    def history(self, key: str | None = None) -> list[HistoryEvent]:
        return self.inner.history(None if key is None else validate_key(key))

    # -- AdminStore --

    @_optional
    def leases(self) -> list[LeaseState]:
        return self.inner.leases()

    @_optional
    def force_release(self, key: str) -> int:
        return self.inner.force_release(validate_key(key))

    @_optional
    def prune(self, older_than: float) -> int:
        return self.inner.prune(check_age(older_than))

    @_optional
    def advance(self, gap: int) -> int:
        return self.inner.advance(check_gap(gap))

    # -- RecoveryStore --

    @_optional
    def abandoned(self, grace: float, limit: int = 100) -> list[Abandoned]:
        grace = check_age(grace)
        return self.inner.abandoned(grace, check_limit(limit))

    @_optional
    def recover(self, seen: Abandoned, max_recoveries: int, reason: str = "") -> int | None:
        return self.inner.recover(check_abandoned(seen, max_recoveries, reason), max_recoveries, reason)

    @_optional
    def strand(self, key: str, run: Mapping[str, Any] | None, reason: str) -> bool:
        validate_key(key)
        return self.inner.strand(key, run, check_text(reason, "a give-up reason"))

    # -- FencedConnectionStore --

    @_optional
    def transaction(self, lease: Lease, step: str | None = None) -> AbstractContextManager[Any]:
        return self.inner.transaction(check_lease(lease), step)

    @_optional
    def insert_step(self, conn: Any, lease: Lease, name: str, value: Any) -> None:
        self.inner.insert_step(conn, lease, name, value)  # inside transaction(lease): checked there

    @_optional
    def begin_run(self, lease: Lease, ttl: float) -> RunTransactionHandle:
        check_lease(lease)
        return self.inner.begin_run(lease, validate_ttl(ttl))


def checked(store: Any) -> Store:
    """``store`` behind its checked front (a store already behind one is returned as it is)."""
    if type(store) is CheckedStore:
        return cast(Store, store)
    return cast(Store, CheckedStore(store))


def inner_store(store: Any) -> Any:
    """The store behind the front (``store`` itself when it has none)."""
    return store.inner if type(store) is CheckedStore else store
