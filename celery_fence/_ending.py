"""How a run ends, as data: what :class:`~celery_fence.run.Run` decided and its host carries out.

The run never raises Celery's control-flow exceptions itself nor sends a message: it returns an
:class:`Ending`, and the task's host (``task.py``) performs it, in this order: send the copy (if any), give
back the lease it hands over, write the record the store is owed, store a FAILURE the caller must see, then
return the value or raise. That keeps every decision in the table and the Celery glue to one small place.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._owed import Stranded
from .errors import FenceError
from .lease import Lease

__all__ = ["Ending", "Kind"]


class Kind(enum.Enum):
    RETURN = "return"  # the task returns ``value`` (Celery stores SUCCESS)
    IGNORE = "ignore"  # the task ends with Ignore: nothing stored for it by this run
    RAISE = "raise"  # the task raises ``error`` (Celery's course: FAILURE, Retry, Reject, ...)
    SEND_AGAIN = "send again"  # a copy of the message (same id, same retries) is sent, then Ignore or Retry


@dataclass(frozen=True)
class Ending:
    kind: Kind
    value: Any = None
    error: BaseException | None = None  # RAISE: what is raised; SEND_AGAIN: shown as RETRY (Retry(exc=...))
    countdown: float = 0.0  # SEND_AGAIN: seconds before the copy runs
    headers: Mapping[str, Any] = field(default_factory=dict)  # SEND_AGAIN: the copy's own fence headers
    hand_back: Lease | None = None  # released once the copy is sent (or at once, when nothing is sent)
    record: Stranded | None = None  # a give-up record the store is owed
    failure: FenceError | None = None  # IGNORE: stored as the task id's FAILURE first (ends ready)

    @classmethod
    def returning(cls, value: Any) -> Ending:
        return cls(Kind.RETURN, value=value)

    @classmethod
    def ignoring(
        cls,
        hand_back: Lease | None = None,
        failure: FenceError | None = None,
        record: Stranded | None = None,
    ) -> Ending:
        return cls(Kind.IGNORE, hand_back=hand_back, failure=failure, record=record)

    @classmethod
    def raising(
        cls, error: BaseException, hand_back: Lease | None = None, record: Stranded | None = None
    ) -> Ending:
        return cls(Kind.RAISE, error=error, hand_back=hand_back, record=record)

    @classmethod
    def sending_again(
        cls,
        countdown: float,
        headers: Mapping[str, Any],
        hand_back: Lease | None = None,
        shown_as_retry: BaseException | None = None,
    ) -> Ending:
        return cls(
            Kind.SEND_AGAIN, countdown=countdown, headers=headers, hand_back=hand_back, error=shown_as_retry
        )
