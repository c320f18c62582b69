"""Pure lease model: values, validation and local-deadline arithmetic. Standard library only.

Two clocks, never mixed: the *store's* clock alone decides whether a lease has expired; a worker only compares
its own ``time.monotonic()`` readings, to stop early ("self-fencing") before the store could expire it.
"""

from __future__ import annotations

import itertools
import os
import secrets
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._process import forget_in_child
from .errors import ConfigurationError, InvalidArgument

__all__ = [
    "ENDED_BY",
    "MAX_KEY_LENGTH",
    "MAX_SECONDS",
    "MAX_TOKEN",
    "Abandoned",
    "HistoryEvent",
    "Lease",
    "LeasePolicy",
    "LeaseState",
    "OwnerNames",
    "marking_task_id",
    "new_owner",
    "recovery_backoff",
    "validate_key",
    "validate_text",
    "validate_ttl",
]

MAX_KEY_LENGTH = 1024
# Tokens are integers in [1, MAX_TOKEN] on every store: Redis's Lua and JSON clients carry numbers as
# doubles, exact only below 2**53, and one range for all stores keeps a token valid wherever it is shown.
MAX_TOKEN = 2**53 - 1
# The longest ttl or age a store accepts (about 31 years): every store's clock arithmetic holds it exactly.
MAX_SECONDS = 10**9


@dataclass(frozen=True)
class Lease:
    """A lease as issued by a store. Identity is ``(key, token)``; ``owner`` is for people.

    ``taken_over`` and ``expired_for`` are what the acquire learned for free, in the same atomic step: whether
    it took over an expired, unreleased lease (``None``: this store does not say), and then for how many
    seconds, by the store's clock, that lease had been expired (``None``: not known). Neither is identity.
    """

    key: str
    token: int
    owner: str
    taken_over: bool | None = field(default=None, compare=False, repr=False)
    expired_for: float | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class LeaseState:
    """What a store knows about a key. ``expires_in`` is ``None`` when no lease is held."""

    key: str
    token: int
    owner: str | None
    expires_in: float | None
    done: bool
    result: Any = None
    dead: str | None = None
    recoveries: int = 0  # recovery copies that started and were lost (fence_max_recoveries counts these)
    recovery_sent: int = 0  # recovery copies sent since the last start: queued, not started (yet)
    run: dict[str, Any] | None = field(default=None, compare=False, repr=False)  # what the holder recorded


@dataclass(frozen=True)
class HistoryEvent:
    """One line of a key's audit trail, stamped with the store's clock (seconds since the epoch)."""

    at: float
    event: str
    token: int
    owner: str | None
    detail: str | None = None
    key: str = field(default="", compare=False)


@dataclass(frozen=True)
class Abandoned:
    """A key whose lease expired without completion: its run may need to be sent again."""

    key: str
    token: int
    run: dict[str, Any] | None
    recoveries: int  # recovery copies that started and were lost
    sent: int = 0  # recovery copies sent that have not started (yet): they count for nothing


# In the run record of a key that a run of fence_mode="commit" marked failed (``strand``, its FAILURE): that
# run's owner.
ENDED_BY = "fence_ended_by"


def marking_task_id(run: Mapping[str, Any] | None) -> str | None:
    """The task id of ``run`` if it is a fenced commit's FAILURE mark (it names ``ENDED_BY``), else ``None``:
    such a mark is not made on a key a run of its task id marked before (one ending per task id)."""
    return run.get("id") if run and ENDED_BY in run else None


# After the n-th recovery copy that has not started, recovery waits this many graces before judging the
# key again (1, 1, 2, 4 ... 32): a copy queued behind a busy pool is not re-sent over and over.
MAX_RECOVERY_BACKOFF = 32


def recovery_backoff(sent: int) -> int:
    """Graces to wait after the last recovery copy when ``sent`` copies have not started. Every store
    computes the same (SQL: a ``CASE`` over ``1 << (sent - 1)``; Lua: ``2 ^ (sent - 1)``)."""
    return 1 if sent <= 1 else min(2 ** (sent - 1), MAX_RECOVERY_BACKOFF)


def validate_text(text: object, what: str) -> str:
    """A ``str`` every store can carry: no NUL (PostgreSQL text and SQLite's JSON cut it off) and no lone
    surrogate (not encodable as UTF-8). Any other Unicode is fine."""
    if not isinstance(text, str):
        raise InvalidArgument(f"{what} must be a str, not {type(text).__name__}")
    if "\x00" in text:
        raise InvalidArgument(f"{what} must not contain NUL (\\x00), got {text!r}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        where = f"a lone surrogate at {exc.start}"
        raise InvalidArgument(f"{what} must be valid Unicode ({where}), got {text!r}") from exc
    return text


def validate_key(key: object) -> str:
    if not isinstance(key, str):
        raise InvalidArgument(f"a lease key must be a str, not {type(key).__name__}")
    if not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidArgument(f"a lease key must have 1 to {MAX_KEY_LENGTH} characters, got {len(key)}")
    return validate_text(key, "a lease key")


def validate_ttl(ttl: object) -> float:
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise InvalidArgument(f"ttl must be a number of seconds, not {type(ttl).__name__}")
    # Compared as is: float() of a huge int raises OverflowError, and NaN fails every comparison.
    if not 0 < ttl <= MAX_SECONDS:
        raise InvalidArgument(f"ttl must be a positive number of seconds up to {MAX_SECONDS}, got {ttl!r}")
    return float(ttl)


def new_owner() -> str:
    """``hostname:pid:uuid4``: unique per acquisition, since threads and greenlets share a pid.

    For one-off use; a worker names its acquisitions with its runtime's :class:`OwnerNames` (cheaper).
    """
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4()}"


