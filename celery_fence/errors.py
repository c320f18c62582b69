"""The one exception tree of celery-fence.

Every error the library raises derives from :class:`FenceError`; driver errors (SQLAlchemy, psycopg,
redis-py, HTTP) are translated at one boundary per store and chained with ``raise ... from exc``::

    FenceError
    ├── ConfigurationError (ValueError)   wrong setting, unknown URL scheme, missing extra
    ├── InvalidArgument (ValueError)      a bad key, ttl or lease passed to a store
    ├── NotSerializable (TypeError)       a result or step value the codec cannot carry
    ├── UsageError (RuntimeError)         the fence was used in a way that cannot keep its promise
    ├── StoreUnavailable                  transient: the store did not answer (retry until the deadline)
    ├── TokenRewound                      the store's token counter is behind a token it issued (failover)
    ├── LeaseHeld                         a live lease on the key is held by another run
    ├── AlreadyDone                       the key finished; ``.result`` holds its stored result
    ├── FailedBefore                      this task id ended FAILURE before (``fence_mode="commit"``)
    ├── LeaseLost                         this run's lease was lost (renew refused or local deadline passed)
    ├── StaleToken                        a write carried a token that is no longer current: refused
    └── GaveUp                            the fence stopped sending a run again (``fence_max_resends``)
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AlreadyDone",
    "ConfigurationError",
    "FailedBefore",
    "FenceError",
    "GaveUp",
    "InvalidArgument",
    "LeaseHeld",
    "LeaseLost",
    "NotSerializable",
    "StaleToken",
    "StoreUnavailable",
    "TokenRewound",
    "UsageError",
]


class FenceError(Exception):
    """Root of every error raised by celery-fence."""


class ConfigurationError(FenceError, ValueError):
    """A setting or URL cannot work; the message names the fix."""


class InvalidArgument(FenceError, ValueError):
    """An argument to a store operation is malformed; nothing was written."""


class NotSerializable(FenceError, TypeError):
    """A result or step value cannot be encoded by the store's codec; nothing was written."""


class UsageError(FenceError, RuntimeError):
    """The fence was used in a way that would break exactly-once (e.g. committing ``transaction()`` by
    hand, or a step after the run's transaction opened); the message names the fix. Not transient."""


class StoreUnavailable(FenceError):
    """The store did not answer. Transient: a renewer may retry until its local deadline."""


class TokenRewound(FenceError):
    """The store would issue a token not above one it issued before (a failover or restore
    moved its counter back). Run ``celery fence advance`` before issuing more tokens."""


class _WithFields(FenceError):
    """An error built from fields, whose ``args`` are those fields (not its message), so that pickle and
    Celery's exception transport, which rebuild an exception as ``cls(*args)``, give back the same error."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)

    def __str__(self) -> str:
        return self.message()

    def message(self) -> str:
        raise NotImplementedError


class LeaseHeld(_WithFields):
    """A live lease on ``key`` is held by another run."""

    def __init__(self, key: str, owner: str | None = None, expires_in: float | None = None) -> None:
        self.key, self.owner, self.expires_in = key, owner, expires_in
        super().__init__(key, owner, expires_in)

    def message(self) -> str:
        left = "" if self.expires_in is None else f", expires in {self.expires_in:.1f}s"
        return f"lease {self.key!r} is held by {self.owner}{left}"


class AlreadyDone(_WithFields):
    """``key`` was completed by an earlier run; ``.result`` is the result it stored."""

    def __init__(self, key: str, token: int, result: Any) -> None:
        self.key, self.token, self.result = key, token, result
        super().__init__(key, token, result)

    def message(self) -> str:
        return f"key {self.key!r} was completed with token {self.token}"


class FailedBefore(_WithFields):
    """A run of this task id ended ``FAILURE`` on ``key`` and marked it so (``fence_mode="commit"``), with
    ``reason``; ``token`` is the key's. Raised by a store to a copy of that task id that meets the mark, and
    the ``FAILURE`` such a copy ends with when the run that marked it stopped before Celery stored its own."""

    def __init__(self, key: str, token: int, reason: str) -> None:
        self.key, self.token, self.reason = key, token, reason
        super().__init__(key, token, reason)

    def message(self) -> str:
        return (
            f"key {self.key!r}: this task id ended FAILURE in an earlier run ({self.reason}); a copy of it "
            "runs nothing and ends the same way: send a new task to run it again"
        )


class LeaseLost(_WithFields):
    """This run no longer holds its lease; its writes will be refused."""

    def __init__(self, key: str, token: int, reason: str = "lease lost") -> None:
        self.key, self.token, self.reason = key, token, reason
        super().__init__(key, token, reason)

    def message(self) -> str:
        return f"{self.reason}: key {self.key!r}, token {self.token}"


class StaleToken(_WithFields):
    """A write with ``token`` was refused: the key's current token is ``current`` (or unknown).

    ``recorded`` says whether the store already wrote the refusal to the key's history (a store refusing
    its own write does; a refusal by the resource itself, as in ``fenced_update``, does not).
    """

    def __init__(
        self, key: str, token: int, current: int | None = None, what: str = "write", recorded: bool = False
    ) -> None:
        self.key, self.token, self.current, self.what, self.recorded = key, token, current, what, recorded
        super().__init__(key, token, current, what, recorded)

    def message(self) -> str:
        now = "unknown" if self.current is None else str(self.current)
        return f"{self.what} refused for key {self.key!r}: token {self.token} is stale (current: {now})"


class GaveUp(_WithFields):
    """The fence sent the run of ``key`` again ``resends`` times (``fence_max_resends``) and stopped: the key
    is marked given up in the store (``celery fence leases`` shows it) with ``reason``."""

    def __init__(self, key: str, resends: int, reason: str) -> None:
        self.key, self.resends, self.reason = key, resends, reason
        super().__init__(key, resends, reason)

    def message(self) -> str:
        return (
            f"gave up on key {self.key!r} after {self.resends} re-sends by the fence ({self.reason}); "
            "raise fence_max_resends, or run the task again once the cause is fixed"
        )
