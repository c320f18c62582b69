"""The store as the simulation sees it: every call a run makes asks the program for its outcome.

Outcomes (docs/guarantees.md#how-a-run-ends: answered, failed before the store acted, unknown): ``ok``
answered; ``before`` failed before the store acted; ``lost`` acted, reply lost; ``late`` the call arrived
after the lease expired (the clock jumps past the ttl), acted, reply lost; ``hang`` the clock jumps past the
ttl, then the call fails; ``die`` the worker dies before the call (the delivery stops; no later call of it
reaches the store); ``base`` a ``BaseException`` (``SoftTimeLimitExceeded``) lands while the reply is in
flight (acted).
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

from billiard.exceptions import SoftTimeLimitExceeded

from celery_fence.errors import FenceError, StoreUnavailable

__all__ = ["CALLS", "SimStore", "WorkerDied"]

CALLS = (
    "acquire", "renew", "complete", "release", "save_step", "steps", "refuse", "get", "begin_run", "strand",
    "begin_commit", "claim",
)
_OPENING = ("begin_run", "begin_commit")  # a run's transaction: its commit is a call like the others
ALL = ("ok", "before", "lost", "late", "hang", "die", "base")
_NO_DEATH = ("ok", "before", "lost", "late", "hang")  # the renewer's thread: its process does not die here
_COMPLETING = ("complete", "commit", "claim")  # fence_mode="commit": its claim alone


class WorkerDied(BaseException):
    """The worker process running a delivery died (SIGKILL): nothing after this point happens."""


class Faults(Protocol):
    def outcome(self, call: str, key: str | None, options: tuple[str, ...]) -> str: ...
    def pause(self) -> None: ...
    def dying(self) -> None: ...
    def alive(self) -> None: ...
    transactions: list[Any]


class SimStore:
    """Wraps a store; ``faults`` (the world) decides every call's outcome."""

    def __init__(self, store: Any, faults: Faults) -> None:
        self.store, self.faults = store, faults

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if name not in CALLS:
            return attr
        return lambda *args, **kwargs: self.call(name, attr, args, kwargs)

    def call(self, name: str, fn: Any, args: Any, kwargs: Any) -> Any:
        self.faults.alive()  # a dead delivery makes no more calls
        options = _NO_DEATH if name == "renew" else ALL if name in _COMPLETING else ALL[:-1]
        outcome = self.faults.outcome(name, _key_of(args), options)
        if outcome == "ok":
            result = fn(*args, **kwargs)
            if name not in _OPENING:
                return result
            self.faults.transactions.append(result)
            return _Transaction(self, result)
        return self._misbehave(name, outcome, lambda: fn(*args, **kwargs))

    def _misbehave(self, name: str, outcome: str, act: Any) -> Any:
        if outcome == "die":
            self.faults.dying()
        if outcome in ("late", "hang"):
            self.faults.pause()
        if outcome in ("before", "hang"):
            raise StoreUnavailable(f"sim: {name} failed before the store acted ({outcome})")
        try:
            result = act()
        except FenceError:
            result = None  # the store's answer (held, stale, ...) is lost all the same
        if name in _OPENING and result is not None:
            result.close()  # the session died with its reply: its transaction rolled back
        if outcome == "base":
            raise SoftTimeLimitExceeded(f"sim: time limit while the reply of {name} was in flight")
        raise StoreUnavailable(f"sim: {name} acted at the store, then its reply was lost ({outcome})")


def _key_of(args: Any) -> str | None:
    first = args[0] if args else None
    if isinstance(first, (list, tuple)):
        first = first[0] if first else None
    key = getattr(first, "key", first)
    return key if isinstance(key, str) else None


class _Transaction:
    """A run's transaction whose ``complete`` (its commit) and ``save_step`` are calls like the others."""

    def __init__(self, owner: SimStore, tx: Any) -> None:
        self._owner, self._tx = owner, tx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)

    def complete(self, result: Any) -> None:
        self._faulted("commit", self._tx.complete, result)

    def save_step(self, name: str, value: Any) -> None:
        self._faulted("tx_save_step", self._tx.save_step, name, value)

    def _faulted(self, call: str, fn: Any, *args: Any) -> None:
        owner = self._owner
        owner.faults.alive()
        options = ALL if call == "commit" else ALL[:-1]
        outcome = owner.faults.outcome(call, self._tx.lease.key, options)
        if outcome == "ok":
            fn(*args)
            return
        if outcome in ("before", "hang"):
            if outcome == "hang":
                owner.faults.pause()
            self._tx.close()  # nothing reached the server; the session ends, rolling back
            raise StoreUnavailable(f"sim: {call} failed before the store acted ({outcome})")
        if outcome == "die":
            owner.faults.dying()
        if outcome == "late":
            owner.faults.pause()
        with contextlib.suppress(FenceError):  # the store's answer is lost all the same
            fn(*args)
        if outcome == "base":
            raise SoftTimeLimitExceeded(f"sim: time limit while the reply of {call} was in flight")
        if call == "tx_save_step":
            self._tx.close()  # the session is gone with the reply: the transaction rolled back
        raise StoreUnavailable(f"sim: {call} acted at the store, then its reply was lost ({outcome})")