class OwnerNames:
    """Owner names for one process: ``hostname:pid:<random>-<n>``, unique per acquisition.

    The prefix (``gethostname()``, the pid and 48 random bits) is made once per process and a counter
    tells the acquisitions apart, instead of a ``uuid4()`` per run. A forked child makes a prefix of its
    own (``forget_after_fork``), so no name is ever shared across a fork. Thread-safe: each call reads one
    ``(prefix, counter)`` tuple, and ``next()`` of an ``itertools.count`` is atomic.
    """

    def __init__(self) -> None:
        self._current = self._fresh()
        forget_in_child(self)

    def __call__(self) -> str:
        prefix, counter = self._current
        return f"{prefix}{next(counter)}"

    def forget_after_fork(self) -> None:
        self._current = self._fresh()

    @staticmethod
    def _fresh() -> tuple[str, itertools.count[int]]:
        return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(6)}-", itertools.count(1)


@dataclass(frozen=True)
class LeasePolicy:
    """How long a lease lives and when its holder renews or gives up.

    ``renew_interval`` defaults to ``ttl / 3`` and must be below ``ttl / 2`` so that one renew can fail
    and the next still lands before expiry. The local deadline keeps a ``margin`` (a tenth of the ttl)
    between the moment a worker stops trusting its lease and the earliest moment the store could expire it.
    """

    ttl: float
    renew_interval: float | None = None

    def __post_init__(self) -> None:
        try:
            ttl = validate_ttl(self.ttl)
        except InvalidArgument as exc:
            raise ConfigurationError(f"fence_lease_ttl: {exc}") from exc
        interval = ttl / 3 if self.renew_interval is None else self.renew_interval
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
            raise ConfigurationError(f"fence_renew_interval must be a positive number, got {interval!r}")
        if interval >= ttl / 2:
            raise ConfigurationError(
                f"fence_renew_interval ({interval}s) must be below half of fence_lease_ttl ({ttl}s): "
                f"set fence_renew_interval below {ttl / 2}s or raise fence_lease_ttl"
            )
        object.__setattr__(self, "ttl", ttl)
        object.__setattr__(self, "renew_interval", float(interval))

    @property
    def interval(self) -> float:
        assert self.renew_interval is not None  # set in __post_init__
        return self.renew_interval

    @property
    def margin(self) -> float:
        return self.ttl / 10

    def deadline(self, sent_at: float) -> float:
        """Local monotonic deadline for a lease whose acquire or renew was *sent* at ``sent_at``.

        The store stamps expiry on receipt, which is after ``sent_at``, so the store cannot expire the
        lease before ``sent_at + ttl``; stopping at ``deadline`` leaves ``margin`` to spare.
        """
        return sent_at + self.ttl - self.margin

    def lock_wait(self, deadline: float, now: float) -> float:
        """How long a renew sent at ``now`` may wait for a lock another client holds (SQLite's write lock)
        and still land before ``deadline``: the time left, less a twentieth of the ttl for its reply."""
        return max(0.0, deadline - now - self.margin / 2)

    @property
    def renew_slack(self) -> float:
        """:meth:`lock_wait` of a renew sent on schedule, an interval after the last one was sent."""
        return self.lock_wait(self.deadline(0.0), self.interval)

    def busy_countdown(self, expires_in: float | None) -> float:
        """Seconds to wait before retrying a key whose lease is held elsewhere."""
        if expires_in is None or expires_in <= 0:
            return self.interval
        return expires_in

    @property
    def acquire_pause(self) -> float:
        """Pause between two acquires of one round when the store did not answer (times the attempt)."""
        return min(0.5, self.interval / 4)

    @property
    def read_pause(self) -> float:
        """Pause before reading the key again, or repeating a completion, when the store did not answer."""
        return min(1.0, self.interval / 4)

    @staticmethod
    def round_pause(round_: int) -> float:
        """Pause before acquiring again when the key changed under us (e.g. a rollback still under way)."""
        return 0.05 * round_

    @property
    def await_countdown(self) -> float:
        """How long a copy of a finished run waits for that run to store SUCCESS before it delivers."""
        return self.ttl

    def store_wait_countdown(self, waits: int, left: float) -> float:
        """The delay before the next look at an unavailable store (``waits`` so far, ``left`` seconds of
        ``fence_store_wait``): the renew interval, doubled each time, at most 60 s."""
        return min(self.interval * 2.0 ** min(waits, 32), 60.0, left)

    def resend_countdown(self, first: float, resends: int) -> float:
        """The delay of the fence's ``resends``-th sending again of a run: ``first`` at first, then the
        renew interval doubled each time, at most 60 s (a refusal that keeps coming is not a busy loop)."""
        if resends == 0:
            return first
        return max(first, min(self.interval * 2.0 ** min(resends - 1, 32), 60.0))

    def look_again_countdown(self, expires_in: float | None, looks: int) -> float:
        """Seconds before a copy of a running task id looks at the key again (``looks`` it already had): a
        renew interval, doubled each look, never past the holder's remaining ttl. A holder that ends soon is
        seen soon; a long one costs a message per ttl at most, as :meth:`busy_countdown` does."""
        return min(self.interval * 2.0 ** min(looks, 32), self.busy_countdown(expires_in))
