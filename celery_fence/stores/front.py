"""The checked front of every store: arguments are checked here, once, before the store sees them.

``open_store`` returns a store behind a :class:`CheckedStore`, as dramatiq's result backends check in their
public methods and leave the backend its private operation: each public method refuses bad input with the
same ``InvalidArgument`` on every store, then calls the store with the checked values. A store, built-in or
registered under the ``celery_fence.stores`` entry point group, implements only what is specific to it and
passes the bad-input sweep of the contract suite without copying a check.

Everything else (a store's own attributes and methods, ``capabilities``, ``engine``, ``clock``) is the
store's, forwarded; a role method the store lacks is lacking on the front too, so ``lacking()`` tells the
truth, and the front answers ``isinstance`` for the store's class, as a transparent proxy does.

The checks compare numbers as they are, never converted first: ``float(10**400)`` raises ``OverflowError``
and ``math.isfinite`` does too, and NaN fails every comparison. Text goes through ``validate_text`` (no NUL,
no lone surrogate), so every store refuses the same strings.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Generic, Protocol, TypeGuard, TypeVar, cast

from ..errors import InvalidArgument
from ..lease import (
    MAX_SECONDS,
    MAX_TOKEN,
    Abandoned,
    HistoryEvent,
    Lease,
    LeaseState,
    validate_key,
    validate_text,
    validate_ttl,
)
from .base import CommitStore, FencedConnectionStore, RunTransactionHandle, Store

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


class _EveryRole(FencedConnectionStore, CommitStore, Protocol):
    """What the front forwards to: every role (one the store lacks is never called, ``_optional``)."""


class CheckedStore:
    """A store behind its argument checks. ``inner``: the store itself."""

    def __init__(self, store: Any) -> None:
        self.inner: _EveryRole = store  # typed by every role: one it lacks is never called

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


    # -- CommitStore --

    @_optional
    def begin_commit(
        self, key: str, owner: str, ttl: float, run: Mapping[str, Any] | None = None
    ) -> RunTransactionHandle:
        validate_key(key)
        return self.inner.begin_commit(key, check_owner(owner), validate_ttl(ttl), run)

    @_optional
    def claim(self, key: str, owner: str, result: Any, run: Mapping[str, Any] | None = None) -> int:
        validate_key(key)
        return self.inner.claim(key, check_owner(owner), result, run)


def checked(store: Any) -> Store:
    """``store`` behind its checked front (a store already behind one is returned as it is)."""
    if type(store) is CheckedStore:
        return cast(Store, store)
    return cast(Store, CheckedStore(store))


def inner_store(store: Any) -> Any:
    """The store behind the front (``store`` itself when it has none)."""
    return store.inner if type(store) is CheckedStore else store


# -- the checks: every store refuses the same arguments with the same InvalidArgument --

MAX_STEP_NAME = 200
MAX_OWNER = 512  # the SQL stores' owner column
MAX_RECOVERIES = 2**31 - 1  # the recovery count is a 32-bit column on the SQL stores
MAX_LIMIT = 10**6


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def check_token(token: object, what: str = "a lease token") -> int:
    if not _is_int(token) or not 1 <= token <= MAX_TOKEN:
        raise InvalidArgument(f"{what} is an int from 1 to 2**53 - 1 ({MAX_TOKEN}), got {token!r}")
    return token


def check_lease(lease: object) -> Lease:
    if not isinstance(lease, Lease):
        raise InvalidArgument(f"expected a Lease returned by acquire(), not {type(lease).__name__}")
    validate_key(lease.key)
    check_token(lease.token)
    check_owner(lease.owner)
    return lease


def check_owner(owner: object) -> str:
    if isinstance(owner, str) and len(owner) > MAX_OWNER:
        raise InvalidArgument(f"an owner name has at most {MAX_OWNER} characters, got {len(owner)}")
    return validate_text(owner, "an owner name")


def check_leases(leases: Sequence[Lease]) -> list[Lease]:
    if isinstance(leases, (str, bytes)) or not isinstance(leases, Sequence):
        raise InvalidArgument(f"expected a sequence of Leases, not {type(leases).__name__}")
    return [check_lease(lease) for lease in leases]


def check_step_name(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_STEP_NAME:
        raise InvalidArgument(f"a step name is a str of 1 to {MAX_STEP_NAME} characters, got {name!r}")
    return validate_text(name, "a step name")


def check_text(text: object, what: str) -> str:
    return validate_text(text, what)


def check_age(seconds: object) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidArgument(f"an age is a number of seconds, got {seconds!r}")
    if not 0 <= seconds <= MAX_SECONDS:
        raise InvalidArgument(f"an age is a number of seconds from 0 to {MAX_SECONDS}, got {seconds!r}")
    return float(seconds)


def check_gap(gap: object) -> int:
    if not _is_int(gap) or not 1 <= gap <= MAX_TOKEN:
        raise InvalidArgument(f"gap must be a positive int up to 2**53 - 1, got {gap!r}")
    return gap


def check_limit(limit: object) -> int:
    if not _is_int(limit) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgument(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")
    return limit


def check_recoveries(count: object, what: str = "max_recoveries") -> int:
    if not _is_int(count) or not 0 <= count <= MAX_RECOVERIES:
        raise InvalidArgument(f"{what} must be an int from 0 to {MAX_RECOVERIES}, got {count!r}")
    return count


def check_abandoned(seen: object, max_recoveries: object, reason: object) -> Abandoned:
    """The arguments of ``recover``: an ``Abandoned`` as ``abandoned()`` returned it, a bound, a reason."""
    if not isinstance(seen, Abandoned):
        raise InvalidArgument(f"expected an Abandoned returned by abandoned(), not {type(seen).__name__}")
    validate_key(seen.key)
    check_token(seen.token, "an abandoned run's token")
    check_recoveries(seen.recoveries, "an abandoned run's recovery count")
    check_recoveries(max_recoveries)
    validate_text(reason, "a recovery reason")
    return seen
