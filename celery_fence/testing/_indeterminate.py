"""Indeterminate outcomes as a fault: a store wrapper whose chosen calls fail before the store acts, act and
lose their reply, or act late (after the run's lease expired) and lose their reply.

Every store call has three results and a client cannot tell the last two apart (Jepsen's ``:info``);
``IndeterminateStore`` makes each of them happen at a chosen call of a run (and ``INTERRUPTED``: the store
acted, then a time limit hit the caller before the reply came back), so a test can enumerate every
call position x outcome and check that each leaves one effect per key and no lost work. A run's
transaction (``begin_run``, and a fenced commit's ``begin_commit``) is wrapped too: its ``commit`` is a call
like the others; a fenced commit's claim on its own is ``claim``.

In a worker the kit starts (:class:`~celery_fence.testing.Worker`, which then loads :mod:`._in_worker`) it is
switched on by the environment variable ``CELERY_FENCE_STORE_FAULTS``: a JSON list
of faults, e.g. ``[{"method": "complete", "nth": 1, "outcome": "lost"}]`` (the first completion of each
pool process commits and loses its reply), or ``{"method": "commit", "rate": 0.1, "outcome": "lost"}``
(every commit, with probability 0.1: a fault that keeps firing, for soaks; ``"per_key": true`` fires at most
once per lease key; ``"keys": [...]`` hits only those keys' calls, so a short test can give each key a fault
it is sure to meet instead of a draw). ``CELERY_FENCE_STORE_FAULTS_LOG`` names a file that gets one line per
fault fired (``key method outcome``), so a soak can count the runs it faulted.
"""

from __future__ import annotations

import enum
import json
import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded

from ..errors import FenceError, InvalidArgument, StoreUnavailable

__all__ = ["CALLS", "ENV", "Fault", "IndeterminateStore", "Outcome", "faults_from_env"]

ENV = "CELERY_FENCE_STORE_FAULTS"
LOG_ENV = "CELERY_FENCE_STORE_FAULTS_LOG"
CALLS = (
    "acquire",
    "renew",
    "complete",
    "release",
    "save_step",
    "steps",
    "refuse",
    "get",
    "begin_run",
    "strand",
    "begin_commit",
    "claim",
)
_OPENING = ("begin_run", "begin_commit")  # a run's transaction, whose commit is a faultable call


class Outcome(str, enum.Enum):
    BEFORE = "before"  # failed before the store acted (refused connection, error before commit)
    LOST = "lost"  # the store acted (committed), then the reply was lost
    LATE = "late"  # the call arrived after the run's lease expired, acted, and its reply was lost
    INTERRUPTED = "interrupted"  # the store acted, then a time limit hit the caller while the reply was due


@dataclass
class Fault:
    """Hit the ``nth`` call of ``method`` (any call if ``None``), counted from the wrapper's creation, once;
    or, with ``rate``, each call of ``method`` with that probability, for ever. ``keys``: only calls on these
    lease keys (every key if ``None``); ``per_key``: at most one fault (of any ``per_key`` fault) per key."""

    outcome: Outcome
    method: str | None = None
    nth: int = 1
    rate: float | None = None
    per_key: bool = False
    keys: list[str] | None = None

    def __post_init__(self) -> None:
        self.outcome = Outcome(self.outcome)
        if self.rate is not None and not 0.0 < self.rate <= 1.0:
            raise InvalidArgument(f"a fault's rate is a probability in (0, 1], got {self.rate!r}")
        if self.method is not None and self.method not in (*CALLS, "commit"):
            raise InvalidArgument(f"unknown store call {self.method!r}: one of {(*CALLS, 'commit')}")
        keys = self.keys
        if keys is not None and (isinstance(keys, str) or not all(isinstance(k, str) for k in keys)):
            raise InvalidArgument(f"a fault's keys are a list of lease keys, got {self.keys!r}")


def faults_from_env() -> list[Fault] | None:
    text = os.environ.get(ENV)
    return None if not text else [Fault(**item) for item in json.loads(text)]


class IndeterminateStore:
    """Wraps ``store``; ``faults`` say which calls misbehave (each fires once). ``expire(key)`` moves the
    key's stored expiry into the past, for ``LATE``. ``calls`` lists every call made, in order."""

    def __init__(
        self,
        store: Any,
        faults: list[Fault] | None = None,
        expire: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.faults = list(faults or [])
        self.expire = expire
        self.calls: list[str] = []
        self.hits: list[tuple[int, str, Outcome]] = []  # (call number, method, outcome) that fired
        self._lock = threading.Lock()
        self._random = random.Random(os.getpid())  # rate faults: each pool process draws its own
        self._faulted: set[str] = set()  # keys a per_key fault already hit
        self._log = os.environ.get(LOG_ENV)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if name not in CALLS:
            return attr
        return lambda *args, **kwargs: self.call(name, attr, args, kwargs)

    def call(self, name: str, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        outcome = self._due(name, _key_of(args))
        if outcome is None:
            result = fn(*args, **kwargs)
            return _Transaction(self, result) if name in _OPENING else result
        if outcome is Outcome.BEFORE:
            raise StoreUnavailable(f"injected: {name} failed before the store acted")
        if outcome is Outcome.LATE and self.expire is not None and args:
            self.expire(getattr(args[0], "key", args[0]))
        try:
            result = fn(*args, **kwargs)
        except FenceError:
            pass  # the store's answer (held, stale, ...) is lost all the same
        else:
            if name in _OPENING:  # the session died with its reply: its transaction rolled back
                result.close()
        raise _lost(name, outcome)

    def _due(self, name: str, key: str | None) -> Outcome | None:
        with self._lock:
            self.calls.append(name)
            number = len(self.calls)
            count = self.calls.count(name)
            for fault in self.faults:
                if fault.method not in (None, name) or (fault.per_key and key in self._faulted):
                    continue
                if fault.keys is not None and key not in fault.keys:
                    continue
                if fault.rate is not None:
                    if self._random.random() >= fault.rate:
                        continue
                elif (number if fault.method is None else count) != fault.nth:
                    continue
                else:
                    self.faults.remove(fault)
                return self._fired(number, name, key, fault)
        return None

    def _fired(self, number: int, name: str, key: str | None, fault: Fault) -> Outcome:
        self.hits.append((number, name, fault.outcome))
        if key is not None:
            self._faulted.add(key)
        if self._log:
            with open(self._log, "a") as out:
                out.write(f"{key} {name} {fault.outcome.value}\n")
        return fault.outcome


def _key_of(args: Any) -> str | None:
    first = args[0] if args else None
    key = getattr(first, "key", first)
    return key if isinstance(key, str) else None


class _Transaction:
    """A run's transaction whose ``complete`` (the commit) is a faultable call named ``commit``."""

    def __init__(self, owner: IndeterminateStore, tx: Any) -> None:
        self._owner, self._tx = owner, tx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tx, name)

    def complete(self, result: Any) -> None:
        outcome = self._owner._due("commit", self._tx.lease.key)
        if outcome is None:
            self._tx.complete(result)
            return
        if outcome is Outcome.BEFORE:
            self._tx.close()  # nothing reached the server; the session ends, rolling back
            raise StoreUnavailable("injected: commit failed before the store acted")
        self._tx.complete(result)  # the row is locked by this transaction (a fenced commit: it claims the
        # key, and a copy that claimed first refuses it): LATE is the same as LOST
        raise _lost("commit", outcome)


def _lost(name: str, outcome: Outcome) -> BaseException:
    """What the caller meets when the store acted and the reply never reached it."""
    if outcome is Outcome.INTERRUPTED:  # as Celery's soft time limit lands: an exception in the caller
        interrupted: BaseException = SoftTimeLimitExceeded(f"injected: {name} acted, then a time limit hit")
        return interrupted
    return StoreUnavailable(f"injected: {name} acted at the store, then its reply was lost")
